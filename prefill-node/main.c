/* tandem-prefill - a prefill node: takes prefill jobs from the router, pulls the session's
 * pages from the decode node, runs the CED prefill and puts the new pages into the decode node's
 * reservation, then sends the completion notice (ARCHITECTURE.md, docs/PROTOCOL.md section 7).
 * Runs until SIGINT or SIGTERM, then says Goodbye and stops. The node is prefill.h; this file
 * holds its own flags (node/node_worker.h adds the shared ones).
 */
#include <stddef.h>
#include <string.h>

#include "common/flags.h"
#include "node/node_worker.h"
#include "prefill-node/prefill.h"

static const tdm_flag_t prefill_flags[] = {
    {"pages", TDM_FLAG_U32, "4096", offsetof(prefill_node_params_t, pages),
     "local KV pages (a job's history plus its sequence at T)", 16, 16777216, 0},
    {"max-jobs", TDM_FLAG_U32, "8", offsetof(prefill_node_params_t, max_jobs),
     "prefill jobs started at once and batched into one engine call per step (1: one job at a "
     "time)",
     1, 64, 0},
    {"batch-tokens", TDM_FLAG_U32, "256", offsetof(prefill_node_params_t, batch_tokens),
     "delta tokens one prefill step takes over the started jobs, oldest first, at most "
     "--chunk-tokens per job (0: --chunk-tokens)",
     0, 1048576, 0},
    {"history-cache-mb", TDM_FLAG_U32, "512", offsetof(prefill_node_params_t, history_cache_mb),
     "MiB of recently used sessions' history pages kept here, so a session's next turn pulls only "
     "the pages it lacks or that changed (LRU; 0: off, every turn pulls the whole history)",
     0, 1048576, 0},
    {"state-inband", TDM_FLAG_BOOL, "false", offsetof(prefill_node_params_t, state_inband),
     "send the state record and page checksums of a finished job through the router inside the "
     "CompletionNotice (the path before issue 18), not straight to the decode node in a transfer "
     "notice: for rolling upgrades while decode nodes older than the direct path still run",
     0, 1, 0},
};

int main(int argc, char **argv)
{
    static const node_worker_main_t spec = {
        "tandem-prefill", "Tandem prefill node: CED prefill jobs with UCX page transfer",
        prefill_flags, sizeof(prefill_flags) / sizeof(prefill_flags[0]),
        offsetof(prefill_node_params_t, worker)};
    prefill_node_params_t params;
    tdm_flags_action_t action;
    int rc;

    memset(&params, 0, sizeof(params));
    rc = node_worker_main_start(&spec, argc, argv, &params, &action);
    if (rc != NODE_EXIT_OK || action == TDM_FLAGS_HELP) {
        return rc;
    }
    return prefill_node_run(&params);
}
