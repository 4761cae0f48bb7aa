/* test_router_response_format.c - router/validate: response_format on chat completions. text,
 * json_object and json_schema are accepted (the compact JSON kept for the nodes); a schema
 * keyword, field or type text/constrain.h does not support is a 400 whose message names it;
 * response_format with ignore_eos is a 400 naming ignore_eos. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "router/model.h"
#include "router/validate.h"

#define PATH_BYTES 4096
#define BODY_BYTES 4096

static int setup(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[PATH_BYTES];
    char command[PATH_BYTES * 3];
    char err[256] = "";
    router_model_params_t mp = {0};
    router_model_t *model = NULL;
    int rc;

    if (bin == NULL || tmp == NULL) {
        print_message("TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest)\n");
        return -1;
    }
    snprintf(dir, sizeof(dir), "%s/router-rf-model", tmp);
    snprintf(command, sizeof(command),
             "test -f %s/config.json || %s/tandem-mkmodel --log-level warn --preset tiny --seed 1 "
             "--out %s >/dev/null",
             dir, bin, dir);
    rc = system(command);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        return -1;
    }
    mp.model_dir = dir;
    mp.served_name = "tiny";
    if (router_model_load(&mp, &model, err, sizeof(err)) != TDM_OK) {
        print_message("router_model_load: %s\n", err);
        return -1;
    }
    *state = model;
    return 0;
}

static int teardown(void **state)
{
    router_model_destroy(*state);
    return 0;
}

/* Validate a chat body with `extra` members after the messages. */
static tdm_status_t validate(const router_model_t *model, const char *extra,
                             router_gen_request_t *req, router_apierr_t *err)
{
    char body[BODY_BYTES];

    snprintf(body, sizeof(body),
             "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s%s}",
             extra[0] != '\0' ? "," : "", extra);
    return router_validate_request(model, ROUTER_API_CHAT, "application/json", body,
                                   strlen(body), 1, req, err);
}

static void accepted(const router_model_t *model, const char *extra, const char *kept)
{
    router_gen_request_t req;
    router_apierr_t err;

    if (validate(model, extra, &req, &err) != TDM_OK) {
        print_message("refused %s: %s\n", extra, err.message);
        fail();
    }
    if (kept == NULL) {
        assert_null(req.response_format_json);
    } else {
        assert_non_null(req.response_format_json);
        assert_non_null(strstr(req.response_format_json, kept));
    }
    router_gen_request_fini(&req);
}

static void refused(const router_model_t *model, const char *extra, const char *param,
                    const char *needle)
{
    router_gen_request_t req;
    router_apierr_t err;

    assert_int_equal(validate(model, extra, &req, &err), TDM_ERR_INVALID_ARG);
    assert_int_equal(err.http_status, 400);
    assert_non_null(err.param);
    assert_string_equal(err.param, param);
    if (strstr(err.message, needle) == NULL) {
        print_message("message \"%s\" does not name \"%s\"\n", err.message, needle);
        fail();
    }
    assert_null(req.response_format_json); /* *req_out zeroed */
}

static void test_supported_formats_are_kept(void **state)
{
    const router_model_t *model = *state;

    accepted(model, "", NULL);
    accepted(model, "\"response_format\":null", NULL);
    accepted(model, "\"response_format\":{\"type\":\"text\"}", NULL);
    accepted(model, "\"response_format\":{\"type\":\"json_object\"}", "\"json_object\"");
    accepted(model,
             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
             "\"strict\":true,\"schema\":{\"type\":\"object\",\"description\":\"a person\","
             "\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":[\"integer\","
             "\"null\"]},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]}},"
             "\"v\":{\"anyOf\":[{\"const\":1},{\"type\":\"boolean\"}]}},"
             "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}}}",
             "\"additionalProperties\":false");
}

static void test_unsupported_schema_keywords_are_400_naming_them(void **state)
{
    const router_model_t *model = *state;
    static const char *const keywords[][2] = {
        {"\"minimum\":0", "schema.properties.n.minimum"},
        {"\"pattern\":\"^a\"", "schema.properties.n.pattern"},
        {"\"$ref\":\"#/$defs/x\"", "schema.properties.n.$ref"},
        {"\"oneOf\":[{}]", "schema.properties.n.oneOf"},
        {"\"format\":\"date\"", "schema.properties.n.format"},
        {"\"maxItems\":3", "schema.properties.n.maxItems"},
    };

    for (size_t i = 0; i < sizeof(keywords) / sizeof(keywords[0]); i++) {
        char extra[1024];

        snprintf(extra, sizeof(extra),
                 "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
                 "\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                 "%s}}}}}",
                 keywords[i][0]);
        refused(model, extra, "response_format", keywords[i][1]);
    }
    refused(model, "\"response_format\":{\"type\":\"xml\"}", "response_format",
            "response_format.type");
    refused(model, "\"response_format\":\"json\"", "response_format", "must be an object");
    refused(model,
            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":"
            "\"object\",\"additionalProperties\":{\"type\":\"string\"}}}}",
            "response_format", "additionalProperties");
    refused(model,
            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":"
            "\"date\"}}}",
            "response_format", "schema.type");
    refused(model, "\"response_format\":{\"type\":\"json_object\"},\"ignore_eos\":true",
            "ignore_eos", "response_format");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supported_formats_are_kept),
        cmocka_unit_test(test_unsupported_schema_keywords_are_400_naming_them),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
