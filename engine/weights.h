/* weights.h - a model checkpoint directory: its safetensors shards, mapped, and name lookup.
 *
 * Owns the open shards of one checkpoint (engine/safetensors.h) and a hash table from every
 * tensor name to its tensor; checks a checkpoint against the tensor specs the inventory derives
 * from the config (MODEL.md section 3), and writes sharded checkpoints for the generator.
 * Knows nothing of what the tensors mean, of configs, or of devices: data stays in the
 * read-only mappings until the engine copies or uploads it.
 *
 * Layout (the Hugging Face sharded-checkpoint convention): either
 *   model.safetensors.index.json  {"metadata": {"total_size": bytes},
 *                                  "weight_map": {"tensor name": "shard file name", ...}}
 *   plus each shard file it names, or a single model.safetensors.
 */
#ifndef TANDEM_ENGINE_WEIGHTS_H
#define TANDEM_ENGINE_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"

#define ENGINE_WEIGHTS_INDEX_FILE  "model.safetensors.index.json"
#define ENGINE_WEIGHTS_SINGLE_FILE "model.safetensors"

/* Longest name engine_weights_find() tries scale aliases for, in bytes (with the NUL). */
#define ENGINE_WEIGHTS_ALIAS_NAME_BYTES 512

/* An open checkpoint; opaque. Read-only after open: any thread may call find/check/tensor_at. */
typedef struct engine_weights engine_weights_t;

/*
 * engine_weights_open - open the checkpoint in directory `dir`.
 *
 * With model.safetensors.index.json: maps every shard its weight_map names once, and requires
 * the index and the shards to agree exactly (each weight_map entry is in the shard it names,
 * each shard tensor is in the index under its shard, no name in two shards). A metadata.total_size
 * that differs from the sum of the tensors' bytes is logged as a warning, not refused. Without an
 * index: maps model.safetensors.
 *
 * Returns TDM_OK and *weights_out (caller closes with engine_weights_close), or, with a message
 * naming the file, shard and tensor at fault in err (err_bytes, may be 0) and *weights_out
 * untouched:
 *   TDM_ERR_INVALID_ARG  dir or weights_out is NULL
 *   TDM_ERR_NOT_FOUND    neither file exists, or the index names a shard that does not exist
 *   TDM_ERR_FORMAT       the index is not JSON, lacks a weight_map object, maps a name to
 *                        something other than a plain file name in dir, or a shard is malformed
 *                        (engine_st_file_open)
 *   TDM_ERR_MISMATCH     index and shards disagree as above
 *   TDM_ERR_IO, TDM_ERR_UNSUPPORTED, TDM_ERR_NO_MEMORY  from opening a shard
 */
tdm_status_t engine_weights_open(const char *dir, engine_weights_t **weights_out, char *err,
                                 size_t err_bytes);

/*
 * engine_weights_copy_resident - engine_st_file_copy_resident on every shard: the tensors' bytes
 * in read-only anonymous memory advised for 2 MiB transparent huge pages instead of the file
 * mappings. Tensor pointers taken before the call dangle; take them after. *huge_bytes_out (may
 * be NULL): bytes advised for huge pages over all shards. Returns TDM_OK, or the first shard's
 * failure (TDM_ERR_NO_MEMORY, TDM_ERR_IO; TDM_ERR_INVALID_ARG for NULL) with a message in err;
 * shards copied before it stay copied (the same bytes: nothing else changes).
 */
tdm_status_t engine_weights_copy_resident(engine_weights_t *weights, uint64_t *huge_bytes_out,
                                          char *err, size_t err_bytes);

/* engine_weights_close - unmap every shard and free the checkpoint; accepts NULL. Every tensor
 * pointer obtained from it becomes invalid. */
void engine_weights_close(engine_weights_t *weights);

/* engine_weights_n_tensors - number of tensors across all shards. */
size_t engine_weights_n_tensors(const engine_weights_t *weights);

/*
 * engine_weights_tensor_at - tensor i (0 <= i < n_tensors) in ascending strcmp order of the
 * names, or NULL when out of range. Owned by the checkpoint; data points into its shard mapping.
 */
const engine_st_tensor_t *engine_weights_tensor_at(const engine_weights_t *weights, size_t i);

/* engine_weights_n_shards - number of mapped shard files (1 for a single model.safetensors). */
size_t engine_weights_n_shards(const engine_weights_t *weights);

/* engine_weights_total_bytes - sum of every tensor's n_bytes. */
uint64_t engine_weights_total_bytes(const engine_weights_t *weights);

/*
 * engine_weights_find - the tensor named `name`, in O(1) expected time (hash table), or NULL.
 * A name ending in ".scale" that is absent is also looked up as "<module>.weight.scale" and
 * then "<module>.weight_scale_inv", where name = "<module>.scale" (MODEL.md 12.2); the returned
 * tensor's name is the one stored. An alias is tried only when it fits in
 * ENGINE_WEIGHTS_ALIAS_NAME_BYTES with its NUL. name must not be NULL. Owned by the checkpoint.
 */
const engine_st_tensor_t *engine_weights_find(const engine_weights_t *weights, const char *name);

/*
 * engine_weights_name_is_vision - 1 if `name` is a vision-tower tensor the text model ignores
 * (MODEL.md section 1): "vision.*", "aligner.*", "image_start*", "image_end*",
 * "image_newline*" or "*.ffn.gate.bias_vl"; else 0.
 */
int engine_weights_name_is_vision(const char *name);

/*
 * engine_weights_check - the checkpoint holds exactly the tensors of `specs` (n_specs entries,
 * e.g. from the inventory), each found by engine_weights_find (scale aliases included) with
 * the spec's dtype (a spec flagged ENGINE_SPEC_FP4_PACKED accepts I8 or U8) and exactly its
 * shape; every checkpoint tensor not matched by a spec is an error unless it is a vision tensor
 * (engine_weights_name_is_vision), which is skipped.
 *
 * Returns TDM_OK, or the status of the first problem with its text in err (err_bytes, may be
 * 0), e.g. "layers.3.attn.wq_a.weight: shape [64, 128] expected [64, 256]", followed by how many
 * more there are; every problem is logged. Specs are checked in order, then unexpected tensors
 * in name order.
 *   TDM_ERR_NOT_FOUND    a spec's tensor is absent
 *   TDM_ERR_MISMATCH     a dtype or shape differs, or a tensor is not expected
 *   TDM_ERR_INVALID_ARG  a spec is malformed (bad dtype or n_dims) or names a tensor an
 *                        earlier spec already matched
 *   TDM_ERR_NO_MEMORY
 * Borrows specs for the call; changes nothing.
 */
tdm_status_t engine_weights_check(const engine_weights_t *weights,
                                  const engine_tensor_spec_t *specs, size_t n_specs, char *err,
                                  size_t err_bytes);

/*
 * engine_weights_write_sharded - write a sharded checkpoint into `dir` (created if missing, one
 * level): tensors sorted by name (strcmp) go, in that order, into shards of at most
 * max_shard_bytes tensor bytes each (a bigger tensor gets a shard of its own), named
 * "model-00001-of-0000N.safetensors" (engine_st_writer_finish format), then
 * model.safetensors.index.json with metadata.total_size (sum of n_bytes) and the weight_map,
 * keys sorted, 2-space indented, newline-terminated. Identical inputs give identical files
 * whatever the input order. Existing files of those names are replaced; other files in dir are
 * left alone. The index is written last, each file via a temporary and rename; a failure part-way
 * leaves any earlier index in place, which engine_weights_open then finds inconsistent.
 *
 * tensors: n_tensors >= 1 records; name, dtype, n_dims, shape, data and n_bytes are read
 * (data_offset ignored), borrowed for the call; each shard's data is copied once while written.
 * Returns TDM_OK, or with a message in err: TDM_ERR_INVALID_ARG (NULL or empty input,
 * max_shard_bytes 0, a bad tensor record, a repeated name; nothing written), TDM_ERR_IO (cannot
 * create dir or a file: strerror in err, or logged by engine_st_writer_finish for a shard),
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_weights_write_sharded(const char *dir, const engine_st_tensor_t *tensors,
                                          size_t n_tensors, size_t max_shard_bytes, char *err,
                                          size_t err_bytes);

#endif
