/* proto_hash.h - the identities both ends of the protocol compute the same way: the model
 * fingerprint of a checkpoint directory and the block-hash chain over a token sequence.
 *
 * The fingerprint goes into Register.model_fingerprint and every KV page header (MODEL.md 7);
 * the chain names full prefix-cache blocks (MODEL.md 7, "Prefix cache") in the router's session
 * table and in anything a worker reports about its cache. Owns nothing; thread-safe.
 */
#ifndef TANDEM_PROTO_PROTO_HASH_H
#define TANDEM_PROTO_PROTO_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Bytes of a checkpoint's safetensors payload the fingerprint covers, per shard (from the start
 * of the data region): enough to tell random checkpoints of different seeds apart, cheap for a
 * full-size model. */
#define PROTO_FINGERPRINT_DATA_BYTES (1u << 20)

/*
 * proto_model_fingerprint - the model fingerprint of checkpoint directory `model_dir`:
 * XXH3-64 chained (each step seeded with the previous value, starting at 0) over, in order,
 * the bytes of config.json, of tokenizer.json, and for each `*.safetensors` shard in byte-wise
 * name order (the Engram sidecar included): its 8-byte header length, its JSON header and the
 * first PROTO_FINGERPRINT_DATA_BYTES of its data region (fewer if shorter). docs/PROTOCOL.md.
 *
 * Returns TDM_OK with *fingerprint_out set, or (untouched) TDM_ERR_INVALID_ARG (NULL argument),
 * TDM_ERR_NOT_FOUND (no directory, config.json or tokenizer.json), TDM_ERR_IO (unreadable),
 * TDM_ERR_FORMAT (a truncated safetensors header) or TDM_ERR_NO_MEMORY; err (err_bytes, may
 * be 0) names the file.
 */
tdm_status_t proto_model_fingerprint(const char *model_dir, uint64_t *fingerprint_out, char *err,
                                     size_t err_bytes);

/* Longest block hashed in one XXH3 call; longer blocks chain pieces of this many ids. */
#define PROTO_BLOCK_HASH_PIECE_TOKENS 1024u

/*
 * proto_block_hashes - the block-hash chain of `tokens` [n_tokens]: for each full block b of
 * `tokens_per_block` ids, hashes_out[b] = XXH3-64 of the block's ids as little-endian int32
 * bytes, seeded with hashes_out[b-1] (block 0: seed 0); a block longer than
 * PROTO_BLOCK_HASH_PIECE_TOKENS chains its pieces the same way. A partial last block has no hash.
 *
 * hashes_out: room for n_tokens / tokens_per_block values. Returns the number of hashes written
 * (0 when tokens_per_block is 0). Equal hashes are a hint only: a match is confirmed on tokens.
 */
size_t proto_block_hashes(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                          uint64_t *hashes_out);

#endif
