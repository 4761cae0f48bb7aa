#include "common/startup.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

tdm_status_t tdm_main_start(const tdm_main_spec_t *spec, int argc, char **argv, void *cfg,
                            tdm_flags_action_t *action_out)
{
    tdm_flags_action_t action;
    tdm_log_level_t level;
    const char *text;
    tdm_status_t status;

    status = tdm_flags_parse(spec->flags, spec->n_flags, argc, argv, spec->program, spec->summary,
                             cfg, NULL, NULL, &action);
    if (status != TDM_OK) {
        return status;
    }
    if (action == TDM_FLAGS_RUN && spec->log_level_offset != TDM_MAIN_NO_LOG_LEVEL) {
        memcpy(&text, (const unsigned char *)cfg + spec->log_level_offset, sizeof(text));
        if (tdm_log_level_parse(text, &level) != TDM_OK) {
            fprintf(stderr,
                    "%s: --log-level=%s is invalid: expected trace, debug, info, warn, error or "
                    "off\n",
                    spec->program, text != NULL ? text : "");
            return TDM_ERR_INVALID_ARG;
        }
        tdm_log_set_level(level);
    }
    *action_out = action;
    return TDM_OK;
}

/* Set signo's disposition to `handler` (SIG_IGN or SIG_DFL; empty mask, no flags); what: the
 * action, for the error line. */
static tdm_status_t set_disposition(int signo, void (*handler)(int), const char *what)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signo, &sa, NULL) != 0) {
        tdm_log(TDM_LOG_ERROR, "startup", "cannot %s: error=%s", what, strerror(errno));
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

/* Ignore SIGPIPE when `flags` asks for it. */
static tdm_status_t ignore_pipe(tdm_signals_flags_t flags)
{
    if ((flags & TDM_SIGNALS_IGNORE_PIPE) == 0) {
        return TDM_OK;
    }
    return set_disposition(SIGPIPE, SIG_IGN, "ignore SIGPIPE");
}

tdm_status_t tdm_signals_install(tdm_signal_handler_fn *on_stop, tdm_signals_flags_t flags)
{
    static const int stop_signals[] = {SIGINT, SIGTERM};
    struct sigaction sa;

    if (on_stop == NULL || (flags & TDM_SIGNALS_CHILD) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(stop_signals) / sizeof(stop_signals[0]); i++) {
        if (sigaction(stop_signals[i], &sa, NULL) != 0) {
            tdm_log(TDM_LOG_ERROR, "startup", "cannot handle signal: signal=%d error=%s",
                    stop_signals[i], strerror(errno));
            return TDM_ERR_IO;
        }
    }
    return ignore_pipe(flags);
}

tdm_status_t tdm_signals_block(tdm_signals_flags_t flags, sigset_t *set_out)
{
    sigset_t set;
    int rc;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if ((flags & TDM_SIGNALS_CHILD) != 0) {
        /* An ignored SIGCHLD (inherited across exec from a parent that set it) makes the kernel
         * reap the children itself: waitpid would never report their exits. */
        if (set_disposition(SIGCHLD, SIG_DFL, "reset SIGCHLD") != TDM_OK) {
            return TDM_ERR_IO;
        }
        sigaddset(&set, SIGCHLD);
    }
    rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (rc != 0) {
        tdm_log(TDM_LOG_ERROR, "startup", "cannot block signals: error=%s", strerror(rc));
        return TDM_ERR_IO;
    }
    if (ignore_pipe(flags) != TDM_OK) {
        return TDM_ERR_IO;
    }
    *set_out = set;
    return TDM_OK;
}
