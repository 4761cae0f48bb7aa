#include "common/errbuf.h"

#include <stdio.h>

void tdm_errbuf_vset(char *err, size_t err_bytes, const char *fmt, va_list args)
{
    if (err == NULL || err_bytes == 0) {
        return;
    }
    vsnprintf(err, err_bytes, fmt, args);
}

void tdm_errbuf_set(char *err, size_t err_bytes, const char *fmt, ...)
{
    va_list args;

    va_start(args, fmt);
    tdm_errbuf_vset(err, err_bytes, fmt, args);
    va_end(args);
}
