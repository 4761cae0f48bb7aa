/* fuzz_proto.c - libFuzzer harness: one control-plane frame (tandem.proto Envelope) through
 * proto_unpack (protobuf-c unpack plus proto_check), then for a Register proto_compat_check, and
 * for every accepted frame a round trip: proto_pack of the envelope must succeed and unpack
 * again (a frame we accept is one we can send).
 *
 * Input: byte 0 bit 0 sets PROTO_UNPACK_ANY_VERSION; the rest is the frame.
 */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz_util.h"
#include "proto/proto.h"

/* What the harness's router requires of a registering worker (arbitrary, fixed). */
static const char *const fuzz_kv_formats[] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};
static const proto_compat_t fuzz_want = {
    .model_fingerprint = 0x0123456789abcdefull,
    .page_format_version = 1,
    .page_rows = 64,
    .page_bytes = 4096,
    .tokens_per_block = 128,
    .kv_formats = fuzz_kv_formats,
    .n_kv_formats = 2,
    .max_context = 4096,
    .protocol_version = PROTO_VERSION,
};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Tandem__Envelope *env = NULL, *again = NULL;
    uint32_t flags;
    uint8_t *packed = NULL;
    size_t n_packed = 0;
    char err[256] = "";

    if (size < 1) {
        return 0;
    }
    flags = (data[0] & 1u) != 0 ? PROTO_UNPACK_ANY_VERSION : 0;
    if (proto_unpack(data + 1, size - 1, flags, &env, err, sizeof(err)) != TDM_OK) {
        return 0;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_REGISTER) {
        (void)proto_compat_check(&fuzz_want, env->register_, err, sizeof(err));
    }
    if (proto_pack(env, &packed, &n_packed) != TDM_OK ||
        proto_unpack(packed, n_packed, flags, &again, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "fuzz_proto: an accepted frame does not round-trip: %s\n", err);
        abort();
    }
    proto_envelope_free(again);
    free(packed);
    proto_envelope_free(env);
    return 0;
}
