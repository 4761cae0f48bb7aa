/* test_router_output.c - one response's output (router/output.h): token ids in, OpenAI chunks and
 * whole bodies out, for plain and agent chat requests (reasoning_content, tool_calls). The
 * synthetic tokenizer has byte b at id 3 + b, so a text is fed one byte per token (multi-byte
 * characters and DSML markers split across tokens); chunks are drained after every token or
 * every few, and the streamed pieces must add up to the whole body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "router/openai.h"
#include "router/output.h"
#include "router/validate.h"
#include "text/tokenizer.h"

#define VOCAB      1024
#define BYTE_ID(b) ((int32_t)(3 + (unsigned char)(b)))
#define EOS_ID     1

#define DSML                                                                                       \
    "\xEF\xBD\x9C"                                                                                 \
    "DSML"                                                                                         \
    "\xEF\xBD\x9C"
#define BLOCK     "<" DSML "tool_calls>"
#define BLOCK_E   "</" DSML "tool_calls>"
#define INV(n)    "<" DSML "invoke name=\"" n "\">"
#define INV_E     "</" DSML "invoke>"
#define PAR(n, s) "<" DSML "parameter name=\"" n "\" string=\"" s "\">"
#define PAR_E     "</" DSML "parameter>"

#define CALLS_TEXT                                                                                 \
    "\n\n" BLOCK "\n" INV("get_weather") "\n" PAR("city", "true") "Par\xC3\xADs" PAR_E "\n" PAR(   \
        "days", "false") "2" PAR_E "\n" INV_E "\n" INV("ls") "\n" INV_E "\n" BLOCK_E

static const char TOOLS_JSON[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]";

#define DSML_TOKEN                                                                                 \
    "\xEF\xBD\x9C"                                                                                 \
    "DSML"                                                                                         \
    "\xEF\xBD\x9C"

/* The synthetic tokenizer; "｜DSML｜" is a special (CONTROL) token there, as in DeepSeek's
 * vocabulary. */
static int setup_tokenizer(void **state)
{
    text_tokenizer_t *tok = NULL;
    char *json = NULL;
    size_t n = 0;
    int32_t id;

    if (text_tokenizer_synthetic_hf_text(VOCAB, &json, &n, NULL, 0) != TDM_OK) {
        return -1;
    }
    if (text_tokenizer_load_hf_buffer(json, n, "synthetic", &tok, NULL, 0) != TDM_OK) {
        free(json);
        return -1;
    }
    free(json);
    if (text_tokenizer_find_special(tok, DSML_TOKEN, &id) != TDM_OK) {
        print_message("the synthetic vocabulary has no special token for DSML\n");
        text_tokenizer_destroy(tok);
        return -1;
    }
    *state = tok;
    return 0;
}

static int teardown_tokenizer(void **state)
{
    text_tokenizer_destroy(*state);
    return 0;
}

/* A chat request: max_tokens 4096, no stop strings, logprobs off. */
static void chat_request(router_gen_request_t *gen, int thinking, int tools)
{
    memset(gen, 0, sizeof(*gen));
    gen->api = ROUTER_API_CHAT;
    gen->max_tokens = 4096;
    gen->n_logprobs = -1;
    gen->thinking = thinking;
    if (tools) {
        gen->tools_json = (char *)TOOLS_JSON; /* borrowed: the test never finis the request */
        gen->n_tools = 1;
    }
    gen->n_choices = 1;
}

static void collect(void *ctx, char *json)
{
    json_t *chunks = ctx;
    json_t *chunk = json_loads(json, 0, NULL);

    assert_non_null(chunk);
    json_array_append_new(chunks, chunk);
    free(json);
}

/* What a run produced. */
typedef struct {
    json_t *chunks; /* parsed streaming chunks, final one included */
    json_t *body;   /* parsed whole response */
    char finish[16];
} run_t;

/* Feed ids[0, n_ids) as choice `index`, draining after every `drain_every` tokens. */
static void run_ids(const text_tokenizer_t *tok, const router_gen_request_t *gen, uint32_t index,
                    const int32_t *ids, size_t n_ids, size_t drain_every, run_t *r)
{
    router_openai_ctx_t octx = {gen->api, "chatcmpl-test", "tandem-test", 0};
    router_output_params_t params = {.tok = tok,
                                     .gen = gen,
                                     .octx = &octx,
                                     .stop_id = EOS_ID,
                                     .index = index,
                                     .call_id_seed = 7};
    router_openai_usage_t usage = {10, 0, 0};
    router_openai_choice_t choice;
    router_output_t *out = NULL;
    char *json;

    memset(r, 0, sizeof(*r));
    r->chunks = json_array();
    assert_int_equal(router_output_create(&params, &out), TDM_OK);
    for (size_t i = 0; i < n_ids && router_output_state(out) == ROUTER_STREAM_RUNNING; i++) {
        json_t *lp = NULL;
        int32_t id = ids[i];
        if (gen->n_logprobs >= 0) {
            lp = router_openai_logprob_entry(gen->api, tok, id, -0.5f, NULL, NULL, 0);
        }
        assert_int_equal(router_output_push(out, id, lp), TDM_OK);
        if ((i + 1) % drain_every == 0) {
            assert_int_equal(router_output_drain(out, collect, r->chunks), TDM_OK);
        }
    }
    assert_int_equal(router_output_finish(out, ROUTER_STREAM_LENGTH), TDM_OK);
    assert_int_equal(router_output_drain(out, collect, r->chunks), TDM_OK);
    json = router_output_final_chunk(out);
    assert_non_null(json);
    collect(r->chunks, json);
    snprintf(r->finish, sizeof(r->finish), "%s", router_output_finish_reason(out));
    assert_int_equal(router_output_choice(out, &choice), TDM_OK);
    usage.completion_tokens = router_output_n_tokens(out);
    json = router_openai_response(&octx, &choice, 1, &usage);
    assert_non_null(json);
    r->body = json_loads(json, 0, NULL);
    assert_non_null(r->body);
    free(json);
    router_output_destroy(out);
}

/* Token ids of text: "｜DSML｜" as the special token when dsml_id >= 0, every other byte as its
 * byte token; then EOS when eos. Returns the count. */
static size_t text_ids(const char *text, int32_t dsml_id, int eos, int32_t *ids, size_t cap)
{
    size_t n = 0;
    size_t n_dsml = strlen(DSML_TOKEN);

    for (size_t i = 0; text[i] != '\0';) {
        assert_true(n < cap);
        if (dsml_id >= 0 && strncmp(text + i, DSML_TOKEN, n_dsml) == 0) {
            ids[n++] = dsml_id;
            i += n_dsml;
        } else {
            ids[n++] = BYTE_ID(text[i++]);
        }
    }
    if (eos) {
        assert_true(n < cap);
        ids[n++] = EOS_ID;
    }
    return n;
}

/* Feed text byte by byte (then EOS when eos), draining after every `drain_every` tokens. */
static void run_text(const text_tokenizer_t *tok, const router_gen_request_t *gen, const char *text,
                     int eos, size_t drain_every, run_t *r)
{
    int32_t *ids = malloc((strlen(text) + 1) * sizeof(*ids));

    assert_non_null(ids);
    run_ids(tok, gen, 0, ids, text_ids(text, -1, eos, ids, strlen(text) + 1), drain_every, r);
    free(ids);
}

static void run_fini(run_t *r)
{
    json_decref(r->chunks);
    json_decref(r->body);
}

/* The streamed chunks folded back into a message like the whole body's. */
typedef struct {
    char reasoning[4096];
    char content[4096];
    int has_reasoning;
    int n_calls;
    char ids[4][64];
    char names[4][64];
    char args[4][512];
    char finish[16];
    size_t n_logprobs;
} folded_t;

static void cat(char *dst, size_t cap, const char *src)
{
    assert_true(strlen(dst) + strlen(src) < cap);
    strcat(dst, src);
}

/* markup_is_text: DSML may appear in the content (plain requests, unfinished calls). */
static void fold_chunks(const json_t *chunks, int markup_is_text, folded_t *f)
{
    size_t i;
    json_t *chunk;

    memset(f, 0, sizeof(*f));
    json_array_foreach(chunks, i, chunk)
    {
        json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        json_t *calls = json_object_get(delta, "tool_calls");
        json_t *value;
        json_t *lp = json_object_get(json_object_get(choice, "logprobs"), "content");
        size_t k;
        json_t *call;

        assert_string_equal(json_string_value(json_object_get(chunk, "object")),
                            "chat.completion.chunk");
        f->n_logprobs += json_array_size(lp);
        if ((value = json_object_get(delta, "reasoning_content")) != NULL) {
            f->has_reasoning = 1;
            cat(f->reasoning, sizeof(f->reasoning), json_string_value(value));
        }
        if ((value = json_object_get(delta, "content")) != NULL) {
            cat(f->content, sizeof(f->content), json_string_value(value));
        }
        /* one kind of delta per chunk */
        assert_true(json_object_size(delta) <= 1);
        json_array_foreach(calls, k, call)
        {
            int index = (int)json_integer_value(json_object_get(call, "index"));
            json_t *fn = json_object_get(call, "function");
            json_t *id = json_object_get(call, "id");
            assert_true(json_is_integer(json_object_get(call, "index")));
            if (index == f->n_calls) { /* the first chunk of a call: id, type, name, "" */
                assert_true(json_is_string(id));
                assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
                assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
                snprintf(f->ids[index], sizeof(f->ids[0]), "%s", json_string_value(id));
                snprintf(f->names[index], sizeof(f->names[0]), "%s",
                         json_string_value(json_object_get(fn, "name")));
                f->n_calls++;
            } else { /* then only argument fragments of the latest call */
                assert_int_equal(index, f->n_calls - 1);
                assert_null(id);
                assert_null(json_object_get(fn, "name"));
                cat(f->args[index], sizeof(f->args[0]),
                    json_string_value(json_object_get(fn, "arguments")));
            }
        }
        if ((value = json_object_get(choice, "finish_reason")) != NULL && json_is_string(value)) {
            assert_int_equal(i, json_array_size(chunks) - 1); /* only the last chunk */
            snprintf(f->finish, sizeof(f->finish), "%s", json_string_value(value));
        }
    }
    if (!markup_is_text) {
        assert_null(strstr(f->content, "\xEF\xBD\x9C"
                                       "DSML"));
        assert_null(strstr(f->content, "</think>"));
    }
}

static const json_t *body_message(const run_t *r)
{
    json_t *choice = json_array_get(json_object_get(r->body, "choices"), 0);

    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), r->finish);
    return json_object_get(choice, "message");
}

static void test_thinking_and_tool_calls_stream_and_whole_agree(void **state)
{
    static const char text[] = "Plan: look it up \xE2\x80\x94 twice.</think>Checking." CALLS_TEXT;
    static const size_t drains[] = {1, 2, 5, 64, 100000};
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    folded_t f;
    run_t r;

    chat_request(&gen, 1, 1);
    for (size_t d = 0; d < sizeof(drains) / sizeof(drains[0]); d++) {
        const json_t *msg;
        const json_t *calls;
        json_t *args;

        run_text(tok, &gen, text, 1, drains[d], &r);
        fold_chunks(r.chunks, 0, &f);
        assert_string_equal(r.finish, "tool_calls");
        assert_string_equal(f.finish, "tool_calls");
        assert_string_equal(f.reasoning, "Plan: look it up \xE2\x80\x94 twice.");
        assert_string_equal(f.content, "Checking.");
        assert_int_equal(f.n_calls, 2);
        assert_string_equal(f.names[0], "get_weather");
        assert_string_equal(f.args[0], "{\"city\": \"Par\xC3\xADs\", \"days\": 2}");
        assert_string_equal(f.names[1], "ls");
        assert_string_equal(f.args[1], "{}");
        assert_string_not_equal(f.ids[0], f.ids[1]);
        /* the whole body says the same */
        msg = body_message(&r);
        assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
        assert_string_equal(json_string_value(json_object_get(msg, "content")), f.content);
        assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                            f.reasoning);
        calls = json_object_get(msg, "tool_calls");
        assert_int_equal(json_array_size(calls), 2);
        for (int i = 0; i < 2; i++) {
            const json_t *call = json_array_get(calls, (size_t)i);
            const json_t *fn = json_object_get(call, "function");
            assert_string_equal(json_string_value(json_object_get(call, "id")), f.ids[i]);
            assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
            assert_string_equal(json_string_value(json_object_get(fn, "name")), f.names[i]);
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")), f.args[i]);
        }
        /* arguments are a JSON string holding an object: string="false" values typed */
        args = json_loads(f.args[0], 0, NULL);
        assert_non_null(args);
        assert_string_equal(json_string_value(json_object_get(args, "city")), "Par\xC3\xADs");
        assert_int_equal(json_integer_value(json_object_get(args, "days")), 2);
        json_decref(args);
        run_fini(&r);
    }
}

static void test_only_tool_calls_have_null_content_and_no_reasoning_key(void **state)
{
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    const json_t *msg;
    run_t r;

    chat_request(&gen, 0, 1);
    run_text(tok, &gen, CALLS_TEXT, 1, 1, &r);
    msg = body_message(&r);
    assert_string_equal(r.finish, "tool_calls");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_null(json_object_get(msg, "reasoning_content"));
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 2);
    run_fini(&r);
}

static void test_unfinished_call_at_max_tokens_is_content_with_length(void **state)
{
    static const char text[] = "r</think>Writing." CALLS_TEXT;
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    const json_t *msg;
    size_t cut =
        strlen("r</think>Writing.\n\n" BLOCK "\n" INV("get_weather") "\n" PAR("city", "true")) + 2;
    folded_t f;
    run_t r;

    chat_request(&gen, 1, 1);
    gen.max_tokens = (uint32_t)cut; /* one token per byte: stops inside the first call */
    run_text(tok, &gen, text, 1, 3, &r);
    fold_chunks(r.chunks, 1, &f);
    assert_string_equal(r.finish, "length");
    assert_string_equal(f.finish, "length");
    assert_int_equal(f.n_calls, 0);
    assert_memory_equal(f.content, text + 9, cut - 9); /* the markup, as text */
    assert_int_equal(strlen(f.content), cut - 9);
    msg = body_message(&r);
    assert_string_equal(json_string_value(json_object_get(msg, "content")), f.content);
    assert_null(json_object_get(msg, "tool_calls"));
    run_fini(&r);
}

static void test_plain_requests_are_answered_as_before(void **state)
{
    static const char text[] = "a</think>b" CALLS_TEXT;
    const text_tokenizer_t *tok = *state;
    router_openai_ctx_t octx = {ROUTER_API_CHAT, "chatcmpl-test", "tandem-test", 0};
    router_gen_request_t gen;
    const json_t *msg;
    char *want;
    char *got;
    folded_t f;
    run_t r;

    /* no tools and no thinking; tools with tool_choice "none": everything is content */
    for (int k = 0; k < 2; k++) {
        chat_request(&gen, 0, k);
        gen.tool_choice = k == 1 ? ROUTER_TOOL_CHOICE_NONE : ROUTER_TOOL_CHOICE_AUTO;
        run_text(tok, &gen, text, 1, 4, &r);
        fold_chunks(r.chunks, 1, &f);
        assert_string_equal(r.finish, "stop");
        assert_string_equal(f.reasoning, "");
        assert_false(f.has_reasoning);
        assert_int_equal(f.n_calls, 0);
        msg = body_message(&r);
        assert_string_equal(json_string_value(json_object_get(msg, "content")), text);
        assert_null(json_object_get(msg, "reasoning_content"));
        /* byte for byte the body router_openai_response builds */
        got = json_dumps(r.body, JSON_COMPACT);
        router_openai_choice_t choice = {text, strlen(text), "stop", NULL, NULL};
        router_openai_usage_t usage = {10, strlen(text) + 1, 0};
        want = router_openai_response(&octx, &choice, 1, &usage);
        assert_non_null(want);
        assert_non_null(got);
        json_t *want_json = json_loads(want, 0, NULL);
        assert_true(json_equal(want_json, r.body));
        json_decref(want_json);
        free(want);
        free(got);
        run_fini(&r);
    }
}

static void test_stop_strings_cut_the_raw_text_and_calls_stand(void **state)
{
    static const char text[] = "think STOP? no</think>a" CALLS_TEXT "bSTOPc";
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    char stop[] = "STOP";
    const json_t *msg;
    folded_t f;
    run_t r;

    /* a stop string in the reasoning ends the output there */
    chat_request(&gen, 1, 1);
    gen.n_stop = 1;
    gen.stop[0] = stop;
    gen.stop_bytes[0] = 4;
    run_text(tok, &gen, text, 1, 1, &r);
    fold_chunks(r.chunks, 0, &f);
    assert_string_equal(f.reasoning, "think ");
    assert_string_equal(f.finish, "stop");
    run_fini(&r);
    /* without thinking, after the calls: the calls stand, content is cut */
    gen.thinking = 0;
    run_text(tok, &gen, text + strlen("think STOP? no</think>"), 1, 2, &r);
    fold_chunks(r.chunks, 0, &f);
    assert_string_equal(f.content, "ab");
    assert_int_equal(f.n_calls, 2);
    assert_string_equal(f.finish, "tool_calls");
    msg = body_message(&r);
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "ab");
    run_fini(&r);
}

static void test_logprobs_cover_every_token_in_the_body_and_ride_on_chunks(void **state)
{
    static const char text[] = "hm</think>ok" CALLS_TEXT;
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    const json_t *lp;
    folded_t f;
    run_t r;

    chat_request(&gen, 1, 1);
    gen.n_logprobs = 0;
    run_text(tok, &gen, text, 1, 1, &r);
    fold_chunks(r.chunks, 0, &f);
    lp = json_object_get(
        json_object_get(json_array_get(json_object_get(r.body, "choices"), 0), "logprobs"),
        "content");
    assert_int_equal(json_array_size(lp), strlen(text) + 1); /* every byte token and EOS */
    assert_int_equal(f.n_logprobs, strlen(text) + 1); /* the stream carries every entry too */
    run_fini(&r);
}

static void test_a_later_choice_carries_its_index_in_every_chunk(void **state)
{
    static const char text[] = "hm</think>ok" CALLS_TEXT;
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    int32_t ids[1024];
    size_t i;
    json_t *chunk;
    folded_t f;
    run_t r;

    chat_request(&gen, 1, 1);
    run_ids(tok, &gen, 2, ids, text_ids(text, -1, 1, ids, 1024), 2, &r);
    fold_chunks(r.chunks, 0, &f);
    assert_int_equal(f.n_calls, 2);
    assert_string_equal(f.finish, "tool_calls");
    json_array_foreach(r.chunks, i, chunk)
    {
        json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
        assert_int_equal(json_integer_value(json_object_get(choice, "index")), 2);
    }
    run_fini(&r);
}

static void test_the_dsml_special_token_reads_as_its_text(void **state)
{
    static const char text[] = "hm</think>ok" CALLS_TEXT;
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    int32_t ids[1024];
    int32_t dsml_id;
    size_t n_ids;
    folded_t f;
    folded_t g;
    run_t r;

    assert_int_equal(text_tokenizer_find_special(tok, DSML_TOKEN, &dsml_id), TDM_OK);
    n_ids = text_ids(text, dsml_id, 1, ids, 1024);
    assert_true(n_ids < strlen(text)); /* the marker is one token */
    chat_request(&gen, 1, 1);
    run_ids(tok, &gen, 0, ids, n_ids, 3, &r);
    fold_chunks(r.chunks, 0, &f);
    assert_string_equal(r.finish, "tool_calls");
    run_fini(&r);
    run_text(tok, &gen, text, 1, 3, &r); /* the same text in byte tokens */
    fold_chunks(r.chunks, 0, &g);
    run_fini(&r);
    assert_string_equal(f.reasoning, g.reasoning);
    assert_string_equal(f.content, g.content);
    assert_int_equal(f.n_calls, 2);
    assert_int_equal(g.n_calls, 2);
    assert_string_equal(f.args[0], g.args[0]);
    /* a plain request still drops special tokens from the text, as before */
    chat_request(&gen, 0, 0);
    run_ids(tok, &gen, 0, ids, n_ids, 3, &r);
    fold_chunks(r.chunks, 1, &f);
    assert_null(strstr(f.content, DSML_TOKEN));
    assert_non_null(strstr(f.content, "<tool_calls>"));
    run_fini(&r);
}

/* The streamed log-probability entries, in order: tokens and (completions) text_offset. */
typedef struct {
    json_t *tokens;  /* token strings of every entry */
    json_t *offsets; /* completions: text_offset of every entry */
} lp_stream_t;

static void stream_logprobs(const json_t *chunks, router_api_t api, lp_stream_t *out)
{
    size_t i;
    json_t *chunk;

    out->tokens = json_array();
    out->offsets = json_array();
    json_array_foreach(chunks, i, chunk)
    {
        json_t *lp =
            json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs");
        size_t k;
        json_t *e;
        if (lp == NULL || json_is_null(lp)) {
            continue;
        }
        if (api == ROUTER_API_CHAT) {
            json_array_foreach(json_object_get(lp, "content"), k, e)
            {
                json_array_append(out->tokens, json_object_get(e, "token"));
            }
        } else {
            json_array_extend(out->tokens, json_object_get(lp, "tokens"));
            json_array_extend(out->offsets, json_object_get(lp, "text_offset"));
        }
    }
}

static void lp_stream_fini(lp_stream_t *s)
{
    json_decref(s->tokens);
    json_decref(s->offsets);
}

/* The body's logprobs value of choice 0. */
static const json_t *body_logprobs(const run_t *r)
{
    return json_object_get(json_array_get(json_object_get(r->body, "choices"), 0), "logprobs");
}

/* Feed ids, draining after every token; the stream must carry exactly the body's entries. */
static void assert_stream_carries_body_logprobs(const text_tokenizer_t *tok,
                                                const router_gen_request_t *gen, const int32_t *ids,
                                                size_t n_ids, size_t want_tokens)
{
    lp_stream_t st;
    const json_t *body_lp;
    json_t *body_tokens = json_array();
    size_t k;
    json_t *e;
    run_t r;

    for (size_t every = 1; every <= 3; every++) {
        run_ids(tok, gen, 0, ids, n_ids, every, &r);
        body_lp = body_logprobs(&r);
        json_array_clear(body_tokens);
        if (gen->api == ROUTER_API_CHAT) {
            json_array_foreach(json_object_get(body_lp, "content"), k, e)
            {
                json_array_append(body_tokens, json_object_get(e, "token"));
            }
        } else {
            json_array_extend(body_tokens, json_object_get(body_lp, "tokens"));
        }
        /* usage counts want_tokens; the body has one entry each; so does the stream */
        assert_int_equal(json_integer_value(json_object_get(json_object_get(r.body, "usage"),
                                                            "completion_tokens")),
                         want_tokens);
        assert_int_equal(json_array_size(body_tokens), want_tokens);
        stream_logprobs(r.chunks, gen->api, &st);
        assert_int_equal(json_array_size(st.tokens), want_tokens);
        assert_true(json_equal(st.tokens, body_tokens));
        if (gen->api == ROUTER_API_COMPLETIONS) {
            assert_true(json_equal(st.offsets, json_object_get(body_lp, "text_offset")));
        }
        lp_stream_fini(&st);
        run_fini(&r);
    }
    json_decref(body_tokens);
}

static void test_streamed_logprobs_cover_tokens_that_give_no_text(void **state)
{
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    int32_t dsml_id;
    int32_t ids[8];

    /* a, b, a CONTROL token (no text in a plain request), c, EOS: 5 tokens, 5 entries */
    assert_int_equal(text_tokenizer_find_special(tok, DSML_TOKEN, &dsml_id), TDM_OK);
    ids[0] = BYTE_ID('a');
    ids[1] = BYTE_ID('b');
    ids[2] = dsml_id;
    ids[3] = BYTE_ID('c');
    ids[4] = EOS_ID;
    chat_request(&gen, 0, 0);
    gen.n_logprobs = 0;
    assert_stream_carries_body_logprobs(tok, &gen, ids, 5, 5);
    /* the CONTROL token last, then EOS: both give no text */
    ids[2] = BYTE_ID('c');
    ids[3] = dsml_id;
    assert_stream_carries_body_logprobs(tok, &gen, ids, 5, 5);
    gen.api = ROUTER_API_COMPLETIONS;
    assert_stream_carries_body_logprobs(tok, &gen, ids, 5, 5);
}

static void test_streamed_logprobs_cover_a_token_a_stop_string_cuts_at_its_start(void **state)
{
    static char stop[] = "cd";
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    int32_t ids[8];

    /* a, b, c (held: could start "cd"), d (completes the stop string at c's start): the output
       is "ab", usage counts 4 tokens, every one has its entry in the stream too */
    ids[0] = BYTE_ID('a');
    ids[1] = BYTE_ID('b');
    ids[2] = BYTE_ID('c');
    ids[3] = BYTE_ID('d');
    ids[4] = BYTE_ID('e');
    for (int api = 0; api < 2; api++) {
        chat_request(&gen, 0, 0);
        gen.api = api == 0 ? ROUTER_API_CHAT : ROUTER_API_COMPLETIONS;
        gen.n_logprobs = 0;
        gen.stop[0] = stop;
        gen.stop_bytes[0] = 2;
        gen.n_stop = 1;
        assert_stream_carries_body_logprobs(tok, &gen, ids, 5, 4);
    }
}

static void test_streamed_text_offset_is_cumulative(void **state)
{
    static const char text[] = "hello, world";
    const text_tokenizer_t *tok = *state;
    router_gen_request_t gen;
    int32_t ids[32];
    size_t n_ids = text_ids(text, -1, 0, ids, 32);
    lp_stream_t st;
    run_t r;

    chat_request(&gen, 0, 0);
    gen.api = ROUTER_API_COMPLETIONS;
    gen.n_logprobs = 0;
    run_ids(tok, &gen, 0, ids, n_ids, 1, &r); /* one chunk per token */
    stream_logprobs(r.chunks, gen.api, &st);
    assert_int_equal(json_array_size(st.offsets), n_ids);
    for (size_t i = 0; i < n_ids; i++) {
        assert_int_equal(json_integer_value(json_array_get(st.offsets, i)), i);
    }
    assert_true(json_equal(st.offsets, json_object_get(body_logprobs(&r), "text_offset")));
    lp_stream_fini(&st);
    run_fini(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thinking_and_tool_calls_stream_and_whole_agree),
        cmocka_unit_test(test_only_tool_calls_have_null_content_and_no_reasoning_key),
        cmocka_unit_test(test_unfinished_call_at_max_tokens_is_content_with_length),
        cmocka_unit_test(test_plain_requests_are_answered_as_before),
        cmocka_unit_test(test_stop_strings_cut_the_raw_text_and_calls_stand),
        cmocka_unit_test(test_logprobs_cover_every_token_in_the_body_and_ride_on_chunks),
        cmocka_unit_test(test_the_dsml_special_token_reads_as_its_text),
        cmocka_unit_test(test_a_later_choice_carries_its_index_in_every_chunk),
        cmocka_unit_test(test_streamed_logprobs_cover_tokens_that_give_no_text),
        cmocka_unit_test(test_streamed_logprobs_cover_a_token_a_stop_string_cuts_at_its_start),
        cmocka_unit_test(test_streamed_text_offset_is_cumulative),
    };
    return cmocka_run_group_tests(tests, setup_tokenizer, teardown_tokenizer);
}
