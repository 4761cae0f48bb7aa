/* fuzz_auth.c - libFuzzer harness: who may call. The HTTP Authorization header any client sends
 * (router_apikeys_authenticate, then admission and release of the tenant it names), the API key
 * text of --api-keys / a key file (router_apikeys_create), and the CurveZMQ key and allow-list
 * files of the control plane (tdm_curve_keyfile_load, tdm_curve_allowlist_load).
 *
 * Input: the Authorization header value, a NUL byte, then the key text (also written to a memfd
 * and loaded as a CurveZMQ key file and allow-list). When the key text does not load, the header
 * is checked against a fixed table of two keys.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/curve.h"
#include "fuzz/fuzz_util.h"
#include "router/apikeys.h"

/* The fixed table: two keys, one with limits. */
static const char fuzz_keys[] = "sk-fuzz-0123456789abcdef name=one\n"
                                "# a comment\n"
                                "sk-fuzz-fedcba9876543210 name=two concurrency=1 rpm=2\n";

/* A monotonic time that does not move: every input is judged at the same instant. */
#define FUZZ_NOW_NS 1000000000000ull

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

/* Authenticate `header` against `keys`, then admit and release what it names. */
static void check_header(router_apikeys_t *keys, const char *header)
{
    uint32_t tenant = router_apikeys_authenticate(keys, header);
    uint32_t retry_after_s = 0;

    (void)router_apikeys_name(keys, tenant);
    if (router_apikeys_acquire(keys, tenant, FUZZ_NOW_NS, &retry_after_s) ==
            ROUTER_APIKEY_ADMITTED &&
        tenant != 0) {
        router_apikeys_release(keys, tenant);
    }
}

/* The key text as CurveZMQ files. */
static void curve_files(const uint8_t *text, size_t n)
{
    char path[FUZZ_PATH_BYTES], err[256];
    char(*allowed)[TDM_CURVE_Z85_CHARS + 1] = NULL;
    tdm_curve_keypair_t pair;
    size_t n_allowed = 0;
    int fd = fuzz_memfd_open(text, n, path, sizeof(path));

    if (fd < 0) {
        return;
    }
    (void)tdm_curve_keyfile_load(path, &pair, err, sizeof(err));
    if (tdm_curve_allowlist_load(path, &allowed, &n_allowed, err, sizeof(err)) == TDM_OK) {
        free(allowed);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const router_apikeys_limits_t defaults = {.max_concurrency = 2, .rpm = 60};
    router_apikeys_t *keys = NULL;
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_header = nul != NULL ? (size_t)(nul - data) : size;
    size_t n_text = nul != NULL ? size - n_header - 1 : 0;
    char *header = malloc(n_header + 1), *text = malloc(n_text + 1);
    char err[256];

    if (header == NULL || text == NULL) {
        free(header);
        free(text);
        return 0;
    }
    memcpy(header, data, n_header);
    header[n_header] = '\0';
    if (n_text > 0) {
        memcpy(text, nul + 1, n_text);
    }
    text[n_text] = '\0';
    if (router_apikeys_create(NULL, text, &defaults, &keys, err, sizeof(err)) != TDM_OK &&
        router_apikeys_create(NULL, fuzz_keys, &defaults, &keys, err, sizeof(err)) != TDM_OK) {
        abort();
    }
    check_header(keys, header);
    router_apikeys_destroy(keys);
    if (n_text > 0) {
        curve_files(nul + 1, n_text);
    }
    free(text);
    free(header);
    return 0;
}
