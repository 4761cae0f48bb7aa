/* fuzz_safetensors.c - libFuzzer harness: a safetensors shard (engine_st_file_open: the 8-byte
 * header length, the JSON header, dtypes, shapes, data offsets, overlaps, __metadata__), then
 * every tensor and metadata entry of an accepted file read back.
 *
 * Input: the file (held in a memfd; opened through /proc/self/fd).
 */
#include <stdint.h>
#include <unistd.h>

#include "engine/safetensors.h"
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
    char path[FUZZ_PATH_BYTES], err[256];
    engine_st_file_t *file = NULL;
    int fd = fuzz_memfd_open(data, size, path, sizeof(path));

    if (fd < 0) {
        return 0;
    }
    if (engine_st_file_open(path, &file, err, sizeof(err)) == TDM_OK) {
        size_t n = engine_st_file_n_tensors(file);
        for (size_t i = 0; i < n; i++) {
            const engine_st_tensor_t *t = engine_st_file_tensor_at(file, i);
            if (t == NULL || engine_st_file_find(file, t->name) != t) {
                abort();
            }
            (void)tdm_hash_xxh3_64(t->data, t->n_bytes); /* every data byte is mapped */
        }
        n = engine_st_file_n_metadata(file);
        for (size_t i = 0; i < n; i++) {
            const char *key = NULL, *value = NULL;
            if (engine_st_file_metadata_at(file, i, &key, &value) != TDM_OK ||
                engine_st_file_metadata(file, key) == NULL) {
                abort();
            }
        }
        engine_st_file_close(file);
    }
    close(fd);
    return 0;
}
