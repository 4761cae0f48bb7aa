/* test_constrain_text.c - text/constrain: the schema compiler's refusals (each naming the keyword)
 * and the byte automaton's accept / reject decisions per keyword, independent of how the text is
 * split (every string is also fed as a copy of the state per byte), anyOf threads, whitespace
 * and UTF-8 rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/constrain.h"

#define ERR_BYTES 256

static text_constraint_t *compile_schema(const char *schema)
{
    text_constraint_t *c = NULL;
    char err[ERR_BYTES] = "";

    if (text_constraint_compile_schema(schema, strlen(schema), "schema", &c, err, sizeof(err)) !=
        TDM_OK) {
        print_message("compile failed: %s\n", err);
        fail();
    }
    return c;
}

/* 1 when the whole text is a complete text of the language. */
static int accepts(const text_constraint_t *c, const char *text)
{
    text_constraint_state_t st;

    text_constraint_start(c, &st);
    if (!text_constraint_step_bytes(c, &st, (const uint8_t *)text, strlen(text))) {
        return 0;
    }
    return text_constraint_accepting(c, &st);
}

/* 1 when the text is a prefix of some text of the language (every byte accepted). */
static int prefix_ok(const text_constraint_t *c, const char *text)
{
    text_constraint_state_t st;

    text_constraint_start(c, &st);
    return text_constraint_step_bytes(c, &st, (const uint8_t *)text, strlen(text));
}

static void expect(const char *schema, const char *const *good, const char *const *bad)
{
    text_constraint_t *c = compile_schema(schema);

    for (int i = 0; good[i] != NULL; i++) {
        if (!accepts(c, good[i])) {
            print_message("schema %s should accept %s\n", schema, good[i]);
            fail();
        }
    }
    for (int i = 0; bad[i] != NULL; i++) {
        if (accepts(c, bad[i])) {
            print_message("schema %s should refuse %s\n", schema, bad[i]);
            fail();
        }
    }
    text_constraint_destroy(c);
}

static void test_types(void **state)
{
    (void)state;
    expect("{\"type\":\"string\"}",
           (const char *const[]){"\"\"", "\"abc\"", "\"a\\\"b\\\\\\n\\u00e9\"", "\"\xc3\xa9\"",
                                 "\"\xe2\x82\xac\"", "\"\xf0\x9f\x98\x80\"", NULL},
           (const char *const[]){"abc", "\"abc", "\"a\nb\"", "\"\\x\"", "\"\xc0\xaf\"",
                                 "\"\xed\xa0\x80\"", "\"\\ud800\"", "\"\\u0000\"", "\"\xff\"", "1",
                                 "\"a\" ", " \"a\"", NULL});
    expect("{\"type\":\"integer\"}", (const char *const[]){"0", "-7", "120", NULL},
           (const char *const[]){"01", "1.5", "1e3", "-", "+1", "\"1\"", "1 ", NULL});
    expect("{\"type\":\"number\"}",
           (const char *const[]){"0", "-0.5", "1e10", "2.5E-3", "17", NULL},
           (const char *const[]){"1.", ".5", "1e", "00", "-", "NaN", NULL});
    expect("{\"type\":\"boolean\"}", (const char *const[]){"true", "false", NULL},
           (const char *const[]){"True", "tru", "null", "1", NULL});
    expect("{\"type\":\"null\"}", (const char *const[]){"null", NULL},
           (const char *const[]){"nul", "false", "\"null\"", NULL});
    expect("{\"type\":[\"string\",\"null\"]}", (const char *const[]){"null", "\"x\"", NULL},
           (const char *const[]){"1", "true", NULL});
    expect("{}", (const char *const[]){"{\"a\":[1,{\"b\":null}]}", "\"s\"", "-1.5", "[]", NULL},
           (const char *const[]){"{a:1}", "[1,]", "{\"a\"}", NULL});
}

static void test_objects(void **state)
{
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                         "{\"type\":\"string\"}}},\"required\":[\"name\",\"age\"],"
                         "\"additionalProperties\":false}";

    (void)state;
    expect(schema,
           (const char *const[]){"{\"name\":\"x\",\"age\":3}", "{\"age\":3,\"name\":\"x\"}",
                                 "{ \"name\" : \"x\" ,\n  \"age\": 3, \"tags\": [\"a\", \"b\"] }",
                                 "{\"name\":\"\",\"age\":0,\"tags\":[]}", NULL},
           (const char *const[]){"{\"name\":\"x\"}", "{}", "{\"name\":\"x\",\"age\":3,\"x\":1}",
                                 "{\"name\":\"x\",\"name\":\"y\",\"age\":3}",
                                 "{\"name\":1,\"age\":3}", "{\"name\":\"x\",\"age\":3,}",
                                 "{\"name\":\"x\",\"age\":3,\"tags\":[1]}", NULL});
    /* json_object: any object */
    {
        text_constraint_t *c = NULL;
        const char *rf = "{\"type\":\"json_object\"}";

        assert_int_equal(text_constraint_compile(rf, strlen(rf), &c, NULL, 0), TDM_OK);
        assert_true(accepts(c, "{}"));
        assert_true(accepts(c, "{\"k\":{\"x\":[true,null,\"s\"]},\"n\":1}"));
        assert_false(accepts(c, "[]"));
        assert_false(accepts(c, "\"s\""));
        assert_false(prefix_ok(c, "{\"k\":1}}"));
        text_constraint_destroy(c);
    }
    /* additionalProperties as a schema: the values of a map */
    expect("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}",
           (const char *const[]){"{}", "{\"a\":\"x\",\"b\":\"\"}", NULL},
           (const char *const[]){"{\"a\":1}", "{\"a\":\"x\",\"b\":null}", NULL});
    /* additionalProperties false without properties: only {} */
    expect("{\"type\":\"object\",\"additionalProperties\":false}",
           (const char *const[]){"{}", NULL}, (const char *const[]){"{\"a\":1}", NULL});
}

static void test_enum_const_anyof(void **state)
{
    (void)state;
    expect("{\"enum\":[\"red\",\"green\",1,12,null,{\"a\":1}]}",
           (const char *const[]){"\"red\"", "\"green\"", "1", "12", "null", "{\"a\":1}", NULL},
           (const char *const[]){"\"blue\"", "\"re\"", "2", "123", "{\"a\": 1}", NULL});
    expect("{\"const\":\"fixed\"}", (const char *const[]){"\"fixed\"", NULL},
           (const char *const[]){"\"fixe\"", "\"fixedd\"", NULL});
    /* anyOf whose alternatives share the prefix {"a": */
    expect("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
           "\"required\":[\"a\"],\"additionalProperties\":false},{\"type\":\"object\","
           "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}},"
           "\"required\":[\"a\",\"b\"],\"additionalProperties\":false},{\"type\":\"null\"}]}",
           (const char *const[]){"{\"a\":\"s\"}", "{\"a\":5,\"b\":true}", "null", NULL},
           (const char *const[]){"{\"a\":5}", "{\"a\":\"s\",\"b\":true}", "{\"b\":true}", NULL});
    /* arrays of anyOf items */
    expect("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"enum\":[\"x\"]}]}}",
           (const char *const[]){"[]", "[1,\"x\",2]", NULL},
           (const char *const[]){"[\"y\"]", "[1.5]", NULL});
}

static void test_whitespace_bounded(void **state)
{
    text_constraint_t *c = compile_schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    char text[64];

    (void)state;
    memset(text, ' ', sizeof(text));
    text[0] = '[';
    text[1 + TEXT_CONSTRAINT_MAX_WS] = '1';
    text[2 + TEXT_CONSTRAINT_MAX_WS] = ']';
    text[3 + TEXT_CONSTRAINT_MAX_WS] = '\0';
    assert_true(accepts(c, text));
    text[1 + TEXT_CONSTRAINT_MAX_WS] = ' ';
    text[2 + TEXT_CONSTRAINT_MAX_WS] = '1';
    text[3 + TEXT_CONSTRAINT_MAX_WS] = ']';
    text[4 + TEXT_CONSTRAINT_MAX_WS] = '\0';
    assert_false(prefix_ok(c, text));
    text_constraint_destroy(c);
}

/* Splitting a text across steps never changes the decision: every prefix's state, copied and
 * continued, reaches the same end as one pass. */
static void test_split_independent(void **state)
{
    text_constraint_t *c = compile_schema(
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"n\":{\"type\":"
        "\"number\"},\"e\":{\"enum\":[\"a\",\"ab\"]}},\"required\":[\"s\"]}");
    const char *texts[] = {"{\"s\":\"h\xc3\xa9llo \\u00e9\",\"n\":-1.5e3,\"e\":\"ab\"}",
                           "{\"e\":\"a\",\"s\":\"\"}", "{\"s\":\"x\",\"n\":0}"};

    (void)state;
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
        size_t n = strlen(texts[t]);

        assert_true(accepts(c, texts[t]));
        for (size_t cut = 0; cut <= n; cut++) {
            text_constraint_state_t a;
            text_constraint_state_t b;

            text_constraint_start(c, &a);
            assert_true(text_constraint_step_bytes(c, &a, (const uint8_t *)texts[t], cut));
            text_constraint_state_copy(&b, &a);
            assert_true(
                text_constraint_step_bytes(c, &b, (const uint8_t *)texts[t] + cut, n - cut));
            assert_true(text_constraint_accepting(c, &b));
        }
    }
    text_constraint_destroy(c);
}

static void refused(const char *rf, const char *needle)
{
    text_constraint_t *c = NULL;
    char err[ERR_BYTES] = "";

    assert_int_equal(text_constraint_compile(rf, strlen(rf), &c, err, sizeof(err)),
                     TDM_ERR_INVALID_ARG);
    assert_null(c);
    if (strstr(err, needle) == NULL) {
        print_message("error \"%s\" does not name \"%s\"\n", err, needle);
        fail();
    }
}

static void test_refusals_name_the_keyword(void **state)
{
    (void)state;
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
            "\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0}}}}}",
            "response_format.json_schema.schema.properties.age.minimum");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\","
            "\"pattern\":\"^a\"}}}",
            "pattern");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"$ref\":\"#/x\"}}}", "$ref");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"oneOf\":[]}}}", "oneOf");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"date\"}}}", "type");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\","
            "\"patternProperties\":{\"^a\":{\"type\":\"string\"}}}}}",
            "schema.patternProperties");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\","
            "\"properties\":{},\"required\":[\"x\"]}}}",
            "required");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"items\":[{}]}}}", "items");
    refused("{\"type\":\"xml\"}", "response_format.type");
    refused("{\"type\":\"text\"}", "response_format.type");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"foo\":1}}",
            "response_format.json_schema.foo");
    refused("{\"type\":\"json_schema\"}", "response_format.json_schema");
    refused("not json", "response_format");
}

/* ---- the tool-call (DSML) language ------------------------------------------------------------
 */

/* clang-format off */
#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
#define OPEN "\n\n<" D "tool_calls>\n"
#define CLOSE "\n</" D "tool_calls>"
#define INV(name) "<" D "invoke name=\"" name "\">\n"
#define INV_END "\n</" D "invoke>"
#define PARAM(k, s, v) "<" D "parameter name=\"" k "\" string=\"" s "\">" v "</" D "parameter>"
/* clang-format on */

static const char *const TOOLS =
    "{\"thinking\":%s,\"parallel\":%s,\"tools\":["
    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"location\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]},\"when\":{\"type\":[\"string\",\"null\"]}},"
    "\"required\":[\"location\"]}},"
    "{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}]}";

static text_constraint_t *compile_tools(const char *thinking, const char *parallel)
{
    char json[1024];
    char err[ERR_BYTES] = "";
    text_constraint_t *c = NULL;

    snprintf(json, sizeof(json), TOOLS, thinking, parallel);
    if (text_constraint_compile_tool_calls(json, strlen(json), &c, err, sizeof(err)) != TDM_OK) {
        print_message("compile failed: %s\n", err);
        fail();
    }
    return c;
}

static void check_texts(const text_constraint_t *c, const char *const *good, const char *const *bad)
{
    for (int i = 0; good[i] != NULL; i++) {
        if (!accepts(c, good[i])) {
            print_message("should accept: %s\n", good[i]);
            fail();
        }
    }
    for (int i = 0; bad[i] != NULL; i++) {
        if (accepts(c, bad[i])) {
            print_message("should refuse: %s\n", bad[i]);
            fail();
        }
    }
}

static void test_tool_calls_language(void **state)
{
    text_constraint_t *c = compile_tools("false", "false");

    (void)state;
    /* clang-format off */
    check_texts(
        c,
        (const char *const[]){
            OPEN INV("get_weather") PARAM("location", "true", "Seoul") INV_END CLOSE,
            OPEN INV("get_weather") PARAM("days", "false", "3") "\n"
                PARAM("location", "true", "New York <b> \"x\"\n") "\n"
                PARAM("unit", "true", "f") "\n" PARAM("when", "false", "null") INV_END CLOSE,
            OPEN INV("get_weather") PARAM("location", "true", "") "\n"
                PARAM("when", "true", "today") INV_END CLOSE,
            OPEN INV("get_time") INV_END CLOSE,
            NULL},
        (const char *const[]){
            OPEN INV("get_weather") INV_END CLOSE,                               /* required */
            OPEN INV("get_date") INV_END CLOSE,                                  /* no such tool */
            OPEN INV("get_weather") PARAM("days", "true", "3") "\n"
                PARAM("location", "true", "x") INV_END CLOSE,                    /* days raw */
            OPEN INV("get_weather") PARAM("location", "true", "x") "\n"
                PARAM("unit", "true", "k") INV_END CLOSE,                        /* not in enum */
            OPEN INV("get_weather") PARAM("location", "true", "x") "\n"
                PARAM("location", "true", "y") INV_END CLOSE,                    /* twice */
            OPEN INV("get_weather") PARAM("location", "false", "1") INV_END CLOSE, /* not JSON */
            OPEN INV("get_time") INV_END "\n" INV("get_time") INV_END CLOSE,     /* not parallel */
            OPEN INV("get_time") INV_END CLOSE "x",                              /* trailing */
            "x" OPEN INV("get_time") INV_END CLOSE,                              /* leading */
            OPEN INV("get_time") INV_END,                                        /* unfinished */
            NULL});
    text_constraint_destroy(c);

    c = compile_tools("true", "true");
    check_texts(c,
                (const char *const[]){
                    "I should check <the> weather.</think>" OPEN INV("get_time") INV_END "\n" INV(
                        "get_weather") PARAM("location", "true", "Rome") INV_END CLOSE,
                    "</think>" OPEN INV("get_time") INV_END CLOSE, NULL},
                (const char *const[]){OPEN INV("get_time") INV_END CLOSE, /* no reasoning end */
                                      "a</think>b" OPEN INV("get_time") INV_END CLOSE, NULL});
    /* clang-format on */
    text_constraint_destroy(c);
}

/* Value-narrowing keywords of tool schemas are taken and not enforced (response_format refuses
 * them). */
static void test_tool_calls_take_narrowing_keywords(void **state)
{
    static const char json[] =
        "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"n\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":9},"
        "\"s\":{\"type\":\"string\",\"maxLength\":3,\"format\":\"date\"}},"
        "\"required\":[\"n\"]}}]}";
    text_constraint_t *c = NULL;
    char err[ERR_BYTES] = "";

    (void)state;
    assert_int_equal(text_constraint_compile_tool_calls(json, strlen(json), &c, err, sizeof(err)),
                     TDM_OK);
    assert_true(accepts(c, OPEN INV("f") PARAM("n", "false", "1") INV_END CLOSE));
    assert_false(accepts(c, OPEN INV("f") PARAM("n", "false", "x") INV_END CLOSE));
    text_constraint_destroy(c);
}

static void test_tool_calls_refusals(void **state)
{
    static const char *const bad[][2] = {
        {"{\"tools\":[]}", "tools"},
        {"{\"tools\":[{\"name\":\"a\\\"b\"}]}", "tools[0].name"},
        {"{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":"
         "{\"type\":\"string\",\"oneOf\":[{}]}}}}]}",
         "tools[0].parameters.properties.x.oneOf"},
        {"{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"string\"}}]}",
         "tools[0].parameters"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        text_constraint_t *c = NULL;
        char err[ERR_BYTES] = "";

        assert_int_equal(
            text_constraint_compile_tool_calls(bad[i][0], strlen(bad[i][0]), &c, err, sizeof(err)),
            TDM_ERR_INVALID_ARG);
        assert_null(c);
        if (strstr(err, bad[i][1]) == NULL) {
            print_message("error \"%s\" does not name \"%s\"\n", err, bad[i][1]);
            fail();
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_enum_const_anyof),
        cmocka_unit_test(test_whitespace_bounded),
        cmocka_unit_test(test_split_independent),
        cmocka_unit_test(test_refusals_name_the_keyword),
        cmocka_unit_test(test_tool_calls_language),
        cmocka_unit_test(test_tool_calls_take_narrowing_keywords),
        cmocka_unit_test(test_tool_calls_refusals),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
