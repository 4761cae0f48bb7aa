/* safetensors.h - read and write one .safetensors file.
 *
 * The reader maps one file read-only, validates its whole header (every tensor's dtype, shape
 * and byte range) and hands out tensors whose data points into the mapping; nothing is copied.
 * The writer collects tensors and writes one deterministic file. Owns the mapping and the
 * parsed header of each open file; knows nothing of model names, shards, index files or
 * configs (engine/weights.h). Reader and shape helpers in safetensors.c, writer in
 * safetensors_writer.c.
 *
 * File layout (source: the safetensors format spec, github.com/huggingface/safetensors):
 *   8 bytes   N, unsigned little-endian: the header's size in bytes
 *   N bytes   UTF-8 JSON object starting with '{', possibly padded with trailing spaces:
 *             "name": {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [begin, end]}
 *             per tensor, plus an optional "__metadata__": {string: string} map
 *   the rest  the data region; a tensor's bytes are [begin, end) relative to its start,
 *             row-major, little-endian
 */
#ifndef TANDEM_ENGINE_SAFETENSORS_H
#define TANDEM_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/tensor.h"

/* Largest header the reader accepts, in bytes (the reference implementation's limit). */
#define ENGINE_ST_MAX_HEADER_BYTES 100000000u

/* The header's size is padded to a multiple of this (bytes); the data region starts aligned. */
#define ENGINE_ST_HEADER_ALIGN_BYTES 8u

/* Reserved header key holding the string-to-string metadata map. */
#define ENGINE_ST_METADATA_KEY "__metadata__"

/* Bytes engine_st_shape_format() needs for any shape ("[d0, d1, d2, d3]", 20-digit sizes). */
#define ENGINE_ST_SHAPE_TEXT_BYTES 96

/* An open, validated .safetensors file; opaque. */
typedef struct engine_st_file engine_st_file_t;

/* A safetensors writer; opaque. */
typedef struct engine_st_writer engine_st_writer_t;

/*
 * One tensor of a safetensors file.
 *
 * name:    NUL-terminated, unique within the file.
 * dtype:   element type; shape: n_dims (0..ENGINE_TENSOR_MAX_DIMS) sizes, row-major; a tensor
 *          with n_dims 0 is a scalar (one element); shape entries past n_dims are 0.
 * data:    n_bytes = product(shape) * engine_dtype_size_bytes(dtype) bytes, little-endian.
 *          From the reader: points into the read-only mapping, aligned only as the file puts it
 *          (the data region starts 8-byte aligned, each tensor follows the previous), so read
 *          wider elements with memcpy unless you check the alignment.
 * data_offset: from the reader, the tensor's begin offset in the data region (bytes); ignored
 *          by the writers.
 *
 * From the reader, name and data are owned by the engine_st_file_t and valid until
 * engine_st_file_close(). As writer input (engine_weights_write_sharded) every field is
 * borrowed for the duration of the call.
 */
typedef struct {
    const char *name;
    engine_dtype_t dtype;
    int n_dims;
    int64_t shape[ENGINE_TENSOR_MAX_DIMS];
    const void *data;
    size_t n_bytes;
    uint64_t data_offset;
} engine_st_tensor_t;

/*
 * engine_st_shape_bytes - *n_bytes_out = product(shape[0..n_dims)) *
 * engine_dtype_size_bytes(dtype), computed without overflow (n_dims 0 is a scalar: one element).
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (output untouched) for an invalid dtype, n_dims outside
 * 0..ENGINE_TENSOR_MAX_DIMS, a negative size, shape NULL with n_dims > 0, or a product past
 * 2^64 - 1.
 */
tdm_status_t engine_st_shape_bytes(engine_dtype_t dtype, int n_dims, const int64_t *shape,
                                   uint64_t *n_bytes_out);

/*
 * engine_st_shape_format - write "[d0, d1]" ("[]" for a scalar) into text (text_bytes, truncated
 * to fit, always NUL-terminated when text_bytes > 0). ENGINE_ST_SHAPE_TEXT_BYTES always suffices.
 */
void engine_st_shape_format(int n_dims, const int64_t *shape, char *text, size_t text_bytes);

/*
 * engine_st_file_open - map the file at `path` read-only and validate its header.
 *
 * Checks: the file holds at least the 8-byte length; the header length is at most
 * ENGINE_ST_MAX_HEADER_BYTES and fits in the file; the header is a JSON object starting with '{'
 * (duplicate keys rejected); every tensor entry is an object with a known dtype, a shape that is
 * a list of at most ENGINE_TENSOR_MAX_DIMS non-negative integers, and data_offsets [begin, end]
 * with begin <= end <= the data region's size and end - begin = product(shape) * dtype size
 * (computed without overflow); no two tensors' byte ranges overlap (empty tensors overlap
 * nothing); "__metadata__", when present, is an object of strings without NUL bytes. Gaps
 * between tensors and bytes after the last one are allowed. Unknown keys inside a tensor entry
 * are ignored.
 *
 * Returns TDM_OK and *file_out (caller closes with engine_st_file_close), or, with a message
 * naming the file and, where one is at fault, the tensor written to err (err_bytes, may be 0),
 * and *file_out untouched:
 *   TDM_ERR_INVALID_ARG  path or file_out is NULL
 *   TDM_ERR_NOT_FOUND    no such file
 *   TDM_ERR_IO           the file cannot be opened, stat'ed, read or mapped, or is not a
 *                        regular file (strerror in err)
 *   TDM_ERR_FORMAT       any malformation above
 *   TDM_ERR_UNSUPPORTED  a dtype Tandem does not know (e.g. "F8_E5M2"), or more than
 *                        ENGINE_TENSOR_MAX_DIMS dimensions
 *   TDM_ERR_NO_MEMORY
 *
 * The mapping stays valid until close; if another process truncates the file meanwhile, reads
 * of the lost pages raise SIGBUS (nothing in-process can prevent that). Thread-safe: an open
 * file is never modified, so any thread may read it concurrently.
 */
tdm_status_t engine_st_file_open(const char *path, engine_st_file_t **file_out, char *err,
                                 size_t err_bytes);

/* Bytes of the transparent huge pages engine_st_file_copy_resident asks for (x86-64 and aarch64
 * with 4 KiB base pages: 2 MiB). */
#define ENGINE_ST_HUGE_PAGE_BYTES (2u << 20)

/*
 * engine_st_file_copy_resident - the file's bytes copied into private anonymous memory aligned
 * to ENGINE_ST_HUGE_PAGE_BYTES and advised MADV_HUGEPAGE (Linux madvise(2): transparent huge
 * pages where the kernel has them enabled as "madvise" or "always"), made read-only, and the
 * file's mapping dropped: every tensor's data then points into the copy (the same offsets, the
 * same bytes). For weights the CPU kernels stream every step: a decode step reads hundreds of
 * small matrices, and 2 MiB pages take the page walks of 4 KiB pages off that stream
 * (docs/BENCHMARKS.md). The copy is anonymous memory: resident until close, as the file's pages
 * would be once read, but not reclaimable, and it holds the whole file (a tensor the model never
 * reads, such as a skipped vision tensor, too; it would stay on disk under a mapping). Call
 * before taking tensor data pointers (older ones dangle). A second call is a no-op.
 *
 * *huge_bytes_out (may be NULL): bytes advised for huge pages (0 when the advice was refused,
 * e.g. a kernel without transparent huge pages; the copy still works on base pages).
 * Returns TDM_OK, or with a message in err (file untouched):
 *   TDM_ERR_INVALID_ARG  file is NULL
 *   TDM_ERR_NO_MEMORY    no memory for the copy
 *   TDM_ERR_IO           another mmap or mprotect failure (strerror in err)
 * Not thread-safe with readers of the same file.
 */
tdm_status_t engine_st_file_copy_resident(engine_st_file_t *file, uint64_t *huge_bytes_out,
                                          char *err, size_t err_bytes);

/* engine_st_file_close - unmap the file and free everything it owns; accepts NULL. */
void engine_st_file_close(engine_st_file_t *file);

/* engine_st_file_path - the path the file was opened with (owned by the file). */
const char *engine_st_file_path(const engine_st_file_t *file);

/* engine_st_file_n_tensors - number of tensors in the file (0 is valid). */
size_t engine_st_file_n_tensors(const engine_st_file_t *file);

/*
 * engine_st_file_tensor_at - tensor i (0 <= i < n_tensors), in ascending strcmp order of the
 * names; NULL when i is out of range. Owned by the file.
 */
const engine_st_tensor_t *engine_st_file_tensor_at(const engine_st_file_t *file, size_t i);

/*
 * engine_st_file_find - the tensor named exactly `name` (binary search, O(log n)), or NULL.
 * Owned by the file.
 */
const engine_st_tensor_t *engine_st_file_find(const engine_st_file_t *file, const char *name);

/* engine_st_file_metadata - the "__metadata__" value for `key`, or NULL. Owned by the file. */
const char *engine_st_file_metadata(const engine_st_file_t *file, const char *key);

/* engine_st_file_n_metadata - number of "__metadata__" entries. */
size_t engine_st_file_n_metadata(const engine_st_file_t *file);

/*
 * engine_st_file_metadata_at - entry i of "__metadata__", in ascending strcmp order of the keys.
 * Returns TDM_OK with *key_out and *value_out (owned by the file), or TDM_ERR_INVALID_ARG when
 * i is out of range (outputs untouched).
 */
tdm_status_t engine_st_file_metadata_at(const engine_st_file_t *file, size_t i,
                                        const char **key_out, const char **value_out);

/*
 * engine_st_file_header_bytes - the header length N from the first 8 bytes; the data region
 * starts at file offset 8 + N.
 */
uint64_t engine_st_file_header_bytes(const engine_st_file_t *file);

/*
 * engine_st_writer_create - start a writer for the file at `path`. Nothing touches the disk
 * until engine_st_writer_finish().
 *
 * Returns TDM_OK and *writer_out (caller destroys with engine_st_writer_destroy), or
 * TDM_ERR_INVALID_ARG (path or writer_out NULL or path empty), TDM_ERR_NO_MEMORY; *writer_out
 * untouched on error. A writer is used by one thread at a time.
 */
tdm_status_t engine_st_writer_create(const char *path, engine_st_writer_t **writer_out);

/*
 * engine_st_writer_add - queue one tensor: name (non-empty UTF-8, not "__metadata__"), dtype,
 * n_dims (0..ENGINE_TENSOR_MAX_DIMS) sizes in shape (each >= 0), and n_bytes of row-major data
 * (data may be NULL when n_bytes is 0). The data is copied, so the caller may free it at once;
 * the writer holds every queued byte in memory until finish (about 100 MB is routine).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (logged, writer unchanged) for a bad name, dtype or
 * shape, n_bytes != product(shape) * dtype size, or a writer already finished;
 * TDM_ERR_NO_MEMORY. A repeated name is reported by engine_st_writer_finish().
 */
tdm_status_t engine_st_writer_add(engine_st_writer_t *writer, const char *name,
                                  engine_dtype_t dtype, int n_dims, const int64_t *shape,
                                  const void *data, size_t n_bytes);

/*
 * engine_st_writer_set_metadata - set "__metadata__"[key] = value (both copied, valid UTF-8);
 * setting a key again replaces its value. Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL, empty key,
 * or writer finished; writer unchanged) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_st_writer_set_metadata(engine_st_writer_t *writer, const char *key,
                                           const char *value);

/*
 * engine_st_writer_finish - write the file. Deterministic: tensors sorted by name (strcmp), data
 * offsets contiguous in that order from 0, compact JSON with "__metadata__" first (keys sorted;
 * omitted when no metadata was set) and each entry as {"dtype","shape","data_offsets"}, header
 * padded with spaces to a multiple of ENGINE_ST_HEADER_ALIGN_BYTES: identical inputs give
 * identical bytes whatever the order of the add calls. Writes "<path>.tmp.<pid>" and renames it
 * over `path`, so the file appears complete or not at all.
 *
 * Returns TDM_OK, or (logged; no file at path created or changed) TDM_ERR_INVALID_ARG (two
 * tensors share a name, or already finished), TDM_ERR_IO (create, write or rename failed;
 * strerror logged), TDM_ERR_NO_MEMORY. The writer can only be destroyed afterwards.
 */
tdm_status_t engine_st_writer_finish(engine_st_writer_t *writer);

/* engine_st_writer_destroy - free the writer and its queued copies; accepts NULL. */
void engine_st_writer_destroy(engine_st_writer_t *writer);

#endif
