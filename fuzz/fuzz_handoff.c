/* fuzz_handoff.c - libFuzzer harness: the bytes a decode node and a prefill node exchange about a
 * disaggregated turn: the reservation descriptor (node_resv_desc_parse; an accepted one must
 * encode again and parse back) and the section-7 state record it carries, made into a blob with
 * pages (node_blob_with_pages, i.e. engine_seq_blob_add_pages).
 *
 * Input: byte 0 bit 0: replace the last 8 bytes of the rest with the XXH3-64 of the bytes before
 * them (the descriptor's trailer), so mutations reach the fields behind the checksum; bits 1-2:
 * how many KV sources (0-3, one page each) the state record gets. The rest is the descriptor;
 * its record (or, when it does not parse, the rest itself) is the state record.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "node/node_handoff.h"

/* Bytes of each page given to the state record (any size: the blob only copies them). */
#define FUZZ_PAGE_BYTES  64
#define FUZZ_MAX_SOURCES 3

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

/* The state record with n_sources one-page sources; the result is only freed. */
static void record_with_pages(const uint8_t *record, size_t n_record, uint32_t n_sources)
{
    static const uint8_t page[FUZZ_PAGE_BYTES];
    const void *pages[FUZZ_MAX_SOURCES] = {page, page, page};
    int64_t n_rows[FUZZ_MAX_SOURCES] = {1, 2, 64};
    uint32_t n_pages[FUZZ_MAX_SOURCES] = {1, 1, 1};
    uint8_t *blob = NULL;
    size_t n_blob = 0;

    if (node_blob_with_pages(record, n_record, n_sources, n_rows, n_pages, pages, FUZZ_PAGE_BYTES,
                             &blob, &n_blob) == TDM_OK) {
        free(blob);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    node_resv_desc_t desc, again;
    uint8_t *bytes, *encoded = NULL;
    size_t n_bytes, n_encoded = 0;
    uint32_t n_sources;

    if (size < 1) {
        return 0;
    }
    n_sources = ((uint32_t)data[0] >> 1) & 3u;
    n_bytes = size - 1;
    bytes = malloc(n_bytes > 0 ? n_bytes : 1);
    if (bytes == NULL) {
        return 0;
    }
    memcpy(bytes, data + 1, n_bytes);
    if ((data[0] & 1u) != 0) {
        fuzz_fix_trailer(bytes, n_bytes);
    }
    if (node_resv_desc_parse(bytes, n_bytes, &desc) == TDM_OK) {
        if (node_resv_desc_encode(&desc, &encoded, &n_encoded) != TDM_OK ||
            node_resv_desc_parse(encoded, n_encoded, &again) != TDM_OK) {
            fprintf(stderr, "fuzz_handoff: an accepted descriptor does not round-trip\n");
            abort();
        }
        node_resv_desc_fini(&again);
        free(encoded);
        if (desc.record != NULL) {
            record_with_pages(desc.record, desc.n_record, n_sources);
        }
        node_resv_desc_fini(&desc);
    } else {
        record_with_pages(bytes, n_bytes, n_sources);
    }
    free(bytes);
    return 0;
}
