/* device.c - kern_device_t: parse a --device value and pick its kernel table (device.h). */
#include "kernels/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/guard.h"

#ifdef TANDEM_HAVE_CUDA
/* Defined in kernels/cuda/backend.cu. */
int kern_cuda_probe_count(const char **reason);
int kern_cuda_select(int ordinal, const char **reason);
int kern_cuda_query(int ordinal, kern_device_info_t *out, const char **reason);
#endif

#define DEVICE_MAX_ORDINAL 1023
#define DEVICE_GUARD_BYTES ((size_t)4 << 30) /* "guard": the region's default size */

static void set_err(char *err, size_t err_bytes, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, fmt, a, b);
    }
}

tdm_status_t kern_device_parse(const char *text, kern_device_t *out, char *err, size_t err_bytes)
{
    static const char forms[] = "cpu, cuda or cuda:N (N = 0..1023), or guard (a checking backend)";
    kern_device_t dev = {KERN_BACKEND_CPU, 0};
    const char *p;
    int n = 0;

    if (text == NULL || out == NULL) {
        set_err(err, err_bytes, "device: %s%s", "no value given", "");
        return TDM_ERR_INVALID_ARG;
    }
    if (strcmp(text, "cpu") == 0) {
        *out = dev;
        return TDM_OK;
    }
    if (strcmp(text, "guard") == 0) {
        dev.backend = KERN_BACKEND_GUARD;
        *out = dev;
        return TDM_OK;
    }
    if (strncmp(text, "cuda", 4) != 0 || (text[4] != '\0' && text[4] != ':')) {
        set_err(err, err_bytes, "device '%s': expected %s", text, forms);
        return TDM_ERR_INVALID_ARG;
    }
    dev.backend = KERN_BACKEND_CUDA;
    if (text[4] == ':') {
        p = text + 5;
        if (*p == '\0' || strlen(p) > 4) {
            set_err(err, err_bytes, "device '%s': expected %s", text, forms);
            return TDM_ERR_INVALID_ARG;
        }
        for (; *p != '\0'; p++) {
            if (*p < '0' || *p > '9') {
                set_err(err, err_bytes, "device '%s': expected %s", text, forms);
                return TDM_ERR_INVALID_ARG;
            }
            n = n * 10 + (*p - '0');
        }
        if (n > DEVICE_MAX_ORDINAL) {
            set_err(err, err_bytes, "device '%s': expected %s", text, forms);
            return TDM_ERR_INVALID_ARG;
        }
    }
    dev.ordinal = n;
    *out = dev;
    return TDM_OK;
}

tdm_status_t kern_device_parse_list(const char *text, kern_device_t *devices, int max_devices,
                                    int *n_out, char *err, size_t err_bytes)
{
    kern_device_t parsed[KERN_DEVICE_LIST_MAX];
    int n = 0;
    const char *p = text;

    if (text == NULL || devices == NULL || n_out == NULL || max_devices < 1) {
        set_err(err, err_bytes, "devices: %s%s", "no value given", "");
        return TDM_ERR_INVALID_ARG;
    }
    for (;;) {
        char item[KERN_DEVICE_TEXT_MAX];
        char full[KERN_DEVICE_TEXT_MAX + 8];
        size_t len = strcspn(p, ",");
        tdm_status_t st;

        if (len == 0 || len >= sizeof(item)) {
            set_err(err, err_bytes, "devices '%s': %s", text,
                    "an empty or overlong item (expected e.g. 0,1 or cuda:0,cuda:1 or cpu,cpu)");
            return TDM_ERR_INVALID_ARG;
        }
        if (n == max_devices || n == KERN_DEVICE_LIST_MAX) {
            set_err(err, err_bytes, "devices '%s': %s", text, "more devices than ranks allowed");
            return TDM_ERR_INVALID_ARG;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        /* a bare ordinal is cuda:N */
        snprintf(full, sizeof(full), "%s%s", item[0] >= '0' && item[0] <= '9' ? "cuda:" : "",
                 item);
        st = kern_device_parse(full, &parsed[n], err, err_bytes);
        if (st != TDM_OK) {
            return st;
        }
        if (parsed[n].backend == KERN_BACKEND_GUARD) {
            /* one guard table per process, driven from one thread at a time (kernels/guard.h) */
            set_err(err, err_bytes, "devices '%s': %s", text,
                    "guard runs one device per process, not a group");
            return TDM_ERR_INVALID_ARG;
        }
        for (int q = 0; q < n; q++) {
            if (parsed[n].backend == KERN_BACKEND_CUDA && parsed[q].backend == KERN_BACKEND_CUDA &&
                parsed[q].ordinal == parsed[n].ordinal) {
                set_err(err, err_bytes, "devices '%s': %s", text, "a CUDA device named twice");
                return TDM_ERR_INVALID_ARG;
            }
        }
        n++;
        p += len;
        if (*p == '\0') {
            break;
        }
        p++;
    }
    memcpy(devices, parsed, (size_t)n * sizeof(kern_device_t));
    *n_out = n;
    return TDM_OK;
}

const char *kern_device_name(const kern_device_t *dev, char *buf, size_t bytes)
{
    if (buf == NULL || bytes == 0) {
        return buf;
    }
    if (dev != NULL && dev->backend == KERN_BACKEND_GUARD) {
        snprintf(buf, bytes, "guard");
    } else if (dev == NULL || dev->backend != KERN_BACKEND_CUDA) {
        snprintf(buf, bytes, "cpu");
    } else {
        snprintf(buf, bytes, "cuda:%d", dev->ordinal);
    }
    return buf;
}

/*
 * The process's guard table (kernels/guard.h), made at the first kern_device_ops of "guard" with
 * a region of TANDEM_GUARD_BYTES bytes (reserved, not committed: MAP_NORESERVE; default 4 GiB)
 * and kept until the process exits, so every later open returns the same table.
 */
static tdm_status_t guard_ops(const kern_ops_t **ops_out, char *err, size_t err_bytes)
{
    static const kern_ops_t *table;
    const char *env = getenv("TANDEM_GUARD_BYTES");
    unsigned long long bytes = (unsigned long long)DEVICE_GUARD_BYTES;
    tdm_status_t st;

    if (table != NULL) {
        *ops_out = table;
        return TDM_OK;
    }
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        errno = 0;
        bytes = strtoull(env, &end, 10);
        if (errno != 0 || end == env || *end != '\0' || bytes == 0) {
            set_err(err, err_bytes, "device guard: TANDEM_GUARD_BYTES='%s': %s", env,
                    "expected a positive number of bytes");
            return TDM_ERR_INVALID_ARG;
        }
    }
    st = kern_guard_create((size_t)bytes, &table);
    if (st != TDM_OK) {
        set_err(err, err_bytes, "device guard: %s%s",
                st == TDM_ERR_BUSY ? "a guard table already exists in this process"
                                   : "cannot map the guarded region",
                "");
        return st;
    }
    *ops_out = table;
    return TDM_OK;
}

int kern_cuda_device_count(const char **reason)
{
#ifdef TANDEM_HAVE_CUDA
    return kern_cuda_probe_count(reason);
#else
    if (reason != NULL) {
        *reason = "built without CUDA (nvcc not found at configure time)";
    }
    return 0;
#endif
}

tdm_status_t kern_device_ops(const kern_device_t *dev, const kern_ops_t **ops_out, char *err,
                             size_t err_bytes)
{
    char name[KERN_DEVICE_TEXT_MAX];
    const char *reason = NULL;
    int count;

    if (dev == NULL || ops_out == NULL) {
        set_err(err, err_bytes, "device: %s%s", "no device given", "");
        return TDM_ERR_INVALID_ARG;
    }
    if (dev->backend == KERN_BACKEND_CPU) {
        *ops_out = kern_ops_cpu();
        return TDM_OK;
    }
    if (dev->backend == KERN_BACKEND_GUARD) {
        return guard_ops(ops_out, err, err_bytes);
    }
    if (dev->backend != KERN_BACKEND_CUDA || dev->ordinal < 0) {
        set_err(err, err_bytes, "device: %s%s", "unknown backend", "");
        return TDM_ERR_INVALID_ARG;
    }
    kern_device_name(dev, name, sizeof(name));
    count = kern_cuda_device_count(&reason);
    if (count <= 0) {
        set_err(err, err_bytes, "device %s: CUDA unavailable: %s", name,
                reason != NULL ? reason : "no CUDA device");
        return TDM_ERR_UNSUPPORTED;
    }
    if (dev->ordinal >= count) {
        char have[48];

        snprintf(have, sizeof(have), "%d", count);
        set_err(err, err_bytes, "device %s: not found (the driver reports %s CUDA device(s))", name,
                have);
        return TDM_ERR_NOT_FOUND;
    }
#ifdef TANDEM_HAVE_CUDA
    if (kern_cuda_select(dev->ordinal, &reason) != 0) {
        set_err(err, err_bytes, "device %s: cannot be selected: %s", name,
                reason != NULL ? reason : "cudaSetDevice failed");
        return TDM_ERR_UNSUPPORTED;
    }
#endif
    *ops_out = kern_ops_cuda();
    if (*ops_out == NULL) {
        set_err(err, err_bytes, "device %s: %s", name, "the CUDA kernel table is unavailable");
        return TDM_ERR_UNSUPPORTED;
    }
    return TDM_OK;
}

tdm_status_t kern_device_open(const char *text, kern_device_t *dev_out, const kern_ops_t **ops_out,
                              char *err, size_t err_bytes)
{
    kern_device_t dev;
    const kern_ops_t *ops = NULL;
    tdm_status_t st = kern_device_parse(text, &dev, err, err_bytes);

    if (st == TDM_OK) {
        st = kern_device_ops(&dev, &ops, err, err_bytes);
    }
    if (st != TDM_OK) {
        return st;
    }
    if (dev_out != NULL) {
        *dev_out = dev;
    }
    *ops_out = ops;
    return TDM_OK;
}

tdm_status_t kern_device_info(int ordinal, kern_device_info_t *out, char *err, size_t err_bytes)
{
    kern_device_info_t info;
    const char *reason = NULL;

    if (out == NULL || ordinal < 0) {
        set_err(err, err_bytes, "device info: %s%s", "bad arguments", "");
        return TDM_ERR_INVALID_ARG;
    }
    memset(&info, 0, sizeof(info));
#ifdef TANDEM_HAVE_CUDA
    if (kern_cuda_query(ordinal, &info, &reason) != 0) {
        set_err(err, err_bytes, "device info: %s%s", reason != NULL ? reason : "query failed", "");
        return TDM_ERR_UNSUPPORTED;
    }
    if (info.cc_major == 9) {
        info.bf16_peak_flops = (double)info.n_sms * info.clock_khz * 1e3 * 4096.0;
    } else if (info.cc_major == 10) {
        info.bf16_peak_flops = (double)info.n_sms * info.clock_khz * 1e3 * 8192.0;
    }
    *out = info;
    return TDM_OK;
#else
    (void)info;
    kern_cuda_device_count(&reason);
    set_err(err, err_bytes, "device info: %s%s", reason, "");
    return TDM_ERR_UNSUPPORTED;
#endif
}
