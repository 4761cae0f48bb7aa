/* test_constrain_spec.c - constrained decoding on the tiny random-weight model: a JSON schema's
 * mask applied before sampling, with speculative decoding on. Checks that (1) every completion,
 * plain or speculative (DSpark, n-gram, and external drafts that are deliberately outside the
 * language), ends with EOS after a text that jansson parses and that satisfies the schema;
 * (2) speculative decoding under the constraint emits exactly the tokens of plain constrained
 * decoding (coupled acceptance, greedy and seeded), so a draft the constraint refuses is never
 * emitted; (3) the drafts outside the language were verified and refused. */
#include "forward_test_util.h"

#include <jansson.h>

#include "engine/constrain.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "text/tokenizer.h"

#define POOL_PAGES 256
#define MAX_GEN    400
#define PROMPT_LEN 24

/* Bounded by construction (no free string, number or array): every walk ends. */
static const char *const RF =
    "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"strict\":true,\"schema\":{"
    "\"type\":\"object\",\"properties\":{"
    "\"kind\":{\"enum\":[\"alpha\",\"beta\",\"gamma\"]},\"ok\":{\"type\":\"boolean\"},"
    "\"none\":{\"type\":\"null\"},\"pick\":{\"anyOf\":[{\"const\":1},{\"type\":\"boolean\"}]},"
    "\"sub\":{\"type\":\"object\",\"properties\":{\"x\":{\"enum\":[\"p\",\"q\"]}},"
    "\"required\":[\"x\"],\"additionalProperties\":false}},"
    "\"required\":[\"kind\",\"ok\",\"none\",\"pick\",\"sub\"],\"additionalProperties\":false}}}";

/* A forced tool call (tool_choice "required"): two tools with bounded parameters. */
static const char *const TOOLS =
    "{\"thinking\":false,\"parallel\":false,\"tools\":["
    "{\"name\":\"set_mode\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"unit\",\"ok\"]}},{\"name\":\"ping\"}]}";

/* clang-format off */
#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
/* clang-format on */

typedef struct {
    ftu_engine_t e;
    text_tokenizer_t *tok;
    engine_constrain_vocab_t *vocab;
    int32_t eos;
} fixture_t;

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    char dir[FTU_PATH_BYTES];
    char path[FTU_PATH_BYTES + 32];
    char err[256];

    if (fx == NULL || ftu_engine_open(&fx->e, POOL_PAGES) != 0 ||
        ftu_make_model("tiny", 1, "fwd-tiny", dir) != 0) {
        return -1;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (text_tokenizer_load_hf(path, &fx->tok, err, sizeof(err)) != TDM_OK ||
        engine_constrain_vocab_from_tokenizer(fx->tok, fx->e.V, &fx->vocab) != TDM_OK ||
        tdm_arena_init(&fx->e.arena, engine_sampler_scratch_bytes(fx->e.V) + 4096) != TDM_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    fx->eos = (int32_t)fx->e.cfg->eos_token_id;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok;

    if (fx == NULL) {
        return -1;
    }
    ok = ftu_engine_close(&fx->e) == 0;

    engine_constrain_vocab_destroy(fx->vocab);
    text_tokenizer_destroy(fx->tok);
    free(fx);
    return ok ? 0 : -1;
}

typedef struct {
    int32_t tokens[MAX_GEN];
    int n;
    uint64_t verified;
    uint64_t accepted;
} gen_t;

static void params_for(engine_sampler_params_t *sp, int greedy, int32_t eos, uint64_t seed)
{
    engine_sampler_params_default(sp);
    sp->temperature = greedy ? 0.0 : 1.0;
    sp->seed = seed;
    sp->n_stop_ids = 1;
    sp->stop_ids[0] = eos;
}

/*
 * One constrained completion. drafter OFF with plain: engine_fwd_decode + mask + sample, as the
 * decode node's plain path; else engine_spec_step with the constraint. EXTERNAL drafts: the
 * reference completion `ref` with every third draft replaced by a token the constraint refuses
 * there (EOS before the end, the byte token of '}' after it).
 */
static void generate(fixture_t *fx, engine_spec_drafter_t drafter, int plain, int greedy,
                     uint64_t seed, int tools, const gen_t *ref, gen_t *out)
{
    ftu_engine_t *e = &fx->e;
    engine_sampler_params_t sp;
    engine_constraint_t *c = NULL;
    engine_spec_params_t pp;
    engine_spec_t *spec = NULL;
    engine_seq_t *seq = ftu_new_seq(e);
    int32_t hist[PROMPT_LEN + MAX_GEN + 1];
    int64_t n_hist = PROMPT_LEN;
    float *logits = malloc(sizeof(float) * (size_t)e->V);
    engine_sample_t s;
    int32_t ext[ENGINE_SPEC_MAX_DRAFTS];

    assert_non_null(logits);
    memset(out, 0, sizeof(*out));
    params_for(&sp, greedy, fx->eos, seed);
    assert_int_equal(engine_constraint_create_request(fx->vocab, tools ? "" : RF,
                                                      tools ? TOOLS : "", sp.stop_ids,
                                                      sp.n_stop_ids, &c, NULL, 0),
                     TDM_OK);
    engine_spec_params_default(e->model, &pp);
    pp.max_batch = 1;
    assert_int_equal(engine_spec_create(e->fwd, &pp, &spec), TDM_OK);
    ftu_prompt(seed + 77, e->V, hist, PROMPT_LEN);
    assert_int_equal(engine_fwd_prefill(e->fwd, seq, hist, n_hist, 0, logits, NULL), TDM_OK);
    assert_int_equal(engine_constraint_apply(c, logits, e->V), TDM_OK);
    assert_int_equal(engine_sampler_sample(&sp, logits, e->V, n_hist, &e->arena, &s), TDM_OK);
    assert_int_equal(engine_constraint_advance(c, s.token), TDM_OK);
    out->tokens[out->n++] = s.token;
    hist[n_hist++] = s.token;
    while (!engine_constraint_finished(c) && out->n < MAX_GEN) {
        if (plain) {
            int32_t anchor = hist[n_hist - 1];

            assert_int_equal(engine_fwd_decode(e->fwd, &seq, &anchor, 1, logits), TDM_OK);
            assert_int_equal(engine_constraint_apply(c, logits, e->V), TDM_OK);
            assert_int_equal(engine_sampler_sample(&sp, logits, e->V, n_hist, &e->arena, &s),
                             TDM_OK);
            assert_int_equal(engine_constraint_advance(c, s.token), TDM_OK);
            out->tokens[out->n++] = s.token;
            hist[n_hist++] = s.token;
        } else {
            engine_spec_req_t r;
            engine_spec_result_t res;

            memset(&r, 0, sizeof(r));
            r.seq = seq;
            r.anchor = hist[n_hist - 1];
            r.drafter = drafter;
            r.sampling = &sp;
            r.history = hist;
            r.n_history = n_hist;
            r.max_emit = MAX_GEN - out->n;
            r.constraint = c;
            if (drafter == ENGINE_SPEC_EXTERNAL) {
                int k = 0;

                for (int j = out->n; j < ref->n && k < ENGINE_SPEC_MAX_DRAFTS; j++, k++) {
                    int32_t refused = ref->tokens[j] == fx->eos ? 3 + '}' : fx->eos;

                    ext[k] = j % 3 == 2 ? refused : ref->tokens[j];
                }
                r.ext_drafts = ext;
                r.n_ext_drafts = k;
            }
            assert_int_equal(engine_spec_step(spec, &r, 1, &res), TDM_OK);
            for (int k = 0; k < res.n_emitted; k++) {
                /* every emitted token is one the constraint allows at its place */
                assert_int_equal(engine_constraint_advance(c, res.samples[k].token), TDM_OK);
                out->tokens[out->n++] = res.samples[k].token;
                hist[n_hist++] = res.samples[k].token;
            }
            out->verified += (uint64_t)res.n_verified;
            out->accepted += (uint64_t)res.n_accepted;
        }
    }
    assert_true(engine_constraint_finished(c));
    assert_int_equal(out->tokens[out->n - 1], fx->eos);
    assert_int_equal(engine_seq_length(seq), n_hist - 1);
    engine_seq_destroy(seq);
    engine_spec_destroy(spec);
    engine_constraint_destroy(c);
    free(logits);
}

/* The completion's bytes, EOS dropped (NUL-terminated into text). */
static size_t completion_text(const fixture_t *fx, const gen_t *g, char *text, size_t cap)
{
    size_t n = 0;

    for (int i = 0; i < g->n - 1; i++) {
        const uint8_t *b;
        size_t len;

        assert_int_equal(text_tokenizer_token_bytes(fx->tok, g->tokens[i], &b, &len), TDM_OK);
        assert_true(n + len < cap);
        memcpy(text + n, b, len);
        n += len;
    }
    text[n] = '\0';
    return n;
}

/* The completion is one DSML block calling set_mode (unit c|f raw or JSON, ok true|false) or
 * ping (no parameters), as encoding_dsv4.py writes it. */
static void check_tool_call(const fixture_t *fx, const gen_t *g)
{
    /* clang-format off */
    static const char open_mode[] =
        "\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"set_mode\">\n";
    static const char ping[] = "\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"ping\">\n\n</" DSML
                               "invoke>\n</" DSML "tool_calls>";
    /* clang-format on */
    static const char close[] = "\n</" DSML "invoke>\n</" DSML "tool_calls>";
    char text[MAX_GEN * 64];
    size_t n = completion_text(fx, g, text, sizeof(text));

    print_message("tool call: %s\n", text);
    if (strcmp(text, ping) == 0) {
        return;
    }
    assert_true(n > sizeof(open_mode) + sizeof(close));
    assert_memory_equal(text, open_mode, sizeof(open_mode) - 1);
    assert_string_equal(text + n - (sizeof(close) - 1), close);
    assert_true(strstr(text, "name=\"unit\" string=\"true\">c<") != NULL ||
                strstr(text, "name=\"unit\" string=\"true\">f<") != NULL ||
                strstr(text, "name=\"unit\" string=\"false\">\"c\"<") != NULL ||
                strstr(text, "name=\"unit\" string=\"false\">\"f\"<") != NULL);
    assert_true(strstr(text, "name=\"ok\" string=\"false\">true<") != NULL ||
                strstr(text, "name=\"ok\" string=\"false\">false<") != NULL);
}

/* The completion's bytes (EOS dropped) parse and satisfy the schema. */
static void check_valid(const fixture_t *fx, const gen_t *g)
{
    char text[MAX_GEN * 64];
    size_t n = completion_text(fx, g, text, sizeof(text));
    json_error_t jerr;
    json_t *root;
    const char *kind;
    json_t *pick;

    root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        print_message("not JSON (%s): %s\n", jerr.text, text);
        fail();
    }
    assert_true(json_is_object(root));
    assert_int_equal(json_object_size(root), 5);
    kind = json_string_value(json_object_get(root, "kind"));
    assert_non_null(kind);
    assert_true(strcmp(kind, "alpha") == 0 || strcmp(kind, "beta") == 0 ||
                strcmp(kind, "gamma") == 0);
    assert_true(json_is_boolean(json_object_get(root, "ok")));
    assert_true(json_is_null(json_object_get(root, "none")));
    pick = json_object_get(root, "pick");
    assert_true(json_is_boolean(pick) || (json_is_integer(pick) && json_integer_value(pick) == 1));
    assert_true(json_is_object(json_object_get(root, "sub")));
    assert_int_equal(json_object_size(json_object_get(root, "sub")), 1);
    assert_non_null(json_string_value(json_object_get(json_object_get(root, "sub"), "x")));
    json_decref(root);
}

static void run_all(fixture_t *fx, int greedy, uint64_t seed, int tools)
{
    gen_t ref;
    gen_t got;
    static const engine_spec_drafter_t drafters[] = {ENGINE_SPEC_OFF, ENGINE_SPEC_DSPARK,
                                                     ENGINE_SPEC_NGRAM, ENGINE_SPEC_EXTERNAL};

    generate(fx, ENGINE_SPEC_OFF, 1, greedy, seed, tools, NULL, &ref);
    if (tools) {
        check_tool_call(fx, &ref);
    } else {
        check_valid(fx, &ref);
    }
    print_message("%s seed %llu: %d tokens\n", greedy ? "greedy" : "seeded",
                  (unsigned long long)seed, ref.n);
    for (size_t d = 0; d < sizeof(drafters) / sizeof(drafters[0]); d++) {
        if (drafters[d] == ENGINE_SPEC_DSPARK && fx->e.cfg->n_blocks == 0) {
            continue;
        }
        generate(fx, drafters[d], 0, greedy, seed, tools, &ref, &got);
        assert_int_equal(got.n, ref.n);
        assert_memory_equal(got.tokens, ref.tokens, (size_t)ref.n * sizeof(int32_t));
        if (drafters[d] == ENGINE_SPEC_EXTERNAL) {
            /* the drafts were verified: those of the reference kept, the refused ones not */
            assert_true(got.accepted > 0);
            assert_true(got.accepted < got.verified);
        }
        print_message("  drafter %s: verified %llu accepted %llu\n",
                      engine_spec_drafter_name(drafters[d]), (unsigned long long)got.verified,
                      (unsigned long long)got.accepted);
    }
}

static void test_constrained_greedy_valid_and_spec_identical(void **state)
{
    run_all(*state, 1, 11, 0);
}

static void test_constrained_seeded_valid_and_spec_identical(void **state)
{
    run_all(*state, 0, 12, 0);
    run_all(*state, 0, 13, 0);
}

static void test_forced_tool_call_well_formed_and_spec_identical(void **state)
{
    run_all(*state, 1, 21, 1);
    run_all(*state, 0, 22, 1);
    run_all(*state, 0, 23, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constrained_greedy_valid_and_spec_identical),
        cmocka_unit_test(test_constrained_seeded_valid_and_spec_identical),
        cmocka_unit_test(test_forced_tool_call_well_formed_and_spec_identical),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
