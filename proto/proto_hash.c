/* proto_hash.c - the block-hash chain (proto/proto_hash.h). */
#include "proto/proto_hash.h"

#include <string.h>

#include "common/hash.h"

uint64_t proto_session_hash(const char *session_id)
{
    return session_id != NULL ? tdm_hash_xxh3_64(session_id, strlen(session_id)) : 0;
}

size_t proto_block_hashes(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                          uint64_t *hashes_out)
{
    unsigned char block[PROTO_BLOCK_HASH_PIECE_TOKENS * 4];
    size_t n_blocks;
    uint64_t h = 0;

    if (tokens_per_block == 0 || tokens == NULL || hashes_out == NULL) {
        return 0;
    }
    n_blocks = n_tokens / tokens_per_block;
    for (size_t b = 0; b < n_blocks; b++) {
        const int32_t *ids = tokens + b * tokens_per_block;
        size_t done = 0;
        uint64_t seed = h;
        /* A block of more than PROTO_BLOCK_HASH_PIECE_TOKENS ids is hashed as a chain of
         * pieces of that many (proto_hash.h). */
        while (done < tokens_per_block) {
            size_t n = tokens_per_block - done;
            if (n > PROTO_BLOCK_HASH_PIECE_TOKENS) {
                n = PROTO_BLOCK_HASH_PIECE_TOKENS;
            }
            for (size_t i = 0; i < n; i++) {
                uint32_t v = (uint32_t)ids[done + i];
                block[4 * i + 0] = (unsigned char)(v & 0xff);
                block[4 * i + 1] = (unsigned char)((v >> 8) & 0xff);
                block[4 * i + 2] = (unsigned char)((v >> 16) & 0xff);
                block[4 * i + 3] = (unsigned char)((v >> 24) & 0xff);
            }
            seed = tdm_hash_xxh3_64_seeded(block, 4 * n, seed);
            done += n;
        }
        h = seed;
        hashes_out[b] = h;
    }
    return n_blocks;
}
