/* fingerprint.h - the model fingerprint (one 64-bit identity of a checkpoint directory: config,
 * tokenizer, shard headers and the first MiB of each shard) and the weights digest (every tensor
 * byte, cached beside the checkpoint).
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

/* Bytes one read of the weights digest takes (a whole-checkpoint pass: large reads). */
#define TDM_WEIGHTS_DIGEST_READ_BYTES (4u << 20)

/* Most threads that hash shards at once (tdm_weights_digest). */
#define TDM_WEIGHTS_DIGEST_MAX_THREADS 16u

/* Name of the digest cache file written beside the checkpoint (tdm_weights_digest). */
#define TDM_WEIGHTS_DIGEST_CACHE_NAME ".tandem-weights-digest"

/* Checkpoints at least this large log their digest progress (about every 10%). */
#define TDM_WEIGHTS_DIGEST_PROGRESS_BYTES (1ull << 30)

/* Flags of tdm_weights_digest. */
typedef enum {
    TDM_WEIGHTS_DIGEST_NO_CACHE = 1u << 0, /* hash every byte; neither read nor write a cache */
} tdm_weights_digest_flags_t;

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

/*
 * tdm_weights_digest - the weights digest of checkpoint directory `model_dir`: every tensor byte
 * hashed once (issue 16: two checkpoints with the same config and shard headers but different
 * weights have the same model fingerprint, never the same digest).
 *
 * Definition (docs/PROTOCOL.md): XXH3-64 (seed 0) over, for each `*.safetensors` file of the
 * directory in byte-wise (strcmp) name order (the Engram sidecar included), 16 bytes: its size
 * and the XXH3-64 (seed 0) of every byte of the file (header and data), each 8 bytes
 * little-endian. A directory with no shard has the digest of empty input. The shards are
 * hashed by up to TDM_WEIGHTS_DIGEST_MAX_THREADS threads (at most one per online CPU), one
 * shard each at a time.
 *
 * Cache: hashing a full checkpoint reads all of it, so the result is kept in a small text file
 * keyed by every shard's name, size and modification time (ns): a changed, added or removed shard
 * invalidates it. The file is TDM_WEIGHTS_DIGEST_CACHE_NAME in model_dir; when that directory is
 * not writable, "weights-<XXH3 of the directory's real path>.digest" in $TANDEM_CACHE_DIR, else
 * $XDG_CACHE_HOME/tandem, else $HOME/.cache/tandem; when none can be written, the digest is not
 * cached (one info log line says so). Written to a temporary name and renamed, so concurrent
 * processes never read a half-written file. flags: tdm_weights_digest_flags_t.
 * Checkpoints of TDM_WEIGHTS_DIGEST_PROGRESS_BYTES or more log progress while hashing.
 *
 * Returns TDM_OK with *digest_out set; otherwise *digest_out is untouched and err (err_bytes, may
 * be NULL/0) names the file: TDM_ERR_INVALID_ARG (NULL argument), TDM_ERR_NOT_FOUND (no such
 * directory), TDM_ERR_IO (a shard cannot be opened, read or stat'ed), TDM_ERR_FORMAT (more than
 * TDM_FINGERPRINT_MAX_SHARDS shards), TDM_ERR_NO_MEMORY. A cache that cannot be written is not
 * an error. Thread-safe.
 */
tdm_status_t tdm_weights_digest(const char *model_dir, uint32_t flags, uint64_t *digest_out,
                                char *err, size_t err_bytes);

#endif
