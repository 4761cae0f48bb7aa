/* fuzz_gguf.c - libFuzzer harness: the vocabulary of a GGUF file
 * (text_tokenizer_load_gguf_buffer: header, metadata key/values of every type, arrays, the
 * tokenizer.ggml.* keys, tensor infos), then encoding, decoding and token look-ups on a
 * vocabulary that loaded (fuzz_tok.h).
 *
 * Input: the file's bytes.
 */
#include <stdint.h>

#include "fuzz/fuzz_tok.h"
#include "fuzz/fuzz_util.h"

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
    text_tokenizer_t *tok = NULL;
    char err[256];

    if (text_tokenizer_load_gguf_buffer(data, size, "model.gguf", &tok, err, sizeof(err)) ==
        TDM_OK) {
        fuzz_tok_exercise(tok);
        text_tokenizer_destroy(tok);
    }
    return 0;
}
