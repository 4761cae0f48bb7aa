#include "common/log.h"

#include "common/clock.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define LOG_LINE_BYTES 2048

/* The threshold is the one process-wide setting logging needs; main() sets it once. */
static atomic_int log_threshold = TDM_LOG_INFO;

void tdm_log_set_level(tdm_log_level_t level)
{
    atomic_store(&log_threshold, (int)level);
}

tdm_log_level_t tdm_log_get_level(void)
{
    return (tdm_log_level_t)atomic_load(&log_threshold);
}

tdm_status_t tdm_log_level_parse(const char *text, tdm_log_level_t *level_out)
{
    static const char *const names[] = {"trace", "debug", "info", "warn", "error", "off"};

    if (text == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i <= (int)TDM_LOG_OFF; i++) {
        if (strcasecmp(text, names[i]) == 0) {
            *level_out = (tdm_log_level_t)i;
            return TDM_OK;
        }
    }
    return TDM_ERR_INVALID_ARG;
}

void tdm_log(tdm_log_level_t level, const char *module, const char *fmt, ...)
{
    static const char letters[] = "TDIWE";
    char line[LOG_LINE_BYTES];
    struct timespec now;
    struct tm utc;
    size_t used;
    va_list args;

    if ((int)level < atomic_load(&log_threshold) || level >= TDM_LOG_OFF) {
        return;
    }
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &utc);
    used = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &utc);
    used += (size_t)snprintf(line + used, sizeof(line) - used, ".%03ldZ %c %s ",
                             now.tv_nsec / (long)TDM_NS_PER_MS, letters[level],
                             module != NULL ? module : "-");
    if (used < sizeof(line) - 2) {
        va_start(args, fmt);
        int n = vsnprintf(line + used, sizeof(line) - used - 1, fmt, args);
        va_end(args);
        if (n > 0) {
            used += (size_t)n < sizeof(line) - used - 1 ? (size_t)n : sizeof(line) - used - 2;
        }
    }
    line[used++] = '\n';
    line[used] = '\0';
    fputs(line, stderr);
}
