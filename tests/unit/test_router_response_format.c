/* test_router_response_format.c - router/constrain through router/validate: response_format on
 * chat completions (text, json_object and json_schema accepted, the compact JSON kept for the
 * nodes; a schema keyword, field or type text/constrain.h does not support is a 400 whose message
 * names it; response_format with ignore_eos is a 400 naming ignore_eos) and the forced tool-call
 * constraint (tool_choice required / named: the tools picked, thinking and parallel carried;
 * unknown name, unsupported parameter keyword, response_format or ignore_eos beside it: 400). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "router/constrain.h"
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
             "[ %s/config.json -nt %s/tandem-mkmodel ] || %s/tandem-mkmodel --log-level warn "
             "--preset tiny --seed 1 --out %s >/dev/null",
             dir, bin, bin, dir);
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
    return router_validate_request(model, ROUTER_API_CHAT, "application/json", body, strlen(body),
                                   1, req, err);
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
            "\"object\",\"patternProperties\":{\"^a\":{\"type\":\"string\"}}}}}",
            "response_format", "schema.patternProperties");
    refused(model,
            "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":"
            "\"date\"}}}",
            "response_format", "schema.type");
    refused(model, "\"response_format\":{\"type\":\"json_object\"},\"ignore_eos\":true",
            "ignore_eos", "response_format");
}

static const char *const TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]";

static void tool_request(router_gen_request_t *req, router_tool_choice_t choice, const char *name,
                         const char *tools)
{
    memset(req, 0, sizeof(*req));
    req->tool_choice = choice;
    req->tool_choice_name = name != NULL ? strdup(name) : NULL;
    req->tools_json = tools != NULL ? strdup(tools) : NULL;
    req->parallel_tool_calls = 1;
    req->thinking = 1;
}

static void test_forced_tool_calls_build_the_constraint(void **state)
{
    router_gen_request_t req;
    router_apierr_t err;
    char *json = NULL;

    (void)state;
    /* auto and none force nothing */
    tool_request(&req, ROUTER_TOOL_CHOICE_AUTO, NULL, TOOLS);
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_OK);
    assert_null(json);
    router_gen_request_fini(&req);
    /* required: every tool, parallel as asked, thinking carried */
    tool_request(&req, ROUTER_TOOL_CHOICE_REQUIRED, NULL, TOOLS);
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_OK);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"thinking\":true"));
    assert_non_null(strstr(json, "\"parallel\":true"));
    assert_non_null(strstr(json, "\"get_weather\""));
    assert_non_null(strstr(json, "\"get_time\""));
    free(json);
    router_gen_request_fini(&req);
    /* named: that tool only, one call */
    tool_request(&req, ROUTER_TOOL_CHOICE_NAMED, "get_time", TOOLS);
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_OK);
    assert_non_null(json);
    assert_null(strstr(json, "get_weather"));
    assert_non_null(strstr(json, "\"parallel\":false"));
    free(json);
    router_gen_request_fini(&req);
    /* refusals */
    tool_request(&req, ROUTER_TOOL_CHOICE_NAMED, "nope", TOOLS);
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_ERR_INVALID_ARG);
    assert_null(json);
    assert_string_equal(err.param, "tool_choice");
    router_gen_request_fini(&req);
    tool_request(&req, ROUTER_TOOL_CHOICE_REQUIRED, NULL,
                 "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                 "\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"oneOf\":[{}]}}}}}]");
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_ERR_INVALID_ARG);
    assert_string_equal(err.param, "tools");
    assert_non_null(strstr(err.message, "tools[0].parameters.properties.x.oneOf"));
    router_gen_request_fini(&req);
    tool_request(&req, ROUTER_TOOL_CHOICE_REQUIRED, NULL, TOOLS);
    req.response_format_json = strdup("{\"type\":\"json_object\"}");
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_ERR_INVALID_ARG);
    assert_string_equal(err.param, "response_format");
    router_gen_request_fini(&req);
    tool_request(&req, ROUTER_TOOL_CHOICE_AUTO, NULL, NULL);
    req.response_format_json = strdup("{\"type\":\"json_object\"}");
    req.min_tokens = 3;
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_ERR_INVALID_ARG);
    assert_string_equal(err.param, "min_tokens");
    router_gen_request_fini(&req);
    tool_request(&req, ROUTER_TOOL_CHOICE_REQUIRED, NULL, TOOLS);
    req.ignore_eos = 1;
    assert_int_equal(router_tool_constraint_build(&req, &json, &err), TDM_ERR_INVALID_ARG);
    assert_string_equal(err.param, "ignore_eos");
    router_gen_request_fini(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supported_formats_are_kept),
        cmocka_unit_test(test_unsupported_schema_keywords_are_400_naming_them),
        cmocka_unit_test(test_forced_tool_calls_build_the_constraint),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
