#include "proto/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/hash.h"
#include "common/log.h"

#define PROTO_ERR_BYTES 256
/* Largest protobuf field number (2^29 - 1); 0 is not a field number either. */
#define PROTO_MAX_FIELD_NUMBER 0x1fffffffu

/*
 * 1 when `msg` or a message inside it keeps an unknown field whose number protobuf does not
 * allow (0, or above PROTO_MAX_FIELD_NUMBER). protobuf-c accepts such a tag when it is written
 * in more than one byte and keeps the field, but packs it back as bytes no reader accepts: a
 * CompletionNotice carrying one, forwarded by the router inside a DecodeRequest, made that
 * DecodeRequest unreadable at the decode node (found by fuzz/fuzz_proto.c).
 */
static int has_bad_unknown_field(const ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    const char *base = (const char *)msg;

    for (unsigned i = 0; i < msg->n_unknown_fields; i++) {
        uint32_t tag = msg->unknown_fields[i].tag;
        if (tag == 0 || tag > PROTO_MAX_FIELD_NUMBER) {
            return 1;
        }
    }
    for (unsigned f = 0; f < desc->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &desc->fields[f];

        if (fd->type != PROTOBUF_C_TYPE_MESSAGE) {
            continue;
        }
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + fd->quantifier_offset);
            ProtobufCMessage *const *items = *(ProtobufCMessage *const *const *)(base + fd->offset);
            for (size_t k = 0; k < n; k++) {
                if (items[k] != NULL && has_bad_unknown_field(items[k])) {
                    return 1;
                }
            }
            continue;
        }
        /* a oneof member is set only when the oneof's case names it (members share storage) */
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0 &&
            *(const uint32_t *)(base + fd->quantifier_offset) != fd->id) {
            continue;
        }
        {
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + fd->offset);
            if (sub != NULL && has_bad_unknown_field(sub)) {
                return 1;
            }
        }
    }
    return 0;
}

tdm_status_t proto_pack(const Tandem__Envelope *env, uint8_t **buf_out, size_t *n_bytes_out)
{
    Tandem__Envelope copy;
    char err[PROTO_ERR_BYTES];
    uint8_t *buf;
    size_t n_bytes;

    if (env == NULL || buf_out == NULL || n_bytes_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (proto_check(env, err, sizeof(err)) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "proto", "pack refused: type=%s reason=%s",
                proto_type_name(env->body_case), err);
        return TDM_ERR_INVALID_ARG;
    }
    copy = *env;
    if (copy.protocol_version == 0) {
        copy.protocol_version = PROTO_VERSION;
    }
    n_bytes = tandem__envelope__get_packed_size(&copy);
    if (n_bytes > PROTO_MAX_MESSAGE_BYTES) {
        tdm_log(TDM_LOG_WARN, "proto", "pack refused: type=%s bytes=%zu limit_bytes=%u",
                proto_type_name(env->body_case), n_bytes, PROTO_MAX_MESSAGE_BYTES);
        return TDM_ERR_INVALID_ARG;
    }
    buf = malloc(n_bytes > 0 ? n_bytes : 1);
    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    tandem__envelope__pack(&copy, buf);
    *buf_out = buf;
    *n_bytes_out = n_bytes;
    return TDM_OK;
}

tdm_status_t proto_unpack(const void *buf, size_t n_bytes, uint32_t flags,
                          Tandem__Envelope **env_out, char *err, size_t err_bytes)
{
    Tandem__Envelope *env;
    tdm_status_t status;

    if (buf == NULL || env_out == NULL || (flags & ~(uint32_t)PROTO_UNPACK_ANY_VERSION) != 0) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    if (n_bytes == 0) {
        tdm_errbuf_set(err, err_bytes, "empty frame");
        return TDM_ERR_FORMAT;
    }
    if (n_bytes > PROTO_MAX_MESSAGE_BYTES) {
        tdm_errbuf_set(err, err_bytes, "frame of %zu bytes exceeds limit of %u", n_bytes,
                       PROTO_MAX_MESSAGE_BYTES);
        return TDM_ERR_FORMAT;
    }
    env = tandem__envelope__unpack(NULL, n_bytes, buf);
    if (env == NULL) {
        tdm_errbuf_set(err, err_bytes, "not a valid envelope (%zu bytes)", n_bytes);
        return TDM_ERR_FORMAT;
    }
    if (has_bad_unknown_field(&env->base)) {
        tdm_errbuf_set(err, err_bytes, "not a valid envelope (%zu bytes): field number %s", n_bytes,
                       "0 or above 2^29 - 1");
        status = TDM_ERR_FORMAT;
        goto err_free_env;
    }
    if ((flags & PROTO_UNPACK_ANY_VERSION) == 0 && env->protocol_version != PROTO_VERSION) {
        tdm_errbuf_set(err, err_bytes, "protocol version %u, expected %u", env->protocol_version,
                       PROTO_VERSION);
        status = TDM_ERR_UNSUPPORTED;
        goto err_free_env;
    }
    if (proto_check(env, err, err_bytes) != TDM_OK) {
        status = TDM_ERR_FORMAT;
        goto err_free_env;
    }
    *env_out = env;
    return TDM_OK;

err_free_env:
    tandem__envelope__free_unpacked(env, NULL);
    return status;
}

void proto_envelope_free(Tandem__Envelope *env)
{
    if (env != NULL) {
        tandem__envelope__free_unpacked(env, NULL);
    }
}

const char *proto_type_name(Tandem__Envelope__BodyCase type)
{
    switch (type) {
    case TANDEM__ENVELOPE__BODY_REGISTER:
        return "register";
    case TANDEM__ENVELOPE__BODY_REGISTER_ACK:
        return "register_ack";
    case TANDEM__ENVELOPE__BODY_HEARTBEAT:
        return "heartbeat";
    case TANDEM__ENVELOPE__BODY_RESERVE_PAGES:
        return "reserve_pages";
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        return "page_reservation";
    case TANDEM__ENVELOPE__BODY_PREFILL_JOB:
        return "prefill_job";
    case TANDEM__ENVELOPE__BODY_COMPLETION:
        return "completion";
    case TANDEM__ENVELOPE__BODY_DECODE_REQUEST:
        return "decode_request";
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        return "token_chunk";
    case TANDEM__ENVELOPE__BODY_FINISH:
        return "finish";
    case TANDEM__ENVELOPE__BODY_ABORT:
        return "abort";
    case TANDEM__ENVELOPE__BODY_ERROR:
        return "error";
    case TANDEM__ENVELOPE__BODY_GOODBYE:
        return "goodbye";
    case TANDEM__ENVELOPE__BODY_ABORT_ACK:
        return "abort_ack";
    case TANDEM__ENVELOPE__BODY__NOT_SET:
    default:
        return "unknown";
    }
}

const char *proto_role_name(Tandem__Role role)
{
    switch (role) {
    case TANDEM__ROLE__ROLE_PREFILL:
        return "prefill";
    case TANDEM__ROLE__ROLE_DECODE:
        return "decode";
    default:
        return "unspecified";
    }
}

const char *proto_error_code_name(Tandem__ErrorCode code)
{
    switch (code) {
    case TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE:
        return "bad_message";
    case TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED:
        return "not_registered";
    case TANDEM__ERROR_CODE__ERROR_STATE_LOST:
        return "state_lost";
    case TANDEM__ERROR_CODE__ERROR_NO_PAGES:
        return "no_pages";
    case TANDEM__ERROR_CODE__ERROR_BUSY:
        return "busy";
    case TANDEM__ERROR_CODE__ERROR_INTERNAL:
        return "internal";
    case TANDEM__ERROR_CODE__ERROR_UNSUPPORTED:
        return "unsupported";
    case TANDEM__ERROR_CODE__ERROR_PEER_LOST:
        return "peer_lost";
    case TANDEM__ERROR_CODE__ERROR_TIMEOUT:
        return "timeout";
    case TANDEM__ERROR_CODE__ERROR_TOO_LARGE:
        return "too_large";
    default:
        return "unknown";
    }
}

const char *proto_finish_reason_name(Tandem__FinishReason reason)
{
    switch (reason) {
    case TANDEM__FINISH_REASON__FINISH_STOP_TOKEN:
        return "stop_token";
    case TANDEM__FINISH_REASON__FINISH_LENGTH:
        return "length";
    case TANDEM__FINISH_REASON__FINISH_ABORTED:
        return "aborted";
    case TANDEM__FINISH_REASON__FINISH_CONTEXT:
        return "context";
    default:
        return "unspecified";
    }
}

static int kv_format_sets_equal(const char *const *want, uint32_t n_want, char *const *have,
                                size_t n_have)
{
    if (n_want != n_have) {
        return 0;
    }
    for (uint32_t i = 0; i < n_want; i++) {
        size_t j;
        for (j = 0; j < n_have; j++) {
            if (strcmp(want[i], have[j]) == 0) {
                break;
            }
        }
        if (j == n_have) {
            return 0;
        }
    }
    /* Equal counts and every wanted name present: equal unless `have` repeats a name. */
    for (size_t i = 0; i < n_have; i++) {
        for (size_t j = i + 1; j < n_have; j++) {
            if (strcmp(have[i], have[j]) == 0) {
                return 0;
            }
        }
    }
    return 1;
}

static void join_names(char *const *names, size_t n_names, char *out, size_t out_bytes)
{
    size_t used = 0;

    out[0] = '\0';
    for (size_t i = 0; i < n_names && used + 1 < out_bytes; i++) {
        int n = snprintf(out + used, out_bytes - used, "%s%s", i > 0 ? "," : "", names[i]);
        if (n < 0) {
            break;
        }
        used += (size_t)n;
    }
}

tdm_status_t proto_compat_check(const proto_compat_t *want, const Tandem__Register *reg,
                                char *reason, size_t reason_bytes)
{
    const Tandem__PageFormat *pf;
    char have_names[PROTO_ERR_BYTES];
    char want_names[PROTO_ERR_BYTES];

    if (want == NULL || reg == NULL) {
        tdm_errbuf_set(reason, reason_bytes, "invalid argument");
        return TDM_ERR_MISMATCH;
    }
    if (reg->protocol_version != want->protocol_version) {
        tdm_errbuf_set(reason, reason_bytes, "protocol version mismatch: worker %u router %u",
                       reg->protocol_version, want->protocol_version);
        return TDM_ERR_MISMATCH;
    }
    if (reg->model_fingerprint != want->model_fingerprint) {
        tdm_errbuf_set(reason, reason_bytes,
                       "model fingerprint mismatch: worker 0x%016llx router 0x%016llx",
                       (unsigned long long)reg->model_fingerprint,
                       (unsigned long long)want->model_fingerprint);
        return TDM_ERR_MISMATCH;
    }
    if (want->weights_digest != 0 && reg->weights_digest != want->weights_digest) {
        tdm_errbuf_set(reason, reason_bytes,
                       "weights digest mismatch: worker 0x%016llx router 0x%016llx (same config, "
                       "different weights: another checkpoint revision)",
                       (unsigned long long)reg->weights_digest,
                       (unsigned long long)want->weights_digest);
        return TDM_ERR_MISMATCH;
    }
    pf = reg->page_format;
    if (pf == NULL || pf->version != want->page_format_version ||
        pf->rows_per_page != want->page_rows || pf->page_bytes != want->page_bytes ||
        pf->tokens_per_block != want->tokens_per_block) {
        tdm_errbuf_set(reason, reason_bytes,
                       "page format mismatch: worker version=%u rows=%u bytes=%u block_tokens=%u "
                       "router version=%u rows=%u bytes=%u block_tokens=%u",
                       pf != NULL ? pf->version : 0, pf != NULL ? pf->rows_per_page : 0,
                       pf != NULL ? pf->page_bytes : 0, pf != NULL ? pf->tokens_per_block : 0,
                       want->page_format_version, want->page_rows, want->page_bytes,
                       want->tokens_per_block);
        return TDM_ERR_MISMATCH;
    }
    if (!kv_format_sets_equal(want->kv_formats, want->n_kv_formats, reg->kv_formats,
                              reg->n_kv_formats)) {
        join_names(reg->kv_formats, reg->n_kv_formats, have_names, sizeof(have_names));
        join_names((char *const *)want->kv_formats, want->n_kv_formats, want_names,
                   sizeof(want_names));
        tdm_errbuf_set(reason, reason_bytes, "kv formats mismatch: worker [%s] router [%s]",
                       have_names, want_names);
        return TDM_ERR_MISMATCH;
    }
    if (want->kv_layout != NULL && want->kv_layout[0] != '\0' &&
        (reg->kv_layout == NULL || strcmp(reg->kv_layout, want->kv_layout) != 0)) {
        tdm_errbuf_set(reason, reason_bytes, "kv layout mismatch: worker '%s' router '%s'",
                       reg->kv_layout != NULL ? reg->kv_layout : "", want->kv_layout);
        return TDM_ERR_MISMATCH;
    }
    if (reg->max_context < want->max_context) {
        tdm_errbuf_set(reason, reason_bytes,
                       "max context mismatch: worker serves %u tokens, router needs %u",
                       reg->max_context, want->max_context);
        return TDM_ERR_MISMATCH;
    }
    return TDM_OK;
}

uint64_t proto_choice_seed(uint64_t seed, uint32_t choice)
{
    return choice == 0 ? seed : tdm_hash_splitmix64(seed + (uint64_t)choice);
}
