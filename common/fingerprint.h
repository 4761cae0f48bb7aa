/* fingerprint.h - the model fingerprint: one 64-bit identity of a checkpoint directory.
 *
 * The one definition every part uses: the engine stamps it into every KV page header and state
 * record (engine_model_fingerprint, MODEL.md 7), the workers send it in Register.model_fingerprint
 * and the router compares it with its own (proto_compat_check, docs/PROTOCOL.md). It lives here,
 * below engine/ and proto/, so that both reach the same code. It reads files only: it knows the
 * safetensors framing (8-byte little-endian header length, JSON header, data), not what a tensor
 * or a config field means. Owns nothing; thread-safe.
 */
#ifndef TANDEM_COMMON_FINGERPRINT_H
#define TANDEM_COMMON_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Bytes of a shard's data region the fingerprint covers (from the start of the region): enough
 * to tell random checkpoints of different seeds apart, cheap for a full-size model. */
#define TDM_FINGERPRINT_DATA_BYTES (1u << 20)

/* Bytes hashed per XXH3 step: the chunking is part of the definition (each step seeds the next). */
#define TDM_FINGERPRINT_READ_BYTES (1u << 16)

/* Most *.safetensors files a directory may hold; more is a format error. */
#define TDM_FINGERPRINT_MAX_SHARDS 4096

/* Largest safetensors JSON header accepted; a longer one is a format error. */
#define TDM_FINGERPRINT_MAX_HEADER_BYTES (100u * 1024u * 1024u)

/*
 * tdm_model_fingerprint - the model fingerprint of checkpoint directory `model_dir`.
 *
 * Definition (docs/PROTOCOL.md): h = 0, then h = XXH3-64(piece, seed = h) over, in order, the
 * pieces of at most TDM_FINGERPRINT_READ_BYTES of:
 *   1. config.json, whole (required);
 *   2. tokenizer.json, whole; when the file does not exist it contributes nothing (optional:
 *      workers need no tokenizer);
 *   3. for each `*.safetensors` file of the directory in byte-wise (strcmp) name order, the Engram
 *      sidecar included: its 8-byte header length (one piece), its JSON header, and the first
 *      TDM_FINGERPRINT_DATA_BYTES of its data region (fewer when shorter).
 * A directory with no shard hashes only 1 and 2.
 *
 * Returns TDM_OK with *fingerprint_out set; otherwise *fingerprint_out is untouched and err
 * (err_bytes, may be NULL/0) names the file:
 *   TDM_ERR_INVALID_ARG  model_dir or fingerprint_out is NULL
 *   TDM_ERR_NOT_FOUND    no such directory, or no config.json in it
 *   TDM_ERR_IO           a file exists but cannot be opened or read
 *   TDM_ERR_FORMAT       a shard shorter than 8 bytes, a header length above
 *                        TDM_FINGERPRINT_MAX_HEADER_BYTES or past the end of the file, or more
 *                        than TDM_FINGERPRINT_MAX_SHARDS shards
 *   TDM_ERR_NO_MEMORY
 */
tdm_status_t tdm_model_fingerprint(const char *model_dir, uint64_t *fingerprint_out, char *err,
                                   size_t err_bytes);

#endif
