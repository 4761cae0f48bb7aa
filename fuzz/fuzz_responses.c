/* fuzz_responses.c - libFuzzer harness: a POST /v1/responses body through
 * router_responses_request (input items, instructions, tools, text.format, reasoning, ...) and,
 * when accepted, its rewritten chat body through router_validate_request, as the router does.
 *
 * Input: the body. Each input gets a fresh response store (nothing carries over between inputs).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_model.h"
#include "fuzz/fuzz_util.h"
#include "router/apierr.h"
#include "router/responses.h"
#include "router/validate.h"

/* Responses a store keeps; small, the store is per input. */
#define FUZZ_RESPONSES_KEPT 4

/* The model the rewritten chat bodies are checked against (loaded once; immutable). */
static router_model_t *fuzz_model;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    fuzz_model = fuzz_model_load();
    if (fuzz_model == NULL) {
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    router_responses_t *store = NULL;
    router_responses_req_t req;
    router_gen_request_t gen;
    router_apierr_t err;

    if (router_responses_create(FUZZ_RESPONSES_KEPT, &store) != TDM_OK) {
        abort();
    }
    memset(&req, 0, sizeof(req));
    memset(&err, 0, sizeof(err));
    if (router_responses_request(store, (const char *)data, size, 1, 0, &req, &err) == TDM_OK) {
        memset(&gen, 0, sizeof(gen));
        memset(&err, 0, sizeof(err));
        if (router_validate_request(fuzz_model, ROUTER_API_CHAT, "application/json", req.chat_body,
                                    req.n_chat_body, 7, &gen, &err) == TDM_OK) {
            router_gen_request_fini(&gen);
        }
        router_responses_req_fini(&req);
    }
    router_responses_destroy(store);
    return 0;
}
