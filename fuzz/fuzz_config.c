/* fuzz_config.c - libFuzzer harness: a checkpoint's config.json (engine_config_load's parse and
 * engine_config_from_json: release and flat layouts, every section 2 check), then for an accepted
 * config the sizes derived from it and a round trip through engine_config_to_json, which must
 * give the same config back (engine/config.h).
 *
 * Input: the file's bytes (JSON text).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "engine/config.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static engine_config_t cfg, again; /* plain data, rewritten by every accepted input */
    char err[512] = "";
    json_t *root = NULL, *out, *out_again;

    if (tdm_json_load_text((const char *)data, size, "config.json", &root, err, sizeof(err)) !=
        TDM_OK) {
        return 0;
    }
    if (engine_config_from_json(root, &cfg, err, sizeof(err)) == TDM_OK) {
        (void)engine_config_kv_row_bytes(&cfg);
        (void)engine_config_max_kv_ratio(&cfg);
        (void)engine_config_kv_bytes_per_token(&cfg);
        (void)engine_config_ring_entry_bytes(&cfg);
        (void)engine_config_ring_entries(&cfg);
        for (int layer = 0; layer < cfg.n_layers; layer++) {
            (void)engine_config_n_c(&cfg, layer, cfg.max_position_embeddings);
        }
        out = engine_config_to_json(&cfg);
        out_again = NULL;
        if (out == NULL || engine_config_from_json(out, &again, err, sizeof(err)) != TDM_OK ||
            (out_again = engine_config_to_json(&again)) == NULL || !json_equal(out, out_again)) {
            fprintf(stderr, "fuzz_config: an accepted config does not round-trip: %s\n", err);
            abort();
        }
        json_decref(out_again);
        json_decref(out);
    }
    json_decref(root);
    return 0;
}
