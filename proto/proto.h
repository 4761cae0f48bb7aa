/* proto.h - thin C wrappers over Tandem's control protocol (proto/tandem.proto).
 *
 * Owns the wire rules every peer applies: one ZeroMQ frame holds one packed Tandem__Envelope
 * whose oneof case is the message type; size limits; the protocol version; structural checks of
 * each message (lengths, enums, paired arrays) after unpacking; the registration compatibility
 * check; the model fingerprint and the block-hash chain both ends must compute the same way.
 * Knows nothing of sockets, sessions, placement or the engine. docs/PROTOCOL.md describes the
 * flows. All functions are thread-safe (no shared state).
 *
 * Building a message: fill generated structs and point the envelope at one of them, e.g.
 *
 *     Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
 *     Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
 *     env.body_case = TANDEM__ENVELOPE__BODY_HEARTBEAT;
 *     env.heartbeat = &hb;
 *     status = proto_pack(&env, &buf, &n_bytes);
 */
#ifndef TANDEM_PROTO_PROTO_H
#define TANDEM_PROTO_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/tandem.pb-c.h"

/* Protocol version of this build; a worker of another version is refused at registration. */
#define PROTO_VERSION 3u

/* Largest packed envelope accepted or produced (a 1M-token delta packs to about 4 MB). */
#define PROTO_MAX_MESSAGE_BYTES (64u * 1024u * 1024u)

/* Longest incarnation, session, rack or node id, bytes (no NUL). */
#define PROTO_MAX_ID_BYTES 128u

/* Longest free-text field (reasons, error messages), bytes. */
#define PROTO_MAX_TEXT_BYTES 4096u

/* Most token ids one message may carry (delta, chunk, context). */
#define PROTO_MAX_TOKENS (1u << 22)

/* Most ids of PrefillJob.context_tokens (W + N - 1 = 131 at full size; room for tests). */
#define PROTO_MAX_CONTEXT_TOKENS 1024u

/* Most alternatives per token in TopLogprobs (OpenAI's top_logprobs limit). */
#define PROTO_MAX_TOP_LOGPROBS 20u

/* Most choices of one request (SamplingParams.n_choices; the router's "n" limit). */
#define PROTO_MAX_CHOICES 8u

/*
 * proto_choice_seed - the sampling seed of choice `choice` of a request seeded `seed`
 * (SamplingParams.n_choices): choice 0 keeps `seed` (so n = 1 and choice 0 of any n give the same
 * tokens); choice i > 0 uses SplitMix64(seed + i), so each choice has its own Philox stream and
 * the set is reproducible for a given seed. Prefill and decode nodes both derive it here.
 */
uint64_t proto_choice_seed(uint64_t seed, uint32_t choice);

/* Most stop token ids in SamplingParams. */
#define PROTO_MAX_STOP_TOKEN_IDS 32u

/* Most session keys in Load.history_sessions (a prefill node's history cache, issue 17). */
#define PROTO_MAX_HISTORY_SESSIONS 4096u

/* Most session keys in Load.resident_session_keys (a decode node's sessions, issue 18). */
#define PROTO_MAX_RESIDENT_SESSIONS 4096u

/* Most KV format names in Register.kv_formats. */
#define PROTO_MAX_KV_FORMATS 8u

/* Most transport names in Register.transports, and the longest one (bytes, no NUL). */
#define PROTO_MAX_TRANSPORTS      16u
#define PROTO_MAX_TRANSPORT_BYTES 32u

/* Names of the KV record formats of MODEL.md section 7 (Register.kv_formats). */
#define PROTO_KV_FORMAT_MAIN  "main:e2m1+e4m3/16"   /* d/2 E2M1 codes + d/16 E4M3 scales */
#define PROTO_KV_FORMAT_INDEX "index:e2m1+ue8m0/32" /* d_I/2 E2M1 codes + d_I/32 UE8M0 */

/* Heartbeat defaults the router announces in RegisterAck. */
#define PROTO_HEARTBEAT_INTERVAL_MS 250u
#define PROTO_HEARTBEAT_TIMEOUT_MS  1500u

/* Flags of proto_unpack(). */
typedef enum {
    /* Accept an envelope of any protocol_version (the router reads a Register of another
     * version this way so it can refuse it with a clear RegisterAck). */
    PROTO_UNPACK_ANY_VERSION = 1u << 0,
} proto_unpack_flags_t;

/*
 * proto_pack - check `env` (proto_check) and pack it into a new buffer.
 *
 * env: borrowed; protocol_version 0 is sent as PROTO_VERSION (the struct is not modified).
 * On success *buf_out is a malloc'ed buffer of *n_bytes_out bytes (caller frees with free()).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL argument, a failed check, or packed size over
 * PROTO_MAX_MESSAGE_BYTES; logged once at warn with the reason) or TDM_ERR_NO_MEMORY. Outputs
 * untouched on failure.
 */
tdm_status_t proto_pack(const Tandem__Envelope *env, uint8_t **buf_out, size_t *n_bytes_out);

/*
 * proto_unpack - unpack one frame of `n_bytes` at `buf` (borrowed) into a new envelope and check
 * it (proto_check).
 *
 * flags: proto_unpack_flags_t bits. On success *env_out is owned by the caller
 * (proto_envelope_free). Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL argument), TDM_ERR_FORMAT
 * (empty, over PROTO_MAX_MESSAGE_BYTES, not a valid Envelope, an unknown field numbered 0 or
 * above 2^29 - 1 at any depth (protobuf-c keeps one but cannot pack it back), no body, or a
 * failed check),
 * TDM_ERR_UNSUPPORTED (another protocol_version without PROTO_UNPACK_ANY_VERSION) or
 * TDM_ERR_NO_MEMORY. On failure *env_out is untouched and err (err_bytes, may be 0) says why.
 * Never logs: the caller decides what a bad frame from a peer means.
 */
tdm_status_t proto_unpack(const void *buf, size_t n_bytes, uint32_t flags,
                          Tandem__Envelope **env_out, char *err, size_t err_bytes);

/* proto_envelope_free - free an envelope from proto_unpack. Accepts NULL. */
void proto_envelope_free(Tandem__Envelope *env);

/*
 * proto_check - structural checks of one envelope: a body is set; ids fit PROTO_MAX_ID_BYTES and
 * text PROTO_MAX_TEXT_BYTES; enums hold known values; token ids are >= 0 and token arrays fit
 * PROTO_MAX_TOKENS (context: PROTO_MAX_CONTEXT_TOKENS); Register's kv_layout and transports
 * are ids (PROTO_MAX_TRANSPORTS names of PROTO_MAX_TRANSPORT_BYTES at most); paired arrays match (a
 * TokenChunk's logprobs and top, each TopLogprobs); required parts are present (Register: role,
 * incarnation id, page format, capacity; DecodeRequest: delta tokens for PREFILL_LOCAL, handoff for
 * PREFILL_REMOTE; PrefillJob: delta tokens; sampling params where a job samples). Vocabulary
 * bounds are the receiver's to check (it knows V).
 *
 * Returns TDM_OK or TDM_ERR_INVALID_ARG with the first failure in err (err_bytes, may be 0).
 */
tdm_status_t proto_check(const Tandem__Envelope *env, char *err, size_t err_bytes);

/* proto_type_name - "register", "heartbeat", ... for a body case; "unknown" otherwise. */
const char *proto_type_name(Tandem__Envelope__BodyCase type);

/* proto_role_name - "prefill", "decode" or "unspecified". */
const char *proto_role_name(Tandem__Role role);

/* proto_error_code_name - "state_lost", "no_pages", ... ; "unknown" for other values. */
const char *proto_error_code_name(Tandem__ErrorCode code);

/* proto_finish_reason_name - "stop_token", "length", "aborted", "context" or "unspecified". */
const char *proto_finish_reason_name(Tandem__FinishReason reason);

/*
 * What a router requires of a registering worker (plain data). kv_formats: n_kv_formats names,
 * borrowed, compared as a set.
 */
typedef struct {
    uint64_t model_fingerprint;
    uint64_t weights_digest; /* tdm_weights_digest of the checkpoint; 0: not checked */
    uint32_t page_format_version;
    uint32_t page_rows;
    uint32_t page_bytes;
    uint32_t tokens_per_block;
    const char *const *kv_formats;
    uint32_t n_kv_formats;
    const char *kv_layout;     /* engine_config_kv_layout; NULL or "": not checked */
    uint32_t max_context;      /* the worker must serve at least this many tokens */
    uint32_t protocol_version; /* PROTO_VERSION */
} proto_compat_t;

/*
 * proto_compat_check - does `reg` (a checked Register) match `want`? Checks, in this order:
 * protocol version (equal), model fingerprint (equal), weights digest (equal, when want's is not
 * 0), page format (version, rows, bytes, block tokens all equal), KV formats (same set), KV
 * layout (equal, when want's is set), max context (reg >= want). What a worker declares for
 * placement (transports, Capacity.max_tokens) is not a registration check: the router's
 * placement uses it (docs/PROTOCOL.md, "compatibility").
 *
 * Returns TDM_OK, or TDM_ERR_MISMATCH with one line in reason (reason_bytes, may be 0) naming
 * the field and both values, e.g. "model fingerprint mismatch: worker 0x1 router 0x2".
 */
tdm_status_t proto_compat_check(const proto_compat_t *want, const Tandem__Register *reg,
                                char *reason, size_t reason_bytes);

#endif
