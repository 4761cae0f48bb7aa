/* startup.h - the first steps of every Tandem executable's main(): flags, --help, log level and
 * signal set-up, written once.
 *
 * Only main() calls these (STYLE.md section 8: modules never read flags or the environment). Owns
 * no state past the call: the flag values land in the caller's config struct (tdm_flags_parse),
 * the log threshold is process-wide (tdm_log_set_level), and signal dispositions and masks are
 * the process's. Knows nothing of any executable's meaning or its exit codes.
 */
#ifndef TANDEM_COMMON_STARTUP_H
#define TANDEM_COMMON_STARTUP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/flags.h"
#include "common/status.h"

/* tdm_main_spec_t.log_level_offset for an executable without a --log-level flag. */
#define TDM_MAIN_NO_LOG_LEVEL SIZE_MAX

/* What one executable (or one sub-command) parses at start-up. */
typedef struct {
    const char *program;     /* e.g. "tandem-router": --help's usage line and every error prefix */
    const char *summary;     /* the paragraph --help prints under the usage line */
    const tdm_flag_t *flags; /* the executable's flag table (STYLE.md section 8) */
    size_t n_flags;          /* entries in `flags` */
    size_t log_level_offset; /* offsetof(cfg, log_level): a `const char *` field holding trace,
                                debug, info, warn, error or off; or TDM_MAIN_NO_LOG_LEVEL */
} tdm_main_spec_t;

/*
 * tdm_main_start - parse argv, TANDEM_* variables and defaults into `cfg` (tdm_flags_parse), print
 * --help, then check the --log-level text and make it the process's log threshold.
 *
 * spec:  the flag table and names above; borrowed for the call.
 * argc / argv: main()'s (argv[0] is skipped; a sub-command passes argc - 1, argv + 1).
 * cfg:   the caller's zeroed config struct; fields are written at each flag's offset, strings
 *        point into argv, the environment or the table.
 * action_out: TDM_FLAGS_RUN (go on) or TDM_FLAGS_HELP (help printed to stdout: exit 0).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG after one line on stderr that names the flag and the allowed
 * values (bad or unknown flag, missing required flag, or "PROGRAM: --log-level=X is invalid:
 * expected trace, debug, info, warn, error or off"), or TDM_ERR_NO_MEMORY. On error `cfg` may be
 * partly written, *action_out is undefined and the log threshold is unchanged; callers exit with
 * their usage status. Call before any thread starts (the log threshold is process-wide).
 */
tdm_status_t tdm_main_start(const tdm_main_spec_t *spec, int argc, char **argv, void *cfg,
                            tdm_flags_action_t *action_out);

/* Options of tdm_signals_install and tdm_signals_block; combine with |. */
typedef enum {
    TDM_SIGNALS_DEFAULT = 0,          /* SIGINT and SIGTERM only */
    TDM_SIGNALS_IGNORE_PIPE = 1 << 0, /* also ignore SIGPIPE: a write to a closed socket or pipe
                                         fails with EPIPE instead of killing the process
                                         (inherited across exec) */
    TDM_SIGNALS_CHILD = 1 << 1,       /* tdm_signals_block only: SIGCHLD joins the blocked set */
} tdm_signals_flags_t;

/* A stop handler: runs in signal context, so it may only store to a `volatile sig_atomic_t` or a
 * lock-free atomic (C11 7.14.1.1). `signo` is SIGINT or SIGTERM. */
typedef void tdm_signal_handler_fn(int signo);

/*
 * tdm_signals_install - run `on_stop` on SIGINT and SIGTERM (empty sa_mask, no SA_RESTART: a
 * blocking call returns EINTR so the main loop sees the stop), plus the options in `flags`.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG if on_stop is NULL or flags holds TDM_SIGNALS_CHILD
 * (nothing changed), or TDM_ERR_IO if sigaction fails (logged with strerror; dispositions set
 * before the failure stay). For the main() of a single-threaded loop that polls its stop flag.
 */
tdm_status_t tdm_signals_install(tdm_signal_handler_fn *on_stop, tdm_signals_flags_t flags);

/*
 * tdm_signals_block - block SIGINT and SIGTERM (and SIGCHLD with TDM_SIGNALS_CHILD) in the calling
 * thread, so every thread it creates afterwards inherits the mask and main() can take them
 * synchronously with sigwait(set_out, &signo); ignores SIGPIPE with TDM_SIGNALS_IGNORE_PIPE.
 * With TDM_SIGNALS_CHILD it also sets SIGCHLD's disposition back to the default: one ignored by
 * the parent that exec'd this process would make the kernel reap the children itself, and
 * waitpid would never report their exits (POSIX.1-2008, waitpid; SA_NOCLDWAIT).
 *
 * set_out: written with the blocked set (only on success).
 * Returns TDM_OK, or TDM_ERR_IO if pthread_sigmask or sigaction fails (logged). Call before any
 * thread starts; a child process forked later inherits the mask and must unblock it itself.
 */
tdm_status_t tdm_signals_block(tdm_signals_flags_t flags, sigset_t *set_out);

#endif
