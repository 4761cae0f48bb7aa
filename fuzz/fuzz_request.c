/* fuzz_request.c - libFuzzer harness: an HTTP request body of POST /v1/chat/completions or
 * /v1/completions through router_validate_request (JSON, every field check, the agent fields,
 * response_format schemas, chat rendering and tokenization of the prompt).
 *
 * Input: byte 0 picks the endpoint (bit 0: 0 chat, 1 completions); the rest is the body.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_model.h"
#include "fuzz/fuzz_util.h"
#include "router/apierr.h"
#include "router/validate.h"

/* The model every input is checked against (loaded once; immutable). */
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
    router_gen_request_t req;
    router_apierr_t err;
    router_api_t api;

    if (size < 1) {
        return 0;
    }
    api = (data[0] & 1u) != 0 ? ROUTER_API_COMPLETIONS : ROUTER_API_CHAT;
    memset(&req, 0, sizeof(req));
    memset(&err, 0, sizeof(err));
    if (router_validate_request(fuzz_model, api, "application/json", (const char *)data + 1,
                                size - 1, 7, &req, &err) == TDM_OK) {
        router_gen_request_fini(&req);
    }
    return 0;
}
