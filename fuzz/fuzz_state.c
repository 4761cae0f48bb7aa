/* fuzz_state.c - libFuzzer harness: the section-7 state record a decode node imports in a handoff
 * (engine_seq_import: header, identity, sizes, window rings, pending halves, ids, and with pages
 * every KV source's rows, pages and page checks), against the tiny model. An accepted blob is
 * exported again; after every input the pool's free pages must be back where they were (a refused
 * or destroyed import leaks no page).
 *
 * Model: the checkpoint directory in $TANDEM_FUZZ_MODEL (scripts/fuzz makes it with the build's
 * tandem-mkmodel --preset tiny --seed 1). At start the harness prefills sequences of
 * FUZZ_STATE_LENGTHS tokens and keeps their exports (record and pages) as templates.
 *
 * Input: byte 0 bit 0: structured: byte 1 picks a template (modulo their count), then each
 * further 3 bytes (u16 offset, modulo the blob's size, and a value) XOR one byte of it; bit 0
 * clear: the rest of the input is the blob. Bit 1: then replace the last 8 bytes with the
 * XXH3-64 of the bytes before them (the blob's trailer), so mutations reach the fields behind it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/seq_state.h"
#include "fuzz/fuzz_util.h"

/* Pages of the pool: the longest template's pages, twice over. */
#define FUZZ_STATE_PAGES 128u
/* Template sequence lengths: inside one window, a pending ratio-2 half (odd), past the window
 * and the Engram look-back, several pages per source. */
static const int64_t fuzz_lengths[] = {1, 2, 5, 17, 40, 130};
#define FUZZ_N_TEMPLATES (sizeof(fuzz_lengths) / sizeof(fuzz_lengths[0]))

static engine_model_t *fuzz_model;
static engine_kv_pool_t *fuzz_pool;
static uint8_t *fuzz_template[FUZZ_N_TEMPLATES]; /* exports with pages (malloc'ed, kept) */
static size_t fuzz_n_template[FUZZ_N_TEMPLATES];
static uint32_t fuzz_n_free; /* the pool's free pages at rest */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Prefill a sequence of n tokens and keep its export with pages as template k. */
static void make_template(engine_fwd_t *fwd, size_t k, int64_t n)
{
    const engine_config_t *cfg = engine_model_config(fuzz_model);
    engine_seq_t *seq = NULL;
    int32_t ids[256];
    size_t bytes;

    for (int64_t i = 0; i < n; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % cfg->vocab_size);
    }
    if (engine_seq_create(fuzz_model, fuzz_pool, &seq) != TDM_OK ||
        engine_fwd_prefill(fwd, seq, ids, n, 0, NULL, NULL) != TDM_OK) {
        fprintf(stderr, "fuzz_state: cannot prefill %lld tokens\n", (long long)n);
        abort();
    }
    bytes = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_PAGES);
    fuzz_template[k] = malloc(bytes);
    if (fuzz_template[k] == NULL ||
        engine_seq_export(seq, ENGINE_SEQ_EXPORT_PAGES, fuzz_template[k], bytes,
                          &fuzz_n_template[k]) != TDM_OK) {
        fprintf(stderr, "fuzz_state: cannot export %lld tokens\n", (long long)n);
        abort();
    }
    engine_seq_destroy(seq);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("TANDEM_FUZZ_MODEL");
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    engine_fwd_t *fwd = NULL;
    char err[512] = "";

    (void)argc;
    (void)argv;
    fuzz_quiet();
    if (dir == NULL) {
        fprintf(stderr, "fuzz_state: set TANDEM_FUZZ_MODEL to a tiny checkpoint (scripts/fuzz)\n");
        abort();
    }
    engine_model_params_default(&mp);
    mp.n_threads = 1;
    if (engine_model_load(dir, &mp, &fuzz_model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "fuzz_state: cannot load %s: %s\n", dir, err);
        abort();
    }
    if (engine_kv_pool_create(engine_model_config(fuzz_model), engine_model_fingerprint(fuzz_model),
                              FUZZ_STATE_PAGES, &fuzz_pool) != TDM_OK) {
        fprintf(stderr, "fuzz_state: no pool\n");
        abort();
    }
    engine_fwd_params_default(fuzz_model, &fp);
    if (engine_fwd_create(fuzz_model, fuzz_pool, &fp, &fwd) != TDM_OK) {
        fprintf(stderr, "fuzz_state: no forward context\n");
        abort();
    }
    for (size_t k = 0; k < FUZZ_N_TEMPLATES; k++) {
        make_template(fwd, k, fuzz_lengths[k]);
    }
    engine_fwd_destroy(fwd);
    fuzz_n_free = engine_kv_pool_n_free(fuzz_pool);
    return 0;
}

/* Template in[0] with the XOR edits of the rest (malloc'ed copy; NULL when out of memory). */
static uint8_t *structured(const uint8_t *in, size_t n_in, size_t *n_out)
{
    size_t k = n_in > 0 ? in[0] % FUZZ_N_TEMPLATES : 0;
    size_t n = fuzz_n_template[k];
    uint8_t *blob = malloc(n);

    if (blob == NULL) {
        return NULL;
    }
    memcpy(blob, fuzz_template[k], n);
    for (size_t i = 1; i + 3 <= n_in; i += 3) {
        size_t at = ((size_t)in[i] | (size_t)in[i + 1] << 8) % n;
        blob[at] ^= in[i + 2];
    }
    *n_out = n;
    return blob;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    engine_seq_t *seq = NULL;
    uint8_t *blob, *out;
    size_t n_blob = 0, n_out, n_written;

    if (size < 1) {
        return 0;
    }
    if ((data[0] & 1u) != 0) {
        blob = structured(data + 1, size - 1, &n_blob);
    } else {
        n_blob = size - 1;
        blob = malloc(n_blob > 0 ? n_blob : 1);
        if (blob != NULL) {
            memcpy(blob, data + 1, n_blob);
        }
    }
    if (blob == NULL) {
        return 0;
    }
    if ((data[0] & 2u) != 0) {
        fuzz_fix_trailer(blob, n_blob);
    }
    if (engine_seq_import(fuzz_model, fuzz_pool, blob, n_blob, &seq) == TDM_OK) {
        n_out = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_PAGES);
        out = malloc(n_out > 0 ? n_out : 1);
        if (out != NULL) {
            (void)engine_seq_export(seq, ENGINE_SEQ_EXPORT_PAGES, out, n_out, &n_written);
            free(out);
        }
        engine_seq_destroy(seq);
    }
    free(blob);
    if (engine_kv_pool_n_free(fuzz_pool) != fuzz_n_free) {
        fprintf(stderr, "fuzz_state: pool pages leaked: free %u, was %u\n",
                engine_kv_pool_n_free(fuzz_pool), fuzz_n_free);
        abort();
    }
    return 0;
}
