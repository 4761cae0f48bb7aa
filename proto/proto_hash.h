/* proto_hash.h - the block-hash chain over a token sequence, which both ends of the protocol
 * compute the same way.
 *
 * The chain names full prefix-cache blocks (MODEL.md 7, "Prefix cache") in the router's session
 * table and in anything a worker reports about its cache. The model fingerprint that
 * Register.model_fingerprint carries is tdm_model_fingerprint (common/fingerprint.h), the value
 * the engine stamps into every KV page. Owns nothing; thread-safe.
 */
#ifndef TANDEM_PROTO_PROTO_HASH_H
#define TANDEM_PROTO_PROTO_HASH_H

#include <stddef.h>
#include <stdint.h>

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

/*
 * proto_session_hash - the key that names a session in what a worker reports about the sessions
 * it holds (Load.history_sessions): XXH3-64 (seed 0) of the session id's bytes, no NUL; 0 for
 * NULL. A hint only: whoever acts on a match checks the session's pages or tokens.
 */
uint64_t proto_session_hash(const char *session_id);

#endif
