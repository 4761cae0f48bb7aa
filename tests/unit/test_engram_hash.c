/* test_engram_hash.c - engine/engram_hash: primes and offsets (MODEL.md 5.6), b_mu, random
 * checkpoint token map and multipliers (9.2), hashed rows, sidecar checks and sidecar loading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "engine/config.h"
#include "engine/engram_hash.h"
#include "engine/safetensors.h"

#define ERR_BYTES 512

/* Multipliers of the real checkpoint (MODEL.md 9.2), layer 1 then layer 14. */
static const int64_t real_multipliers[2][4] = {
    {76632096046245, 4839876093313, 35959672319349, 73987337458391},
    {67716810739261, 51510806800915, 30921347202721, 82619226485591},
};

static void preset(const char *name, engine_config_t *cfg)
{
    assert_int_equal(engine_config_preset(name, cfg), TDM_OK);
}

static void layout_of(const engine_config_t *cfg, engine_engram_layout_t *layout)
{
    assert_int_equal(engine_engram_layout_init(cfg, layout), TDM_OK);
}

static int naive_is_prime(int64_t n)
{
    if (n < 2) {
        return 0;
    }
    for (int64_t d = 2; d * d <= n; d++) {
        if (n % d == 0) {
            return 0;
        }
    }
    return 1;
}

/* ---- primes and offsets ------------------------------------------------------------------ */

static void test_prime_after_finds_the_next_prime(void **state)
{
    (void)state;
    assert_int_equal(engine_engram_prime_after(-5), 2);
    assert_int_equal(engine_engram_prime_after(0), 2);
    assert_int_equal(engine_engram_prime_after(2), 3);
    assert_int_equal(engine_engram_prime_after(3), 5);
    assert_int_equal(engine_engram_prime_after(999), 1009);
    assert_int_equal(engine_engram_prime_after(15999999), 16000057);
    for (int64_t x = 0; x < 3000; x++) {
        int64_t p = engine_engram_prime_after(x);
        assert_true(p > x);
        assert_true(naive_is_prime(p));
        for (int64_t q = x + 1; q < p; q++) {
            assert_false(naive_is_prime(q));
        }
    }
}

static void test_full_model_primes_per_layer(void **state)
{
    engine_config_t cfg;
    engine_engram_layout_t layout;
    (void)state;

    preset("full", &cfg);
    layout_of(&cfg, &layout);
    assert_int_equal(layout.n_layers, 2);
    assert_int_equal(layout.ngram, 4);
    assert_int_equal(layout.n_heads, 8);
    assert_int_equal(layout.n_cols, 24);
    assert_int_equal(layout.primes[0][0], 16000057);
    assert_int_equal(layout.primes[0][23], 16000463);
    assert_int_equal(layout.primes[1][0], 16000477);
    assert_int_equal(layout.primes[1][23], 16000889);
    assert_int_equal(layout.n_rows[0], 384006168);
    assert_int_equal(layout.n_rows[1], 384016682);
    /* consecutive primes, global across layers */
    for (int slot = 0; slot < 2; slot++) {
        int64_t offset = 0;
        for (int col = 0; col < 24; col++) {
            int64_t prev = col > 0    ? layout.primes[slot][col - 1]
                           : slot > 0 ? layout.primes[slot - 1][23]
                                      : cfg.engram_vocab_size - 1;
            assert_int_equal(layout.primes[slot][col], engine_engram_prime_after(prev));
            assert_int_equal(layout.offsets[slot][col], offset);
            offset += layout.primes[slot][col];
        }
    }
}

static void test_tiny_and_small_prime_sums_match_section_9(void **state)
{
    static const int64_t tiny_primes[2][6] = {{1009, 1013, 1019, 1021, 1031, 1033},
                                              {1039, 1049, 1051, 1061, 1063, 1069}};
    engine_config_t tiny;
    engine_config_t small;
    engine_engram_layout_t layout;
    (void)state;

    preset("tiny", &tiny);
    layout_of(&tiny, &layout);
    assert_int_equal(layout.n_cols, 6);
    assert_memory_equal(layout.primes[0], tiny_primes[0], sizeof(tiny_primes[0]));
    assert_memory_equal(layout.primes[1], tiny_primes[1], sizeof(tiny_primes[1]));
    assert_int_equal(layout.n_rows[0], 6126);
    assert_int_equal(layout.n_rows[1], 6332);
    assert_int_equal(layout.offsets[1][5], 6332 - 1069);

    preset("small", &small);
    layout_of(&small, &layout);
    assert_int_equal(layout.n_cols, 12);
    assert_int_equal(layout.primes[0][0], 4099);
    assert_int_equal(layout.n_rows[0], 49796);
    assert_int_equal(layout.n_rows[1], 50980);
}

static void test_layout_rejects_configs_beyond_limits(void **state)
{
    engine_config_t cfg;
    engine_engram_layout_t layout;
    engine_engram_layout_t before;
    (void)state;

    preset("tiny", &cfg);
    memset(&before, 0x3C, sizeof(before));
    layout = before;
    cfg.engram_n_heads = ENGINE_CONFIG_MAX_ENGRAM_HEADS + 1;
    assert_int_equal(engine_engram_layout_init(&cfg, &layout), TDM_ERR_INVALID_ARG);
    assert_memory_equal(&layout, &before, sizeof(layout));
    assert_int_equal(engine_engram_layout_init(NULL, &layout), TDM_ERR_INVALID_ARG);
}

/* ---- multipliers and token map ----------------------------------------------------------- */

static void test_mult_bound(void **state)
{
    (void)state;
    assert_int_equal(engine_engram_mult_bound(99092), 46539438283891);
    assert_int_equal(engine_engram_mult_bound(520), 8868626958514207);
    assert_int_equal(engine_engram_mult_bound(1), 4611686018427387903);
    assert_int_equal(engine_engram_mult_bound(0), 1);
    assert_int_equal(engine_engram_mult_bound(INT64_MAX), 1);
    /* the real multipliers fit under 2*b_mu - 1 */
    for (int slot = 0; slot < 2; slot++) {
        for (int s = 0; s < 4; s++) {
            assert_true(real_multipliers[slot][s] <= 2 * engine_engram_mult_bound(99092) - 1);
        }
    }
}

static void test_random_multipliers_follow_section_9_2(void **state)
{
    /* 2*(splitmix64(10007*l + s) mod b_mu) + 1 for l = 1, 2, b_mu(520); computed in Python. */
    static const int64_t want[8] = {15699571756726735, 12420980672117125, 7079507322341493,
                                    16652718082581653, 10371420480774297, 530056828854109,
                                    7659304891349929,  2376173413489605};
    engine_config_t cfg;
    int64_t mult[8];
    (void)state;

    preset("tiny", &cfg);
    engine_engram_random_multipliers(&cfg, mult);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(mult[i], want[i]);
        assert_int_equal(mult[i] % 2, 1);
        assert_true(mult[i] >= 1 && mult[i] <= 2 * engine_engram_mult_bound(520) - 1);
    }
}

static void test_random_token_map_pairs_ids_above_16(void **state)
{
    engine_config_t tiny;
    engine_config_t small;
    int32_t map[1024];
    int32_t max = 0;
    (void)state;

    preset("tiny", &tiny);
    preset("small", &small);
    assert_int_equal(engine_engram_random_vocab(1024), tiny.engram_compressed_vocab_size);
    assert_int_equal(engine_engram_random_vocab(32768), small.engram_compressed_vocab_size);
    assert_int_equal(engine_engram_random_vocab(1023), 520);
    assert_int_equal(engine_engram_random_vocab(10), 10);
    engine_engram_random_token_map(1024, map);
    assert_int_equal(map[0], 0);
    assert_int_equal(map[15], 15);
    assert_int_equal(map[16], 16);
    assert_int_equal(map[17], 16);
    assert_int_equal(map[18], 17);
    assert_int_equal(map[1023], 519);
    for (int i = 0; i < 1024; i++) {
        max = map[i] > max ? map[i] : max;
    }
    assert_int_equal(max, 519);
}

/* ---- hashed rows ------------------------------------------------------------------------- */

static void test_window_ids_pad_before_the_sequence(void **state)
{
    engine_config_t cfg;
    int32_t map[1024];
    const int32_t tokens[3] = {5, 100, 201};
    int64_t ids[4];
    (void)state;

    preset("tiny", &cfg);
    engine_engram_random_token_map(1024, map);
    engine_engram_window_ids(&cfg, map, tokens, 0, ids);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 2); /* token_map[engram_pad_token_id = 2] */
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], 2);
    engine_engram_window_ids(&cfg, map, tokens, 2, ids);
    assert_int_equal(ids[0], 108); /* 16 + (201-16)/2 */
    assert_int_equal(ids[1], 58);  /* 16 + (100-16)/2 */
    assert_int_equal(ids[2], 5);
    assert_int_equal(ids[3], 2);
}

static void test_hash_rows_by_hand_on_tiny(void **state)
{
    engine_config_t cfg;
    engine_engram_layout_t layout;
    const int64_t mult[4] = {1, 3, 5, 7};
    const int64_t ids[4] = {3, 5, 0, 0};
    int64_t rows[6];
    (void)state;

    preset("tiny", &cfg);
    layout_of(&cfg, &layout);
    /* h0 = 3, h1 = 3 ^ 15 = 12, h2 = h3 = 12; row = 12 + offset of the column */
    engine_engram_hash_rows(&layout, 0, mult, ids, rows);
    assert_int_equal(rows[0], 12);
    assert_int_equal(rows[1], 12 + 1009);
    assert_int_equal(rows[2], 12 + 1009 + 1013);
    assert_int_equal(rows[5], 12 + 6126 - 1033);
    engine_engram_hash_rows(&layout, 1, mult, ids, rows);
    assert_int_equal(rows[0], 12);
    assert_int_equal(rows[5], 12 + 6332 - 1069);
}

static void test_hash_rows_full_model_match_python(void **state)
{
    engine_config_t cfg;
    engine_engram_layout_t layout;
    const int64_t ids[4] = {12345, 678, 99091, 2};
    int64_t rows[24];
    (void)state;

    preset("full", &cfg);
    layout_of(&cfg, &layout);
    engine_engram_hash_rows(&layout, 0, real_multipliers[0], ids, rows);
    assert_int_equal(rows[0], 12168815);
    assert_int_equal(rows[7], 113940121);
    assert_int_equal(rows[8], 132691671);
    assert_int_equal(rows[23], 371357883);
    for (int col = 0; col < 24; col++) {
        assert_true(rows[col] >= layout.offsets[0][col]);
        assert_true(rows[col] < layout.offsets[0][col] + layout.primes[0][col]);
    }
}

/* ---- sidecar checks ---------------------------------------------------------------------- */

typedef struct {
    engine_config_t cfg;
    engine_engram_layout_t layout;
    int32_t token_map[1024];
    int64_t mult[2 * 4];
    int64_t primes[2 * 6];
    int64_t offsets[2 * 6];
} tiny_sidecar_t;

static void tiny_sidecar(tiny_sidecar_t *s)
{
    preset("tiny", &s->cfg);
    layout_of(&s->cfg, &s->layout);
    engine_engram_random_token_map(1024, s->token_map);
    engine_engram_random_multipliers(&s->cfg, s->mult);
    for (int slot = 0; slot < 2; slot++) {
        for (int col = 0; col < 6; col++) {
            s->primes[slot * 6 + col] = s->layout.primes[slot][col];
            s->offsets[slot * 6 + col] = s->layout.offsets[slot][col];
        }
    }
}

static tdm_status_t check_tiny(const tiny_sidecar_t *s, int64_t n_vocab, char *err)
{
    return engine_engram_sidecar_check(&s->cfg, s->token_map, n_vocab, s->mult, s->primes,
                                       s->offsets, err, ERR_BYTES);
}

static void expect_refusal(tiny_sidecar_t *s, int64_t n_vocab, const char *message)
{
    char err[ERR_BYTES] = "";
    tdm_status_t status = check_tiny(s, n_vocab, err);

    if (status != TDM_ERR_MISMATCH || strstr(err, message) == NULL) {
        fail_msg("got %s \"%s\", want TDM_ERR_MISMATCH \"%s\"", tdm_status_name(status), err,
                 message);
    }
    tiny_sidecar(s);
}

static void test_sidecar_check_accepts_a_matching_sidecar(void **state)
{
    tiny_sidecar_t s;
    engine_config_t full;
    int32_t *map;
    int64_t primes[48];
    int64_t offsets[48];
    engine_engram_layout_t layout;
    char err[ERR_BYTES] = "";
    (void)state;

    tiny_sidecar(&s);
    assert_int_equal(check_tiny(&s, 1024, err), TDM_OK);

    /* the full model with the real checkpoint's multipliers */
    preset("full", &full);
    layout_of(&full, &layout);
    map = calloc((size_t)full.vocab_size, sizeof(*map));
    assert_non_null(map);
    map[129279] = 99091;
    for (int slot = 0; slot < 2; slot++) {
        for (int col = 0; col < 24; col++) {
            primes[slot * 24 + col] = layout.primes[slot][col];
            offsets[slot * 24 + col] = layout.offsets[slot][col];
        }
    }
    assert_int_equal(engine_engram_sidecar_check(&full, map, full.vocab_size,
                                                 &real_multipliers[0][0], primes, offsets, err,
                                                 sizeof(err)),
                     TDM_OK);
    free(map);
}

static void test_sidecar_check_refuses_each_mismatch(void **state)
{
    tiny_sidecar_t s;
    char err[ERR_BYTES] = "";
    (void)state;

    tiny_sidecar(&s);
    s.primes[6 + 3] += 2;
    expect_refusal(&s, 1024, "engram sidecar: primes[1][3]: 1063 but the config gives 1061");
    s.offsets[2] = 0;
    expect_refusal(&s, 1024, "offsets[0][2]: 0 but the config gives 2022");
    s.token_map[17] = 520;
    expect_refusal(&s, 1024, "token_map[17]: 520 not in [0, 520)");
    s.token_map[3] = -1;
    expect_refusal(&s, 1024, "token_map[3]: -1 not in [0, 520)");
    expect_refusal(&s, 1000, "token_map: 1000 entries, vocab_size is 1024");
    s.mult[5] = 1000;
    expect_refusal(&s, 1024, "multipliers[1][1]: 1000 is even");
    s.mult[2] = 2 * engine_engram_mult_bound(520) + 1;
    expect_refusal(&s, 1024, "multipliers[0][2]: 17737253917028415 not in [1, 2*b_mu-1");
    s.mult[0] = 0;
    expect_refusal(&s, 1024, "multipliers[0][0]: 0 not in");
    s.mult[0] = -3;
    expect_refusal(&s, 1024, "multipliers[0][0]: -3 not in");
    assert_int_equal(engine_engram_sidecar_check(&s.cfg, NULL, 1024, s.mult, s.primes, s.offsets,
                                                 err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
}

/* ---- sidecar file ------------------------------------------------------------------------ */

/* Writes dir/engram-hash.safetensors from *s; `skip` names a tensor to leave out. */
static void write_sidecar(const char *dir, const tiny_sidecar_t *s, const char *vocab_text,
                          const char *skip, int64_t n_map)
{
    char path[1200];
    engine_st_writer_t *writer = NULL;
    const int64_t map_shape[1] = {n_map};
    const int64_t mult_shape[2] = {2, 4};
    const int64_t table_shape[2] = {2, 6};

    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/%s", dir, ENGINE_ENGRAM_SIDECAR_FILE);
    assert_int_equal(engine_st_writer_create(path, &writer), TDM_OK);
    if (strcmp(skip, "token_map") != 0) {
        assert_int_equal(engine_st_writer_add(writer, "token_map", ENGINE_DTYPE_I32, 1, map_shape,
                                              s->token_map, (size_t)n_map * sizeof(int32_t)),
                         TDM_OK);
    }
    assert_int_equal(engine_st_writer_add(writer, "multipliers", ENGINE_DTYPE_I64, 2, mult_shape,
                                          s->mult, sizeof(s->mult)),
                     TDM_OK);
    assert_int_equal(engine_st_writer_add(writer, "primes", ENGINE_DTYPE_I64, 2, table_shape,
                                          s->primes, sizeof(s->primes)),
                     TDM_OK);
    assert_int_equal(engine_st_writer_add(writer, "offsets", ENGINE_DTYPE_I64, 2, table_shape,
                                          s->offsets, sizeof(s->offsets)),
                     TDM_OK);
    if (vocab_text != NULL) {
        assert_int_equal(engine_st_writer_set_metadata(writer, "compressed_vocab_size", vocab_text),
                         TDM_OK);
    }
    assert_int_equal(engine_st_writer_set_metadata(writer, "origin", "random"), TDM_OK);
    assert_int_equal(engine_st_writer_finish(writer), TDM_OK);
    engine_st_writer_destroy(writer);
}

static void test_sidecar_load_reads_and_checks_the_file(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[1024];
    tiny_sidecar_t s;
    engine_engram_sidecar_t sidecar;
    engine_engram_sidecar_t before;
    char err[ERR_BYTES] = "";
    (void)state;

    assert_non_null(tmp);
    snprintf(dir, sizeof(dir), "%s/test_engram_hash", tmp);
    tiny_sidecar(&s);
    write_sidecar(dir, &s, "520", "", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)), TDM_OK);
    assert_int_equal(sidecar.n_vocab, 1024);
    assert_int_equal(sidecar.n_layers, 2);
    assert_int_equal(sidecar.ngram, 4);
    assert_int_equal(sidecar.n_cols, 6);
    assert_int_equal(sidecar.compressed_vocab_size, 520);
    assert_string_equal(sidecar.origin, "random");
    assert_string_equal(sidecar.tokenizer_sha256, "");
    assert_memory_equal(sidecar.token_map, s.token_map, sizeof(s.token_map));
    assert_memory_equal(sidecar.multipliers, s.mult, sizeof(s.mult));
    assert_memory_equal(sidecar.primes, s.primes, sizeof(s.primes));
    engine_engram_sidecar_fini(&sidecar);
    engine_engram_sidecar_fini(&sidecar); /* a zeroed struct is fine */
    engine_engram_sidecar_fini(NULL);

    memset(&before, 0x77, sizeof(before));
    sidecar = before;
    write_sidecar(dir, &s, "521", "", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_MISMATCH);
    assert_non_null(strstr(err, "metadata compressed_vocab_size: 521 not in [1, 520]"));
    write_sidecar(dir, &s, "52x", "", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "\"52x\" is not an integer"));
    write_sidecar(dir, &s, NULL, "", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "compressed_vocab_size: missing"));
    write_sidecar(dir, &s, "520", "token_map", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    assert_non_null(strstr(err, "tensor token_map: missing"));
    write_sidecar(dir, &s, "520", "", 1000);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_MISMATCH);
    assert_non_null(strstr(err, "tensor token_map: shape [1000], expected [1024]"));
    s.mult[1] = 4;
    write_sidecar(dir, &s, "520", "", 1024);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_MISMATCH);
    assert_non_null(strstr(err, "multipliers[0][1]: 4 is even"));
    assert_memory_equal(&sidecar, &before, sizeof(sidecar));

    snprintf(dir, sizeof(dir), "%s/test_engram_hash_none", tmp);
    mkdir(dir, 0755);
    assert_int_equal(engine_engram_sidecar_load(dir, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_int_equal(engine_engram_sidecar_load(NULL, &s.cfg, &sidecar, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_memory_equal(&sidecar, &before, sizeof(sidecar));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prime_after_finds_the_next_prime),
        cmocka_unit_test(test_full_model_primes_per_layer),
        cmocka_unit_test(test_tiny_and_small_prime_sums_match_section_9),
        cmocka_unit_test(test_layout_rejects_configs_beyond_limits),
        cmocka_unit_test(test_mult_bound),
        cmocka_unit_test(test_random_multipliers_follow_section_9_2),
        cmocka_unit_test(test_random_token_map_pairs_ids_above_16),
        cmocka_unit_test(test_window_ids_pad_before_the_sequence),
        cmocka_unit_test(test_hash_rows_by_hand_on_tiny),
        cmocka_unit_test(test_hash_rows_full_model_match_python),
        cmocka_unit_test(test_sidecar_check_accepts_a_matching_sidecar),
        cmocka_unit_test(test_sidecar_check_refuses_each_mismatch),
        cmocka_unit_test(test_sidecar_load_reads_and_checks_the_file),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
