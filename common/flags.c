#include "common/flags.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FLAG_ENV_NAME_BYTES 128

static const char *type_label(tdm_flag_type_t type)
{
    switch (type) {
    case TDM_FLAG_STRING:
        return "TEXT";
    case TDM_FLAG_PATH:
        return "PATH";
    case TDM_FLAG_U32:
    case TDM_FLAG_U64:
        return "N";
    case TDM_FLAG_I64:
        return "INT";
    case TDM_FLAG_F64:
        return "X";
    case TDM_FLAG_BOOL:
        return "";
    }
    return "";
}

static void env_name(const char *flag_name, char *out, size_t out_bytes)
{
    size_t n = (size_t)snprintf(out, out_bytes, "TANDEM_");
    for (const char *c = flag_name; *c != '\0' && n + 1 < out_bytes; c++) {
        out[n++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
    }
    out[n] = '\0';
}

static int has_range(const tdm_flag_t *flag)
{
    return flag->min != 0.0 || flag->max != 0.0;
}

/* "[min..max]" (help) or "[min, max]" (errors): integer flags print their bounds as integers
 * (%.0f is exact for every bound below 2^53), not %g's 4.29497e+09. */
static void format_range(const tdm_flag_t *flag, const char *sep, char *buf, size_t n_buf)
{
    if (flag->type == TDM_FLAG_U32 || flag->type == TDM_FLAG_U64 || flag->type == TDM_FLAG_I64) {
        snprintf(buf, n_buf, "[%.0f%s%.0f]", flag->min, sep, flag->max);
    } else {
        snprintf(buf, n_buf, "[%g%s%g]", flag->min, sep, flag->max);
    }
}

static tdm_status_t range_error(const char *program, const tdm_flag_t *flag, const char *text,
                                const char *source)
{
    char range[96];

    if (has_range(flag)) {
        format_range(flag, ", ", range, sizeof(range));
        fprintf(stderr, "%s: --%s=%s (from %s) is invalid: expected %s in %s\n", program,
                flag->name, text, source, type_label(flag->type), range);
    } else {
        fprintf(stderr, "%s: --%s=%s (from %s) is invalid: expected %s\n", program, flag->name,
                text, source, flag->type == TDM_FLAG_I64 ? "an integer" : "a number");
    }
    return TDM_ERR_INVALID_ARG;
}

static tdm_status_t set_value(const tdm_flag_t *flag, const char *text, const char *source,
                              const char *program, void *cfg)
{
    unsigned char *field = (unsigned char *)cfg + flag->offset;
    char *end = NULL;

    switch (flag->type) {
    case TDM_FLAG_STRING:
    case TDM_FLAG_PATH:
        if (text[0] == '\0') {
            fprintf(stderr, "%s: --%s (from %s) must not be empty\n", program, flag->name,
                    source);
            return TDM_ERR_INVALID_ARG;
        }
        memcpy(field, &text, sizeof(text));
        return TDM_OK;
    case TDM_FLAG_BOOL: {
        int value;
        if (strcasecmp(text, "1") == 0 || strcasecmp(text, "true") == 0 ||
            strcasecmp(text, "yes") == 0 || strcasecmp(text, "on") == 0) {
            value = 1;
        } else if (strcasecmp(text, "0") == 0 || strcasecmp(text, "false") == 0 ||
                   strcasecmp(text, "no") == 0 || strcasecmp(text, "off") == 0) {
            value = 0;
        } else {
            fprintf(stderr, "%s: --%s=%s (from %s) is invalid: expected true or false\n",
                    program, flag->name, text, source);
            return TDM_ERR_INVALID_ARG;
        }
        memcpy(field, &value, sizeof(value));
        return TDM_OK;
    }
    case TDM_FLAG_U32:
    case TDM_FLAG_U64: {
        unsigned long long value;
        if (text[0] == '-' || !isdigit((unsigned char)text[0])) {
            return range_error(program, flag, text, source);
        }
        errno = 0;
        value = strtoull(text, &end, 10);
        if (errno != 0 || *end != '\0' ||
            (flag->type == TDM_FLAG_U32 && value > UINT32_MAX) ||
            (has_range(flag) && ((double)value < flag->min || (double)value > flag->max))) {
            return range_error(program, flag, text, source);
        }
        if (flag->type == TDM_FLAG_U32) {
            uint32_t v32 = (uint32_t)value;
            memcpy(field, &v32, sizeof(v32));
        } else {
            uint64_t v64 = (uint64_t)value;
            memcpy(field, &v64, sizeof(v64));
        }
        return TDM_OK;
    }
    case TDM_FLAG_I64: {
        long long value;
        errno = 0;
        value = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' ||
            (has_range(flag) && ((double)value < flag->min || (double)value > flag->max))) {
            return range_error(program, flag, text, source);
        }
        int64_t v64 = (int64_t)value;
        memcpy(field, &v64, sizeof(v64));
        return TDM_OK;
    }
    case TDM_FLAG_F64: {
        double value;
        errno = 0;
        value = strtod(text, &end);
        /* strtod reports underflow (a subnormal or zero result, e.g. 1e-310) as ERANGE; the value
         * is still the nearest double, so only overflow is an error. */
        if (errno == ERANGE && fabs(value) <= DBL_MIN) {
            errno = 0;
        }
        if (errno != 0 || end == text || *end != '\0' || !isfinite(value) ||
            (has_range(flag) && (value < flag->min || value > flag->max))) {
            return range_error(program, flag, text, source);
        }
        memcpy(field, &value, sizeof(value));
        return TDM_OK;
    }
    }
    return TDM_ERR_INVALID_ARG;
}

static const tdm_flag_t *find_flag(const tdm_flag_t *flags, size_t n_flags, const char *name,
                                   size_t name_len)
{
    for (size_t i = 0; i < n_flags; i++) {
        if (strlen(flags[i].name) == name_len && strncmp(flags[i].name, name, name_len) == 0) {
            return &flags[i];
        }
    }
    return NULL;
}

void tdm_flags_print_help(const tdm_flag_t *flags, size_t n_flags, const char *program,
                          const char *summary, FILE *out)
{
    char env[FLAG_ENV_NAME_BYTES];

    fprintf(out, "usage: %s [flags]\n\n%s\n\nflags (each also read from TANDEM_<FLAG>):\n",
            program, summary != NULL ? summary : "");
    for (size_t i = 0; i < n_flags; i++) {
        char left[96];
        snprintf(left, sizeof(left), "--%s %s", flags[i].name, type_label(flags[i].type));
        env_name(flags[i].name, env, sizeof(env));
        fprintf(out, "  %-28s %s", left, flags[i].help);
        if (flags[i].required) {
            fprintf(out, " (required)");
        } else if (flags[i].default_value != NULL) {
            fprintf(out, " (default %s)", flags[i].default_value);
        }
        if (has_range(&flags[i])) {
            char range[96];

            format_range(&flags[i], "..", range, sizeof(range));
            fprintf(out, " %s", range);
        }
        fprintf(out, " [%s]\n", env);
    }
    fprintf(out, "  %-28s %s\n", "--help", "print this help and exit");
}

tdm_status_t tdm_flags_parse(const tdm_flag_t *flags, size_t n_flags, int argc, char **argv,
                             const char *program, const char *summary, void *cfg,
                             const char **positional_out, int *n_positional_out,
                             tdm_flags_action_t *action_out)
{
    char env[FLAG_ENV_NAME_BYTES];
    unsigned char *seen;
    tdm_status_t status = TDM_OK;
    int n_positional = 0;

    seen = calloc(n_flags + 1, 1);
    if (seen == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *action_out = TDM_FLAGS_RUN;

    for (int i = 1; i < argc && status == TDM_OK; i++) {
        const char *arg = argv[i];
        const char *name;
        const char *eq;
        const char *value;
        const tdm_flag_t *flag;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            tdm_flags_print_help(flags, n_flags, program, summary, stdout);
            *action_out = TDM_FLAGS_HELP;
            free(seen);
            return TDM_OK;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (positional_out == NULL) {
                fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", program, arg);
                status = TDM_ERR_INVALID_ARG;
                break;
            }
            positional_out[n_positional++] = arg;
            continue;
        }
        name = arg + 2;
        eq = strchr(name, '=');
        flag = find_flag(flags, n_flags, name, eq != NULL ? (size_t)(eq - name) : strlen(name));
        if (flag == NULL) {
            fprintf(stderr, "%s: unknown flag '%s' (see --help)\n", program, arg);
            status = TDM_ERR_INVALID_ARG;
            break;
        }
        if (eq != NULL) {
            value = eq + 1;
        } else if (flag->type == TDM_FLAG_BOOL) {
            value = "true";
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            fprintf(stderr, "%s: flag --%s needs a value (see --help)\n", program, flag->name);
            status = TDM_ERR_INVALID_ARG;
            break;
        }
        status = set_value(flag, value, "command line", program, cfg);
        seen[flag - flags] = 1;
    }

    for (size_t f = 0; f < n_flags && status == TDM_OK; f++) {
        const char *text;
        if (seen[f]) {
            continue;
        }
        env_name(flags[f].name, env, sizeof(env));
        text = getenv(env);
        if (text != NULL) {
            status = set_value(&flags[f], text, env, program, cfg);
        } else if (flags[f].default_value != NULL) {
            status = set_value(&flags[f], flags[f].default_value, "default", program, cfg);
        } else if (flags[f].required) {
            fprintf(stderr, "%s: missing required flag --%s (or %s); see --help\n", program,
                    flags[f].name, env);
            status = TDM_ERR_INVALID_ARG;
        }
    }

    free(seen);
    if (status == TDM_OK && n_positional_out != NULL) {
        *n_positional_out = n_positional;
    }
    return status;
}
