#include "engine/tensor.h"

#include <string.h>

typedef struct {
    const char *name;
    size_t size_bytes;
} dtype_info_t;

static const dtype_info_t dtype_table[ENGINE_DTYPE_COUNT] = {
    [ENGINE_DTYPE_BF16] = {"BF16", 2},   [ENGINE_DTYPE_F16] = {"F16", 2},
    [ENGINE_DTYPE_F32] = {"F32", 4},     [ENGINE_DTYPE_F64] = {"F64", 8},
    [ENGINE_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [ENGINE_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
    [ENGINE_DTYPE_I8] = {"I8", 1},       [ENGINE_DTYPE_U8] = {"U8", 1},
    [ENGINE_DTYPE_I16] = {"I16", 2},     [ENGINE_DTYPE_I32] = {"I32", 4},
    [ENGINE_DTYPE_I64] = {"I64", 8},     [ENGINE_DTYPE_BOOL] = {"BOOL", 1},
};

const char *engine_dtype_name(engine_dtype_t dtype)
{
    if ((unsigned)dtype >= ENGINE_DTYPE_COUNT) {
        return "?";
    }
    return dtype_table[dtype].name;
}

tdm_status_t engine_dtype_parse(const char *name, engine_dtype_t *dtype_out)
{
    for (int i = 0; i < ENGINE_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *dtype_out = (engine_dtype_t)i;
            return TDM_OK;
        }
    }
    return TDM_ERR_UNSUPPORTED;
}

size_t engine_dtype_size_bytes(engine_dtype_t dtype)
{
    if ((unsigned)dtype >= ENGINE_DTYPE_COUNT) {
        return 0;
    }
    return dtype_table[dtype].size_bytes;
}
