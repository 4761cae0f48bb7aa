/* tensor.h - tensor element types and the tensor-spec record shared by the checkpoint loader,
 * the tensor inventory and the checkpoint writer.
 *
 * Dtype names are the safetensors spellings ("BF16", "F8_E4M3", ...). A spec says what one
 * checkpoint tensor must be (MODEL.md section 3); it owns no data. Implemented in tensor.c.
 */
#ifndef TANDEM_ENGINE_TENSOR_H
#define TANDEM_ENGINE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Element types a Tandem checkpoint may hold (safetensors dtype strings in comments). */
typedef enum {
    ENGINE_DTYPE_BF16 = 0,    /* "BF16" */
    ENGINE_DTYPE_F16 = 1,     /* "F16" (accepted by the reader, unused by the model) */
    ENGINE_DTYPE_F32 = 2,     /* "F32" */
    ENGINE_DTYPE_F64 = 3,     /* "F64" */
    ENGINE_DTYPE_F8_E4M3 = 4, /* "F8_E4M3": OCP E4M3FN codes */
    ENGINE_DTYPE_F8_E8M0 = 5, /* "F8_E8M0": UE8M0 power-of-two scales */
    ENGINE_DTYPE_I8 = 6,      /* "I8": packed E2M1 pairs (FP4 experts) */
    ENGINE_DTYPE_U8 = 7,      /* "U8": packed E2M1 pairs, accepted alias of I8 */
    ENGINE_DTYPE_I16 = 8,     /* "I16" */
    ENGINE_DTYPE_I32 = 9,     /* "I32" */
    ENGINE_DTYPE_I64 = 10,    /* "I64" */
    ENGINE_DTYPE_BOOL = 11,   /* "BOOL" */
    ENGINE_DTYPE_COUNT = 12,
} engine_dtype_t;

#define ENGINE_TENSOR_MAX_DIMS 4
#define ENGINE_TENSOR_NAME_BYTES 96

/* Which part of the model a tensor's parameters count toward (MODEL.md sections 9 and 10). */
typedef enum {
    ENGINE_PART_BACKBONE = 0,     /* layers 0..L-1 plus embed, head, norm */
    ENGINE_PART_ENGRAM_TABLE = 1, /* layers.l.engram.embed.* (host-RAM tables) */
    ENGINE_PART_DSPARK = 2,       /* mtp.k.* draft blocks */
} engine_part_t;

/* Spec flags. */
enum {
    ENGINE_SPEC_FP4_PACKED = 1u << 0, /* packed E2M1 pairs: I8 or U8 accepted */
    ENGINE_SPEC_SCALE = 1u << 1,      /* a quantization scale tensor (no parameters) */
};

/*
 * One tensor a checkpoint must contain: exact name (bare, MODEL.md section 3), dtype, shape.
 * n_params counts logical weights (a packed FP4 tensor [out, in/2] holds out*in parameters;
 * scales hold none). layer: backbone layer index, L+k for DSpark block k, -1 for globals.
 */
typedef struct {
    char name[ENGINE_TENSOR_NAME_BYTES];
    engine_dtype_t dtype;
    int n_dims;
    int64_t shape[ENGINE_TENSOR_MAX_DIMS];
    engine_part_t part;
    int layer;
    uint32_t flags; /* ENGINE_SPEC_* */
    int64_t n_params;
} engine_tensor_spec_t;

/* engine_dtype_name - safetensors spelling ("BF16"); "?" for an out-of-range value. */
const char *engine_dtype_name(engine_dtype_t dtype);

/*
 * engine_dtype_parse - safetensors spelling to enum. Returns TDM_OK, or TDM_ERR_UNSUPPORTED for
 * a name Tandem does not know (*dtype_out untouched).
 */
tdm_status_t engine_dtype_parse(const char *name, engine_dtype_t *dtype_out);

/* engine_dtype_size_bytes - bytes per element (BF16 2, F8_* 1, ...); 0 for an invalid value. */
size_t engine_dtype_size_bytes(engine_dtype_t dtype);

#endif
