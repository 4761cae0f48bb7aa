/* test_config.c - engine/config: presets, JSON round trip, flat aliases, derived roles, sizing
 * helpers and every load-time check of MODEL.md section 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/json.h"
#include "engine/config.h"
#include "kernels/kv_page.h"

#define ERR_BYTES 512

/* ---- helpers ------------------------------------------------------------------------------ */

static void preset(const char *name, engine_config_t *cfg)
{
    assert_int_equal(engine_config_preset(name, cfg), TDM_OK);
}

static tdm_status_t from_text(const char *text, engine_config_t *cfg, char *err)
{
    json_t *root;
    tdm_status_t status;

    assert_int_equal(tdm_json_load_text(text, strlen(text), "test", &root, err, ERR_BYTES), TDM_OK);
    status = engine_config_from_json(root, cfg, err, ERR_BYTES);
    json_decref(root);
    return status;
}

/* base <- patch, recursively for objects; other values (null included) replace. */
static void merge(json_t *base, json_t *patch)
{
    const char *key;
    json_t *value;

    json_object_foreach(patch, key, value)
    {
        json_t *old = json_object_get(base, key);
        if (json_is_object(value) && json_is_object(old)) {
            merge(old, value);
        } else {
            json_object_set(base, key, value);
        }
    }
}

/* The tiny preset in the release layout with `patch` (JSON text) merged in, then parsed. */
static tdm_status_t from_tiny_patch(const char *patch, engine_config_t *cfg, char *err)
{
    engine_config_t tiny;
    json_t *root;
    json_t *delta;
    json_error_t error;
    tdm_status_t status;

    preset("tiny", &tiny);
    root = engine_config_to_json(&tiny);
    assert_non_null(root);
    delta = json_loads(patch, 0, &error);
    if (delta == NULL) {
        fail_msg("bad patch in test: %s: %s", patch, error.text);
    }
    if (json_is_object(delta)) {
        merge(root, delta);
    } else {
        json_decref(root);
        root = json_incref(delta);
    }
    status = engine_config_from_json(root, cfg, err, ERR_BYTES);
    json_decref(delta);
    json_decref(root);
    return status;
}

static void assert_same_config(const engine_config_t *a, const engine_config_t *b)
{
    if (memcmp(a, b, sizeof(*a)) != 0) {
        json_t *ja = engine_config_to_json(a);
        json_t *jb = engine_config_to_json(b);
        char *ta = json_dumps(ja, JSON_SORT_KEYS);
        char *tb = json_dumps(jb, JSON_SORT_KEYS);
        for (size_t i = 0; ta[i] != '\0' && tb[i] != '\0'; i++) {
            if (ta[i] != tb[i]) {
                print_message("differ at: a ...%.80s\nb ...%.80s\n", ta + (i > 40 ? i - 40 : 0),
                              tb + (i > 40 ? i - 40 : 0));
                break;
            }
        }
        free(ta);
        free(tb);
        json_decref(ja);
        json_decref(jb);
        fail_msg("configs differ");
    }
}

/* ---- presets and JSON ---------------------------------------------------------------------- */

static void test_presets_round_trip_through_json(void **state)
{
    static const char *const names[] = {"tiny", "small", "full"};
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        engine_config_t cfg;
        engine_config_t back;
        char err[ERR_BYTES] = "";
        json_t *root;
        char *text;

        preset(names[i], &cfg);
        root = engine_config_to_json(&cfg);
        assert_non_null(root);
        assert_null(json_object_get(root, "vision_config"));
        assert_string_equal(
            json_string_value(json_array_get(json_object_get(root, "architectures"), 0)),
            "DeepseekV41ForCausalLM");
        text = json_dumps(root, JSON_INDENT(2));
        json_decref(root);
        assert_non_null(text);
        if (from_text(text, &back, err) != TDM_OK) {
            fail_msg("%s: %s", names[i], err);
        }
        free(text);
        assert_same_config(&cfg, &back);
    }
}

static void test_preset_values_follow_model_md_section_9(void **state)
{
    engine_config_t tiny;
    engine_config_t small;
    engine_config_t full;
    (void)state;

    preset("tiny", &tiny);
    preset("small", &small);
    preset("full", &full);
    assert_int_equal(tiny.vocab_size, 1024);
    assert_int_equal(tiny.hidden_size, 128);
    assert_int_equal(tiny.num_hidden_layers, 8);
    assert_int_equal(tiny.n_compress_ratios, 11);
    assert_int_equal(tiny.engram_compressed_vocab_size, 520);
    assert_int_equal(tiny.image_token_id, 1022);
    assert_int_equal(tiny.dspark_noise_token_id, 1023);
    assert_int_equal(tiny.hc_mult, 4); /* unlisted: equals full */
    assert_int_equal(small.moe_intermediate_size, 96);
    assert_int_equal(small.n_compress_ratios, 19);
    assert_int_equal(small.compress_ratios[7], 2);
    assert_int_equal(small.compress_ratios[8], 1);
    assert_int_equal(small.engram_num_embeddings[1], 50980);
    assert_int_equal(full.n_compress_ratios, 43);
    assert_int_equal(full.compress_ratios[19], 2);
    assert_int_equal(full.compress_ratios[20], 1);
    assert_int_equal(full.engram_num_embeddings[0], 384006168);
    assert_true(full.rms_norm_eps == 1e-20);
    assert_true(full.rope_scaling.factor == 16.0);
    assert_int_equal(full.rope_scaling.original_max_position_embeddings, 65536);
    assert_string_equal(full.scoring_func, "sqrtsoftplus");
}

static void test_unknown_preset_is_invalid_and_changes_nothing(void **state)
{
    engine_config_t cfg;
    engine_config_t before;
    (void)state;

    memset(&before, 0xA5, sizeof(before));
    cfg = before;
    assert_int_equal(engine_config_preset("huge", &cfg), TDM_ERR_INVALID_ARG);
    assert_int_equal(engine_config_preset(NULL, &cfg), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    assert_null(engine_config_to_json(NULL));
    assert_int_equal(engine_config_from_json(NULL, &cfg, NULL, 0), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
}

static void test_missing_fields_take_full_values(void **state)
{
    engine_config_t full;
    engine_config_t cfg;
    char err[ERR_BYTES] = "";
    (void)state;

    preset("full", &full);
    assert_int_equal(from_text("{}", &cfg, err), TDM_OK);
    assert_same_config(&full, &cfg);
    assert_int_equal(from_text("{\"text_config\": {\"hidden_size\": null}, \"vision_config\": "
                               "{\"hidden_size\": 7}, \"quantization_config\": null}",
                               &cfg, err),
                     TDM_OK);
    assert_same_config(&full, &cfg);
}

static void test_text_config_wins_over_top_level(void **state)
{
    engine_config_t cfg;
    char err[ERR_BYTES] = "";
    (void)state;

    assert_int_equal(from_tiny_patch("{\"hidden_size\": 256, \"dim\": 512, \"text_config\": "
                                     "{\"dim\": 1024}}",
                                     &cfg, err),
                     TDM_OK);
    assert_int_equal(cfg.hidden_size, 128);
    assert_int_equal(from_tiny_patch("{\"sliding_window\": 32, \"text_config\": "
                                     "{\"sliding_window\": null}}",
                                     &cfg, err),
                     TDM_OK);
    assert_int_equal(cfg.sliding_window, 32);
}

/* The tiny config as a flat inference/config.json: aliases, top-level fields, `rope`. */
static char *flat_tiny(const char *rope)
{
    static const char *const head =
        "{\"vocab_size\": 1024, \"dim\": 128, \"n_layers\": 8, \"n_heads\": 4,"
        " \"num_key_value_heads\": 1, \"head_dim\": 64, \"rope_head_dim\": 16,"
        " \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 32, \"hidden_act\": \"silu\","
        " \"swiglu_limit\": 10, \"norm_eps\": 1e-20, \"max_position_embeddings\": 8192,"
        " \"window_size\": 16, \"compress_ratios\": [0,0,2,2,1,1,1,1,0,0,0],"
        " \"kv_source_layers\": [2,4], \"index_source_layers\": [2,4,6],"
        " \"index_n_heads\": 4, \"index_head_dim\": 32, \"index_topk\": 8,"
        " \"candidate_source_layer\": 4, \"candidate_topk_blocks\": 4,"
        " \"candidate_block_size\": 4, \"n_routed_experts\": 8, \"n_shared_experts\": 1,"
        " \"n_activated_experts\": 2, \"moe_inter_dim\": 32, \"score_func\": \"sqrtsoftplus\","
        " \"route_scale\": 1.5, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-6,"
        " \"engram_layer_ids\": [1,2], \"engram_num_embeddings\": [6126, 6332],"
        " \"engram_max_ngram_size\": 4, \"engram_n_heads\": 2, \"engram_head_dim\": 32,"
        " \"engram_vocab_size\": 1000, \"engram_pad_id\": 2,"
        " \"engram_compressed_vocab_size\": 520, \"n_mtp_layers\": 3,"
        " \"dspark_block_size\": 5, \"dspark_noise_token_id\": 1023,"
        " \"dspark_target_layer_ids\": [5,6,7], \"dspark_markov_rank\": 16,"
        " \"dspark_n_routed_experts\": 4, \"dspark_n_activated_experts\": 2,"
        " \"image_token_id\": 1022, \"dtype\": \"fp8\", \"scale_fmt\": \"ue8m0\","
        " \"expert_dtype\": \"fp4\", \"inter_dim\": 12345, \"n_dense_layers\": 0, ";
    size_t n = strlen(head) + strlen(rope) + 2;
    char *text = malloc(n);

    assert_non_null(text);
    snprintf(text, n, "%s%s}", head, rope);
    return text;
}

static void test_flat_aliases_give_the_nested_config(void **state)
{
    static const char *const ropes[] = {
        "\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 10000},"
        " \"compress\": {\"rope_type\": \"yarn\", \"rope_theta\": 160000, \"factor\": 16,"
        " \"beta_fast\": 32, \"beta_slow\": 1, \"original_max_position_embeddings\": 65536}}",
        "\"rope_theta\": 10000, \"compress_rope_theta\": 160000, \"rope_factor\": 16,"
        " \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1",
        "\"rope_theta\": 10000.0, \"compress_rope_theta\": 160000, \"rope_parameters\":"
        " {\"type\": \"yarn\", \"factor\": 16.0, \"beta_fast\": 32, \"beta_slow\": 1,"
        " \"original_max_position_embeddings\": 65536}",
    };
    engine_config_t tiny;
    (void)state;

    preset("tiny", &tiny);
    /* The flat layout spells dtype "fp8"; it is kept as written. */
    memset(tiny.dtype, 0, sizeof(tiny.dtype));
    snprintf(tiny.dtype, sizeof(tiny.dtype), "fp8");
    for (size_t i = 0; i < sizeof(ropes) / sizeof(ropes[0]); i++) {
        engine_config_t cfg;
        char err[ERR_BYTES] = "";
        char *text = flat_tiny(ropes[i]);

        if (from_text(text, &cfg, err) != TDM_OK) {
            fail_msg("flat variant %zu: %s", i, err);
        }
        free(text);
        assert_same_config(&tiny, &cfg);
    }
}

static void test_load_reads_a_file_or_a_checkpoint_dir(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[1024];
    char file[1100];
    engine_config_t small;
    engine_config_t cfg;
    engine_config_t before;
    char err[ERR_BYTES] = "";
    json_t *root;
    FILE *f;
    (void)state;

    assert_non_null(tmp);
    snprintf(dir, sizeof(dir), "%s/test_config", tmp);
    mkdir(dir, 0755);
    snprintf(file, sizeof(file), "%s/config.json", dir);
    preset("small", &small);
    root = engine_config_to_json(&small);
    assert_int_equal(json_dump_file(root, file, JSON_INDENT(2)), 0);
    json_decref(root);

    assert_int_equal(engine_config_load(dir, &cfg, err, sizeof(err)), TDM_OK);
    assert_same_config(&small, &cfg);
    memset(&cfg, 0, sizeof(cfg));
    assert_int_equal(engine_config_load(file, &cfg, err, sizeof(err)), TDM_OK);
    assert_same_config(&small, &cfg);

    memset(&before, 0x5A, sizeof(before));
    cfg = before;
    snprintf(file, sizeof(file), "%s/no-such-dir", dir);
    assert_int_equal(engine_config_load(file, &cfg, err, sizeof(err)), TDM_ERR_NOT_FOUND);
    assert_memory_equal(&cfg, &before, sizeof(cfg));

    snprintf(file, sizeof(file), "%s/bad.json", dir);
    f = fopen(file, "w");
    assert_non_null(f);
    fputs("{\"text_config\": {\"hidden_size\": 128,", f);
    fclose(f);
    assert_int_equal(engine_config_load(file, &cfg, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "bad.json"));
    assert_memory_equal(&cfg, &before, sizeof(cfg));

    f = fopen(file, "w");
    assert_non_null(f);
    fputs("{\"text_config\": {\"hidden_size\": 100}}", f);
    fclose(f);
    assert_int_equal(engine_config_load(file, &cfg, err, sizeof(err)), TDM_ERR_MISMATCH);
    assert_non_null(strstr(err, "bad.json: text_config.hidden_size: 100 is not a multiple of 32"));
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    assert_int_equal(engine_config_load(NULL, &cfg, err, sizeof(err)), TDM_ERR_INVALID_ARG);
}

/* ---- derived roles ------------------------------------------------------------------------ */

static int in_list(int layer, const int *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (list[i] == layer) {
            return 1;
        }
    }
    return 0;
}

/* Checks every layer's kind against the lists of Full and Reindex layers (others with ratio > 0
 * are Reuse, ratio 0 SWA). */
static void assert_kinds(const engine_config_t *cfg, const int *full, size_t n_full,
                         const int *reindex, size_t n_reindex)
{
    for (int l = 0; l < cfg->n_roles; l++) {
        engine_layer_kind_t want = ENGINE_LAYER_SWA;

        if (in_list(l, full, n_full)) {
            want = ENGINE_LAYER_FULL;
        } else if (in_list(l, reindex, n_reindex)) {
            want = ENGINE_LAYER_REINDEX;
        } else if (cfg->roles[l].ratio > 0) {
            want = ENGINE_LAYER_REUSE;
        }
        if (cfg->roles[l].kind != want) {
            fail_msg("layer %d is %s, expected %s", l,
                     engine_config_layer_kind_name(cfg->roles[l].kind),
                     engine_config_layer_kind_name(want));
        }
    }
}

static void test_roles_tiny(void **state)
{
    static const int full[] = {2, 4};
    static const int reindex[] = {6};
    static const int kv_src[8] = {-1, -1, 2, 2, 4, 4, 4, 4};
    static const int idx_src[8] = {-1, -1, 2, 2, 4, 4, 6, 6};
    engine_config_t cfg;
    (void)state;

    preset("tiny", &cfg);
    assert_int_equal(cfg.n_layers, 8);
    assert_int_equal(cfg.n_blocks, 3);
    assert_int_equal(cfg.n_roles, 11);
    assert_int_equal(cfg.ced_cut, 4);
    assert_kinds(&cfg, full, 2, reindex, 1);
    assert_int_equal(cfg.roles[3].kind, ENGINE_LAYER_REUSE);
    assert_int_equal(cfg.roles[5].kind, ENGINE_LAYER_REUSE);
    assert_int_equal(cfg.roles[7].kind, ENGINE_LAYER_REUSE);
    for (int l = 0; l < 8; l++) {
        assert_int_equal(cfg.roles[l].kv_src, kv_src[l]);
        assert_int_equal(cfg.roles[l].idx_src, idx_src[l]);
    }
    assert_true(cfg.roles[4].flags & ENGINE_ROLE_CANDIDATE_SOURCE);
    assert_true(cfg.roles[6].flags & ENGINE_ROLE_CANDIDATE_CONSUMER);
    assert_false(cfg.roles[2].flags & ENGINE_ROLE_CANDIDATE_CONSUMER);
    /* Engram on a window layer (1) and a KV source (2). */
    assert_int_equal(cfg.roles[1].engram_slot, 0);
    assert_int_equal(cfg.roles[1].kind, ENGINE_LAYER_SWA);
    assert_int_equal(cfg.roles[2].engram_slot, 1);
    assert_true(cfg.roles[2].flags & ENGINE_ROLE_KV_SOURCE);
    for (int l = 5; l <= 7; l++) {
        assert_int_equal(cfg.roles[l].tap_slot, l - 5);
        assert_true(cfg.roles[l].flags & ENGINE_ROLE_TAP);
    }
    for (int l = 8; l <= 10; l++) {
        assert_int_equal(cfg.roles[l].flags, ENGINE_ROLE_DSPARK);
        assert_int_equal(cfg.roles[l].kind, ENGINE_LAYER_SWA);
        assert_int_equal(cfg.roles[l].kv_src, -1);
        assert_int_equal(cfg.roles[l].engram_slot, -1);
    }
}

static void test_roles_small(void **state)
{
    static const int full[] = {2, 5, 8};
    static const int reindex[] = {12};
    engine_config_t cfg;
    (void)state;

    preset("small", &cfg);
    assert_int_equal(cfg.ced_cut, 8);
    assert_int_equal(cfg.n_roles, 19);
    assert_kinds(&cfg, full, 3, reindex, 1);
    assert_int_equal(cfg.roles[4].kv_src, 2);
    assert_int_equal(cfg.roles[7].kv_src, 5);
    assert_int_equal(cfg.roles[15].kv_src, 8);
    assert_int_equal(cfg.roles[11].idx_src, 8);
    assert_int_equal(cfg.roles[13].idx_src, 12);
    assert_true(cfg.roles[8].flags & ENGINE_ROLE_CANDIDATE_SOURCE);
    assert_true(cfg.roles[12].flags & ENGINE_ROLE_CANDIDATE_CONSUMER);
    assert_int_equal(cfg.roles[5].engram_slot, 1);
    assert_int_equal(cfg.roles[15].tap_slot, 2);
    assert_int_equal(cfg.roles[16].flags, ENGINE_ROLE_DSPARK);
}

static void test_roles_full(void **state)
{
    static const int full[] = {2, 8, 14, 20};
    static const int reindex[] = {24, 28, 32, 36};
    engine_config_t cfg;
    (void)state;

    preset("full", &cfg);
    assert_int_equal(cfg.ced_cut, 20);
    assert_int_equal(cfg.n_roles, 43);
    assert_kinds(&cfg, full, 4, reindex, 4);
    for (int l = 0; l < 43; l++) {
        const engine_layer_role_t *role = &cfg.roles[l];
        int want_kv = l < 2 || l >= 40 ? -1 : l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
        int want_idx = l < 2 || l >= 40 ? -1 : l < 24 ? want_kv : 24 + 4 * ((l - 24) / 4);
        int consumer = l == 24 || l == 28 || l == 32 || l == 36;

        assert_int_equal(role->ratio, l < 2 || l >= 40 ? 0 : l < 20 ? 2 : 1);
        assert_int_equal(role->kv_src, want_kv);
        assert_int_equal(role->idx_src, want_idx);
        assert_int_equal((role->flags & ENGINE_ROLE_CANDIDATE_CONSUMER) != 0, consumer);
        assert_int_equal((role->flags & ENGINE_ROLE_CANDIDATE_SOURCE) != 0, l == 20);
        assert_int_equal(role->engram_slot, l == 1 ? 0 : l == 14 ? 1 : -1);
        assert_int_equal(role->tap_slot, l >= 37 && l <= 39 ? l - 37 : -1);
        assert_int_equal((role->flags & ENGINE_ROLE_DSPARK) != 0, l >= 40);
    }
}

/* ---- sizing helpers ----------------------------------------------------------------------- */

static void test_kv_sizes_match_model_md_tables(void **state)
{
    static const struct {
        const char *name;
        int64_t row_bytes;
        double rows_per_token;
        double bytes_per_token;
        int64_t ring_entry_bytes;
        int64_t ring_entries;
    } want[] = {
        {"tiny", 53, 1.5, 79.5, 66, 22},
        {"small", 106, 2.0, 212.0, 132, 134},
        {"full", 356, 2.5, 890.0, 528, 134},
    };
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        engine_config_t cfg;

        preset(want[i].name, &cfg);
        assert_int_equal(engine_config_kv_row_bytes(&cfg), want[i].row_bytes);
        assert_true(engine_config_kv_rows_per_token(&cfg) == want[i].rows_per_token);
        assert_true(engine_config_kv_bytes_per_token(&cfg) == want[i].bytes_per_token);
        assert_int_equal(engine_config_ring_entry_bytes(&cfg), want[i].ring_entry_bytes);
        assert_int_equal(engine_config_ring_entries(&cfg), want[i].ring_entries);
    }
}

/* The page geometry the workers register and the router checks (docs/PROTOCOL.md): page bytes
 * of the (d, d_I) layout (MODEL.md 7: 22848 at full size), block = 64 x the largest ratio. */
static void test_kv_geometry_is_the_page_layout_and_the_largest_ratio(void **state)
{
    static const struct {
        const char *name;
        uint32_t page_bytes;
    } want[] = {{"tiny", 3456}, {"small", 6848}, {"full", 22848}};
    kern_kv_geometry_t geometry;
    engine_config_t cfg;
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        preset(want[i].name, &cfg);
        assert_int_equal(engine_config_max_kv_ratio(&cfg),
                         2); /* every preset has a ratio-2 source */
        assert_int_equal(kern_kv_geometry((uint32_t)cfg.head_dim, (uint32_t)cfg.index_head_dim,
                                          engine_config_max_kv_ratio(&cfg), &geometry),
                         TDM_OK);
        assert_int_equal(geometry.rows_per_page, KERN_KV_PAGE_ROWS);
        assert_int_equal(geometry.page_bytes, want[i].page_bytes);
        assert_int_equal(geometry.tokens_per_block, 128);
    }
    /* only ratio-1 sources: a block is one page of rows */
    for (int i = 0; i < cfg.n_kv_source_layer_ids; i++) {
        cfg.roles[cfg.kv_source_layer_ids[i]].ratio = 1;
    }
    assert_int_equal(engine_config_max_kv_ratio(&cfg), 1);
    cfg.n_kv_source_layer_ids = 0; /* none at all: still 1 */
    assert_int_equal(engine_config_max_kv_ratio(&cfg), 1);
}

static void test_n_c_counts_published_rows(void **state)
{
    engine_config_t cfg;
    engine_config_t full;
    (void)state;

    preset("tiny", &cfg);
    /* ratio 2: row j published at token 2j+1 */
    assert_int_equal(engine_config_n_c(&cfg, 2, 0), 0);
    assert_int_equal(engine_config_n_c(&cfg, 2, 1), 1);
    assert_int_equal(engine_config_n_c(&cfg, 2, 2), 1);
    assert_int_equal(engine_config_n_c(&cfg, 3, 3), 2);
    /* ratio 1: every token publishes */
    assert_int_equal(engine_config_n_c(&cfg, 4, 0), 1);
    assert_int_equal(engine_config_n_c(&cfg, 7, 9), 10);
    /* no compressed rows */
    assert_int_equal(engine_config_n_c(&cfg, 0, 9), 0);
    assert_int_equal(engine_config_n_c(&cfg, 8, 9), 0);
    assert_int_equal(engine_config_n_c(&cfg, 2, -1), 0);
    assert_int_equal(engine_config_n_c(&cfg, 99, 9), 0);
    /* 4 tokens: source 2 holds 2 rows, source 4 holds 4 */
    assert_int_equal(engine_config_kv_bytes(&cfg, 4), 6 * 53);
    assert_int_equal(engine_config_kv_bytes(&cfg, 0), 0);
    preset("full", &full);
    /* 2^20 tokens = 933.2 MB (MODEL.md 7) */
    assert_int_equal(engine_config_kv_bytes(&full, (int64_t)1 << 20), 933232640);
}

/* ---- load-time checks -------------------------------------------------------------------- */

typedef struct {
    const char *patch;   /* JSON merged into the tiny release config (a non-object replaces it) */
    tdm_status_t status; /* expected */
    const char *message; /* expected substring of err (names the field) */
} bad_case_t;

static const bad_case_t bad_cases[] = {
    /* JSON shape and types: TDM_ERR_FORMAT */
    {"[1, 2]", TDM_ERR_FORMAT, "config.json: not a JSON object"},
    {"{\"text_config\": 5}", TDM_ERR_FORMAT, "config.json: text_config: not an object"},
    {"{\"quantization_config\": []}", TDM_ERR_FORMAT, "config.json: quantization_config: not an"},
    {"{\"text_config\": {\"hidden_size\": \"big\"}}", TDM_ERR_FORMAT,
     "config.json: text_config.hidden_size: not an integer"},
    {"{\"text_config\": {\"vocab_size\": 1024.5}}", TDM_ERR_FORMAT,
     "text_config.vocab_size: not an integer"},
    {"{\"text_config\": {\"tie_word_embeddings\": 0}}", TDM_ERR_FORMAT,
     "text_config.tie_word_embeddings: not a boolean"},
    {"{\"text_config\": {\"hidden_act\": 1}}", TDM_ERR_FORMAT,
     "text_config.hidden_act: not a string"},
    {"{\"text_config\": {\"rms_norm_eps\": \"1e-20\"}}", TDM_ERR_FORMAT,
     "text_config.rms_norm_eps: not a number"},
    {"{\"text_config\": {\"compress_ratios\": 2}}", TDM_ERR_FORMAT,
     "text_config.compress_ratios: not a list"},
    {"{\"text_config\": {\"kv_source_layer_ids\": [2, \"4\"]}}", TDM_ERR_FORMAT,
     "text_config.kv_source_layer_ids[1]: not an integer"},
    {"{\"text_config\": {\"rope_scaling\": \"yarn\"}}", TDM_ERR_FORMAT,
     "text_config.rope_scaling: not an object"},
    {"{\"architectures\": \"DeepseekV41ForCausalLM\"}", TDM_ERR_FORMAT,
     "architectures: not a list"},
    {"{\"architectures\": [3]}", TDM_ERR_FORMAT, "architectures[0]: not a string"},
    /* plain ranges and values: TDM_ERR_MISMATCH */
    {"{\"text_config\": {\"hidden_size\": 0}}", TDM_ERR_MISMATCH,
     "text_config.hidden_size: 0 not in [32, 65536]"},
    {"{\"text_config\": {\"rms_norm_eps\": 0}}", TDM_ERR_MISMATCH,
     "text_config.rms_norm_eps: 0 is not a positive finite number"},
    {"{\"text_config\": {\"engram_layer_ids\": [0,1,2,3,4,5,6,7,7]}}", TDM_ERR_MISMATCH,
     "text_config.engram_layer_ids: 9 entries, at most 8"},
    {"{\"architectures\": [\"LlamaForCausalLM\"]}", TDM_ERR_MISMATCH,
     "config.json: architectures: does not name DeepseekV41ForCausalLM"},
    {"{\"model_type\": \"llama\"}", TDM_ERR_MISMATCH,
     "config.json: model_type: \"llama\" is not deepseek_v41"},
    {"{\"text_config\": {\"model_type\": \"llama\"}}", TDM_ERR_MISMATCH,
     "text_config.model_type: \"llama\" is not deepseek_v41_text"},
    {"{\"dtype\": \"float16\"}", TDM_ERR_MISMATCH, "dtype: \"float16\" is not bfloat16 or fp8"},
    {"{\"quantization_config\": {\"quant_method\": \"awq\"}}", TDM_ERR_MISMATCH,
     "quantization_config.quant_method: \"awq\" is not fp8"},
    {"{\"quantization_config\": {\"activation_scheme\": \"static\"}}", TDM_ERR_MISMATCH,
     "quantization_config.activation_scheme: \"static\" is not dynamic"},
    {"{\"quantization_config\": {\"scale_fmt\": \"e4m3\"}}", TDM_ERR_MISMATCH,
     "quantization_config.scale_fmt: \"e4m3\" is not ue8m0"},
    {"{\"quantization_config\": {\"expert_dtype\": \"fp8\"}}", TDM_ERR_MISMATCH,
     "quantization_config.expert_dtype: \"fp8\" is not fp4"},
    {"{\"quantization_config\": {\"weight_block_size\": [128, 128]}}", TDM_ERR_MISMATCH,
     "quantization_config.weight_block_size: must be [32, 32]"},
    {"{\"text_config\": {\"hidden_act\": \"gelu\"}}", TDM_ERR_MISMATCH,
     "text_config.hidden_act: \"gelu\" is not silu"},
    {"{\"text_config\": {\"scoring_func\": \"softmax\"}}", TDM_ERR_MISMATCH,
     "text_config.scoring_func: \"softmax\" is not sqrtsoftplus"},
    {"{\"text_config\": {\"topk_method\": \"greedy\"}}", TDM_ERR_MISMATCH,
     "text_config.topk_method: \"greedy\" is not noaux_tc"},
    {"{\"text_config\": {\"rope_scaling\": {\"rope_type\": \"linear\"}}}", TDM_ERR_MISMATCH,
     "text_config.rope_scaling.rope_type: \"linear\" is not yarn"},
    /* section 2 checks: ratios, sources, candidates */
    {"{\"text_config\": {\"compress_ratios\": [0,0,2,3,1,1,1,1,0,0,0]}}", TDM_ERR_MISMATCH,
     "config.json: text_config.compress_ratios[3]: ratio 3 not in {0,1,2}"},
    {"{\"text_config\": {\"compress_ratios\": [0,0,2,2,1,1,1,1,0,0,0,0]}}", TDM_ERR_MISMATCH,
     "text_config.compress_ratios: 12 entries for 8 layers + 3 DSpark blocks"},
    {"{\"text_config\": {\"compress_ratios\": [0,0,2,2,1,1,1,1,0,1,0]}}", TDM_ERR_MISMATCH,
     "text_config.compress_ratios[9]: DSpark block 1 must have ratio 0"},
    {"{\"text_config\": {\"num_hidden_layers\": 62}}", TDM_ERR_MISMATCH,
     "text_config.num_hidden_layers: 62 layers + 3 DSpark blocks exceed 64"},
    {"{\"text_config\": {\"kv_source_layer_ids\": [2, 8]}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids[1]: layer 8 not in [0, 8)"},
    {"{\"text_config\": {\"kv_source_layer_ids\": [4, 2]}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids[1]: layer 2 does not follow 4"},
    {"{\"text_config\": {\"kv_source_layer_ids\": []}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids: must not be empty"},
    {"{\"text_config\": {\"kv_source_layer_ids\": [1, 2, 4]}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids[0]: layer 1 has compress ratio 0"},
    {"{\"text_config\": {\"index_source_layer_ids\": [0, 2, 4, 6]}}", TDM_ERR_MISMATCH,
     "text_config.index_source_layer_ids[0]: layer 0 has compress ratio 0"},
    {"{\"text_config\": {\"compress_ratios\": [0,2,2,2,1,1,1,1,0,0,0]}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids: layer 1 (ratio 2) has no KV source at or below it"},
    {"{\"text_config\": {\"compress_ratios\": [0,0,2,2,2,1,1,1,0,0,0]}}", TDM_ERR_MISMATCH,
     "text_config.kv_source_layer_ids: layer 5 has ratio 1 but its KV source 4 has ratio 2"},
    {"{\"text_config\": {\"index_source_layer_ids\": [4, 6]}}", TDM_ERR_MISMATCH,
     "text_config.index_source_layer_ids: layer 2 (ratio 2) has no index source at or below"},
    {"{\"text_config\": {\"index_source_layer_ids\": [2, 3, 6]}}", TDM_ERR_MISMATCH,
     "text_config.index_source_layer_ids: layer 4: index source 3 is below its KV source 4"},
    {"{\"text_config\": {\"candidate_source_layer_id\": 3}}", TDM_ERR_MISMATCH,
     "text_config.candidate_source_layer_id: layer 3 is not an index source"},
    {"{\"text_config\": {\"candidate_source_layer_id\": 6}}", TDM_ERR_MISMATCH,
     "text_config.candidate_source_layer_id: layer 6 is above the CED cut c = 4"},
    {"{\"text_config\": {\"candidate_source_layer_id\": 2}}", TDM_ERR_MISMATCH,
     "text_config.index_source_layer_ids[1]: candidate consumer 4 reads KV source 4, the "
     "candidate source 2 reads 2"},
    {"{\"text_config\": {\"candidate_topk_blocks\": 1}}", TDM_ERR_MISMATCH,
     "text_config.candidate_topk_blocks: 1 blocks x candidate_block_size 4 < index_topk 8"},
    /* dimensions */
    {"{\"text_config\": {\"hidden_size\": 100}}", TDM_ERR_MISMATCH,
     "text_config.hidden_size: 100 is not a multiple of 32"},
    {"{\"text_config\": {\"moe_intermediate_size\": 48}}", TDM_ERR_MISMATCH,
     "text_config.moe_intermediate_size: 48 is not a multiple of 32"},
    {"{\"text_config\": {\"head_dim\": 80}}", TDM_ERR_MISMATCH,
     "text_config.head_dim: 80 is not a multiple of 32"},
    {"{\"text_config\": {\"index_head_dim\": 48}}", TDM_ERR_MISMATCH,
     "text_config.index_head_dim: 48 is not a multiple of 32"},
    {"{\"text_config\": {\"engram_head_dim\": 48}}", TDM_ERR_MISMATCH,
     "text_config.engram_head_dim: 48 is not a multiple of 32"},
    {"{\"text_config\": {\"q_lora_rank\": 48}}", TDM_ERR_MISMATCH,
     "text_config.q_lora_rank: 48 is not a multiple of 32"},
    {"{\"text_config\": {\"o_lora_rank\": 48}}", TDM_ERR_MISMATCH,
     "text_config.o_lora_rank: 48 is not a multiple of 32"},
    {"{\"text_config\": {\"qk_rope_head_dim\": 15}}", TDM_ERR_MISMATCH,
     "text_config.qk_rope_head_dim: 15 is odd"},
    {"{\"text_config\": {\"qk_rope_head_dim\": 64}}", TDM_ERR_MISMATCH,
     "text_config.qk_rope_head_dim: 64 exceeds min(head_dim, index_head_dim) = 32"},
    {"{\"text_config\": {\"o_groups\": 3}}", TDM_ERR_MISMATCH,
     "text_config.o_groups: 3 does not divide num_attention_heads 4"},
    {"{\"text_config\": {\"num_key_value_heads\": 2}}", TDM_ERR_MISMATCH,
     "text_config.num_key_value_heads: 2, but the model has one shared KV latent (must be 1)"},
    {"{\"text_config\": {\"n_shared_experts\": 2}}", TDM_ERR_MISMATCH,
     "text_config.n_shared_experts: 2, must be 1"},
    {"{\"text_config\": {\"num_experts_per_tok\": 9}}", TDM_ERR_MISMATCH,
     "text_config.num_experts_per_tok: 9 exceeds n_routed_experts 8"},
    {"{\"text_config\": {\"dspark_num_experts_per_tok\": 5}}", TDM_ERR_MISMATCH,
     "text_config.dspark_num_experts_per_tok: 5 exceeds dspark_n_routed_experts 4"},
    /* token ids, flags */
    {"{\"bos_token_id\": 1024}", TDM_ERR_MISMATCH,
     "config.json: bos_token_id: token id 1024 not below vocab_size 1024"},
    {"{\"eos_token_id\": 5000}", TDM_ERR_MISMATCH, "eos_token_id: token id 5000 not below"},
    {"{\"pad_token_id\": 5000}", TDM_ERR_MISMATCH, "pad_token_id: token id 5000 not below"},
    {"{\"image_token_id\": 1024}", TDM_ERR_MISMATCH, "image_token_id: token id 1024 not below"},
    {"{\"text_config\": {\"dspark_noise_token_id\": 1024}}", TDM_ERR_MISMATCH,
     "text_config.dspark_noise_token_id: token id 1024 not below vocab_size 1024"},
    {"{\"text_config\": {\"engram_pad_token_id\": 1024}}", TDM_ERR_MISMATCH,
     "text_config.engram_pad_token_id: token id 1024 not below vocab_size 1024"},
    {"{\"text_config\": {\"tie_word_embeddings\": true}}", TDM_ERR_MISMATCH,
     "text_config.tie_word_embeddings: true, must be false"},
    {"{\"text_config\": {\"norm_topk_prob\": false}}", TDM_ERR_MISMATCH,
     "text_config.norm_topk_prob: false, must be true"},
    /* Engram */
    {"{\"text_config\": {\"engram_num_embeddings\": [6126]}}", TDM_ERR_MISMATCH,
     "text_config.engram_num_embeddings: 1 entries for 2 Engram layers"},
    {"{\"text_config\": {\"engram_num_embeddings\": [6126, 6333]}}", TDM_ERR_MISMATCH,
     "text_config.engram_num_embeddings[1]: 6333 rows, but the primes of layer 2 sum to 6332"},
    {"{\"text_config\": {\"engram_vocab_size\": 1010}}", TDM_ERR_MISMATCH,
     "text_config.engram_num_embeddings[0]: 6126 rows, but the primes of layer 1 sum to"},
    {"{\"text_config\": {\"engram_num_embeddings\": null}}", TDM_ERR_MISMATCH,
     "text_config.engram_num_embeddings[0] (missing: full-size default): 384006168 rows"},
    {"{\"text_config\": {\"engram_layer_ids\": [1, 9]}}", TDM_ERR_MISMATCH,
     "text_config.engram_layer_ids[1]: layer 9 not in [0, 8)"},
    /* DSpark taps */
    {"{\"text_config\": {\"dspark_target_layer_ids\": [5, 6, 8]}}", TDM_ERR_MISMATCH,
     "text_config.dspark_target_layer_ids[2]: layer 8 not in [0, 8)"},
    {"{\"text_config\": {\"dspark_target_layer_ids\": []}}", TDM_ERR_MISMATCH,
     "text_config.dspark_target_layer_ids: must not be empty"},
    /* a flat alias is named as written */
    {"{\"text_config\": {\"hidden_size\": null, \"dim\": 100}}", TDM_ERR_MISMATCH,
     "text_config.dim: 100 is not a multiple of 32"},
    {"{\"text_config\": {\"rope_scaling\": null, \"rope_parameters\": {\"compress\": "
     "{\"factor\": -1}}}}",
     TDM_ERR_MISMATCH, "text_config.rope_parameters.compress.factor: -1 is not a positive"},
};

static void test_every_check_fails_with_its_field_and_changes_nothing(void **state)
{
    (void)state;

    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const bad_case_t *c = &bad_cases[i];
        engine_config_t cfg;
        engine_config_t before;
        char err[ERR_BYTES] = "";
        tdm_status_t status;

        memset(&before, 0xA5, sizeof(before));
        cfg = before;
        status = from_tiny_patch(c->patch, &cfg, err);
        if (status != c->status || strstr(err, c->message) == NULL) {
            fail_msg("case %zu %s: got %s \"%s\", want %s \"%s\"", i, c->patch,
                     tdm_status_name(status), err, tdm_status_name(c->status), c->message);
        }
        assert_memory_equal(&cfg, &before, sizeof(cfg));
        assert_null(strchr(err, '\n'));
    }
}

static void test_valid_variations_load(void **state)
{
    engine_config_t cfg;
    char err[ERR_BYTES] = "";
    (void)state;

    /* A shorter compress_ratios list: missing entries (DSpark blocks) are 0. */
    assert_int_equal(from_tiny_patch("{\"text_config\": {\"compress_ratios\": "
                                     "[0,0,2,2,1,1,1,1]}}",
                                     &cfg, err),
                     TDM_OK);
    assert_int_equal(cfg.roles[9].ratio, 0);
    /* Integers written as integral reals, architectures with extra names, torch_dtype. */
    assert_int_equal(from_tiny_patch("{\"text_config\": {\"hidden_size\": 128.0}, "
                                     "\"architectures\": [\"X\", \"DeepseekV41ForCausalLM\"], "
                                     "\"dtype\": null, \"torch_dtype\": \"bfloat16\"}",
                                     &cfg, err),
                     TDM_OK);
    assert_int_equal(cfg.hidden_size, 128);
    /* No Engram layers. */
    assert_int_equal(from_tiny_patch("{\"text_config\": {\"engram_layer_ids\": [], "
                                     "\"engram_num_embeddings\": []}}",
                                     &cfg, err),
                     TDM_OK);
    assert_int_equal(cfg.roles[1].engram_slot, -1);
    assert_int_equal(cfg.roles[1].flags & ENGINE_ROLE_ENGRAM, 0);
}

/* Capacity.max_tokens of a worker (issue 16): the longest sequence whose KV pages fit, checked
 * against a direct count of pages per KV source; and the KV layout name both ends compare. */
static void test_max_tokens_in_pages_and_kv_layout(void **state)
{
    engine_config_t tiny;
    engine_config_t small;
    char a[ENGINE_CONFIG_KV_LAYOUT_BYTES];
    char b[ENGINE_CONFIG_KV_LAYOUT_BYTES];
    char c[ENGINE_CONFIG_KV_LAYOUT_BYTES];

    (void)state;
    assert_int_equal(engine_config_preset("tiny", &tiny), TDM_OK);
    assert_int_equal(engine_config_preset("small", &small), TDM_OK);
    for (uint64_t pages = 0; pages < 200; pages += 7) {
        uint64_t t = engine_config_max_tokens_in_pages(&tiny, pages, 1u << 20);
        uint64_t used = 0;
        uint64_t used_next = 0;
        for (int i = 0; i < tiny.n_kv_source_layer_ids; i++) {
            int layer = (int)tiny.kv_source_layer_ids[i];
            used += (uint64_t)((engine_config_n_c(&tiny, layer, (int64_t)t - 1) + 63) / 64);
            used_next += (uint64_t)((engine_config_n_c(&tiny, layer, (int64_t)t) + 63) / 64);
        }
        assert_true(used <= pages);      /* t fits */
        assert_true(used_next > pages);  /* t + 1 does not */
    }
    /* a pool larger than the limit needs: the limit */
    assert_int_equal(engine_config_max_tokens_in_pages(&tiny, 1u << 30, 4096), 4096);

    engine_config_kv_layout(&tiny, a, sizeof(a));
    engine_config_kv_layout(&tiny, b, sizeof(b));
    engine_config_kv_layout(&small, c, sizeof(c));
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_non_null(strstr(a, "tandem-kv1:"));
    assert_true(strlen(a) < 128 && strchr(a, ' ') == NULL); /* a protocol id */
    /* moving one KV source to another layer changes the layout */
    tiny.kv_source_layer_ids[0] += 1;
    engine_config_kv_layout(&tiny, b, sizeof(b));
    assert_string_not_equal(a, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_round_trip_through_json),
        cmocka_unit_test(test_preset_values_follow_model_md_section_9),
        cmocka_unit_test(test_unknown_preset_is_invalid_and_changes_nothing),
        cmocka_unit_test(test_missing_fields_take_full_values),
        cmocka_unit_test(test_text_config_wins_over_top_level),
        cmocka_unit_test(test_flat_aliases_give_the_nested_config),
        cmocka_unit_test(test_load_reads_a_file_or_a_checkpoint_dir),
        cmocka_unit_test(test_roles_tiny),
        cmocka_unit_test(test_roles_small),
        cmocka_unit_test(test_roles_full),
        cmocka_unit_test(test_kv_sizes_match_model_md_tables),
        cmocka_unit_test(test_kv_geometry_is_the_page_layout_and_the_largest_ratio),
        cmocka_unit_test(test_n_c_counts_published_rows),
        cmocka_unit_test(test_every_check_fails_with_its_field_and_changes_nothing),
        cmocka_unit_test(test_valid_variations_load),
        cmocka_unit_test(test_max_tokens_in_pages_and_kv_layout),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
