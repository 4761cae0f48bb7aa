/* fuzz_kv_page.c - libFuzzer harness: a KV page received from another process (MODEL.md 7):
 * kern_kv_page_header_read, kern_kv_page_check (structure and checksum; and against the identity
 * the header claims), then, for a page that passes, every written row read and dequantized.
 *
 * Input: byte 0 bit 0: seal the page first (kern_kv_page_seal rewrites its checksum), so
 * mutations reach the rows behind it. The rest is the page.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "kernels/kv_page.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

/* Read and dequantize every written row of a checked page. */
static void read_rows(const void *page, const kern_kv_page_header_t *h)
{
    kern_kv_page_layout_t layout = kern_kv_page_layout_of(h->d, h->d_I);
    float *main_row = malloc((size_t)h->d * sizeof(float));
    float *index_row = malloc((size_t)(h->d_I > 0 ? h->d_I : 1) * sizeof(float));
    uint8_t *mc = malloc(layout.main_codes_row_bytes);
    uint8_t *ms = malloc(layout.main_scales_row_bytes);
    uint8_t *ic = malloc(layout.index_codes_row_bytes + 1);
    uint8_t *is = malloc(layout.index_scales_row_bytes + 1);

    if (main_row != NULL && index_row != NULL && mc != NULL && ms != NULL && ic != NULL &&
        is != NULL) {
        for (uint32_t slot = 0; slot < h->row_count; slot++) {
            (void)kern_kv_page_read_row(page, slot, mc, ms, h->d_I > 0 ? ic : NULL,
                                        h->d_I > 0 ? is : NULL);
            (void)kern_kv_page_decode_row(page, slot, main_row, h->d_I > 0 ? index_row : NULL);
        }
    }
    free(is);
    free(ic);
    free(ms);
    free(mc);
    free(index_row);
    free(main_row);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kern_kv_page_header_t h;
    kern_kv_page_params_t claimed;
    uint8_t *page;
    size_t n;

    if (size < 1) {
        return 0;
    }
    n = size - 1;
    page = malloc(n > 0 ? n : 1);
    if (page == NULL) {
        return 0;
    }
    memcpy(page, data + 1, n);
    if ((data[0] & 1u) != 0 && kern_kv_page_header_read(page, n, &h) == TDM_OK) {
        (void)kern_kv_page_seal(page);
    }
    if (kern_kv_page_header_read(page, n, &h) == TDM_OK &&
        kern_kv_page_check(page, n, NULL, KERN_KV_PAGE_CHECK_CHECKSUM) == TDM_OK) {
        claimed.source_layer = h.source_layer;
        claimed.first_row = h.first_row;
        claimed.ratio = h.ratio;
        claimed.d = h.d;
        claimed.d_I = h.d_I;
        claimed.fingerprint = h.fingerprint;
        if (kern_kv_page_check(page, n, &claimed, KERN_KV_PAGE_CHECK_CHECKSUM) == TDM_OK) {
            read_rows(page, &h);
        }
    }
    free(page);
    return 0;
}
