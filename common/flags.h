/* flags.h - one table of long flags per executable: parsing, TANDEM_* environment fallbacks,
 * defaults, range checks and --help all come from it (STYLE.md section 8).
 *
 * Precedence: command line, then the TANDEM_<NAME> environment variable (name upper-cased, '-'
 * becomes '_'), then the table's default. Values are written into a caller-owned config struct at
 * each flag's byte offset. String values point into argv, the environment or the table (never
 * copied; they live as long as the process). Knows nothing of any executable's meaning.
 */
#ifndef TANDEM_COMMON_FLAGS_H
#define TANDEM_COMMON_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

typedef enum {
    TDM_FLAG_STRING, /* const char * field; NULL when no default */
    TDM_FLAG_PATH,   /* const char * field, a filesystem path */
    TDM_FLAG_U32,    /* uint32_t field, decimal, within [min, max] */
    TDM_FLAG_U64,    /* uint64_t field, decimal, within [min, max] */
    TDM_FLAG_I64,    /* int64_t field, decimal, within [min, max] */
    TDM_FLAG_F64,    /* double field, finite, within [min, max] */
    TDM_FLAG_BOOL,   /* int field (0/1); `--name` alone sets 1; value true/false/1/0/yes/no */
} tdm_flag_type_t;

/* One flag. min/max bound numeric types (ignored when both are 0). */
typedef struct {
    const char *name;          /* long name without dashes, e.g. "max-tokens" */
    tdm_flag_type_t type;      /* how the text is parsed and where it goes */
    const char *default_value; /* text form of the default, or NULL (required if `required`) */
    size_t offset;             /* offsetof(cfg_struct, field) */
    const char *help;          /* one line for --help */
    double min;                /* inclusive lower bound for numeric flags */
    double max;                /* inclusive upper bound for numeric flags */
    int required;              /* 1: missing from argv, env and default is an error */
} tdm_flag_t;

/* Outcome of tdm_flags_parse beyond the status. */
typedef enum {
    TDM_FLAGS_RUN = 0,  /* parsed; the program should run */
    TDM_FLAGS_HELP = 1, /* --help was given and printed; exit 0 */
} tdm_flags_action_t;

/*
 * tdm_flags_parse - fill `cfg` from argv, the environment and defaults.
 *
 * flags:    table of n_flags entries. cfg: caller's struct, fields at each flag's offset.
 * program / summary: used in --help and error messages.
 * positional_out / n_positional_out: optional (may be NULL): argv entries that are not flags, in
 *   order (pointers into argv; array storage must hold argc entries). Without it any positional
 *   argument is an error.
 *
 * Returns TDM_OK with *action_out set, or TDM_ERR_INVALID_ARG after printing one line to stderr
 * naming the flag and the allowed values (unknown flag, missing value, bad number, out of range,
 * missing required flag). `cfg` may be partly written on error; callers exit on error.
 */
tdm_status_t tdm_flags_parse(const tdm_flag_t *flags, size_t n_flags, int argc, char **argv,
                             const char *program, const char *summary, void *cfg,
                             const char **positional_out, int *n_positional_out,
                             tdm_flags_action_t *action_out);

/* tdm_flags_print_help - write usage, summary and one line per flag (type, default, env) to out. */
void tdm_flags_print_help(const tdm_flag_t *flags, size_t n_flags, const char *program,
                          const char *summary, FILE *out);

#endif
