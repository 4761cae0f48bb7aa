/* tandem-decode - a decode node: holds sessions' KV pages, takes page writes from prefill
 * nodes, decodes in continuous batches and streams tokens to the router (ARCHITECTURE.md,
 * docs/PROTOCOL.md section 7). Runs until SIGINT (stops at once) or SIGTERM (drains first:
 * --drain-timeout-ms), then says Goodbye and stops.
 * The node is decode.h; this file holds its own flags (node/node_worker.h adds the shared ones).
 */
#include <stddef.h>
#include <string.h>

#include "common/flags.h"
#include "decode-node/decode.h"
#include "node/node_worker.h"

static const tdm_flag_t decode_flags[] = {
    {"pages", TDM_FLAG_U32, "4096", offsetof(decode_node_params_t, pages), "KV pages in the pool",
     16, 16777216, 0},
    {"max-sessions", TDM_FLAG_U32, "1024", offsetof(decode_node_params_t, max_sessions),
     "sessions kept resident (idle ones evicted least recently used first)", 1, 1048576, 0},
    {"max-batch", TDM_FLAG_U32, "64", offsetof(decode_node_params_t, max_batch),
     "sequences per decode step", 1, 64, 0},
    {"fence-ms", TDM_FLAG_U32, "1000", offsetof(decode_node_params_t, fence_ms),
     "an aborted or lapsed reservation keeps its pages this long (remote writes stop by then)", 0,
     600000, 0},
    {"spec", TDM_FLAG_STRING, "off", offsetof(decode_node_params_t, spec),
     "speculative decoding drafter: off, dspark or ngram (MODEL.md 8; output unchanged); a "
     "request's spec field overrides it unless it is off",
     0, 0, 0},
    {"spec-accept", TDM_FLAG_STRING, "coupled", offsetof(decode_node_params_t, spec_accept),
     "acceptance: coupled (token-identical to --spec off) or rejection (same distribution)", 0, 0,
     0},
    {"spec-confidence-threshold", TDM_FLAG_F64, "0.3",
     offsetof(decode_node_params_t, spec_threshold),
     "DSpark verify length: drafts while the confidence product stays above this", 0, 1, 0},
    {"state-wait-ms", TDM_FLAG_U32, "5000", offsetof(decode_node_params_t, state_wait_ms),
     "a remote handoff whose state record travels directly from the prefill node (a UCX "
     "transfer notice, docs/PROTOCOL.md 3b) waits this long for it after the router's message; "
     "then that request fails (ERROR_STATE_LOST) and its reserved pages go back",
     1, 600000, 0},
    {"state-inband", TDM_FLAG_BOOL, "false", offsetof(decode_node_params_t, state_inband),
     "put a continued session's state record at H inline in the reservation descriptor the "
     "router relays (the path before issue 18), not in staged pages the prefill node gets over "
     "UCX: for rolling upgrades while prefill nodes older than the direct path still run",
     0, 1, 0},
    {"prefix-share", TDM_FLAG_BOOL, "false", offsetof(decode_node_params_t, prefix_share),
     "start a new session whose prompt shares whole blocks with a resident session from that "
     "session's KV pages (prefix_session_id) plus a recovery replay: the prefix is computed once, "
     "but the text is the approximate state of MODEL.md 6(e), not a cold prefill's, so the same "
     "request may answer differently; off: the router sends the whole prompt (docs/PROTOCOL.md 6)",
     0, 0, 0},
    {"drain-timeout-ms", TDM_FLAG_U32, "30000", offsetof(decode_node_params_t, drain_timeout_ms),
     "SIGTERM drains: admit nothing new (ERROR_DRAINING), finish running streams for at most "
     "this long, then Goodbye and exit 0; a second signal stops at once; 0: SIGTERM stops at "
     "once. Resident sessions are not moved: the router rebuilds them from history",
     0, 3600000, 0},
    {"step-token-budget", TDM_FLAG_U32, "32", offsetof(decode_node_params_t, step_token_budget),
     "tokens of one scheduler step (like vLLM's max_num_batched_tokens): the running batch's "
     "decode rows count first, local prefill pieces (prompt parts, rewinds and canonical "
     "replays, a replay as its W' tokens) fill the rest, oldest first, so running streams never "
     "wait for a whole prompt; 0: no limit (a pending prompt prefills whole in one step). "
     "Default from bench/itl-under-prefill on the 2-core CPU box (small preset: steps of about "
     "35 ms against 7 ms while a 3,000-token prompt prefills, longest gap under 5x the median, "
     "the prompt's TTFT up to 1.6x whole; docs/BENCHMARKS.md); raise it on GPUs",
     0, 4294967295.0, 0},
    {"prefill-chunk-tokens", TDM_FLAG_U32, "32",
     offsetof(decode_node_params_t, prefill_chunk_tokens),
     "most prompt tokens one local prefill advances per step (its part; the engine runs it in "
     "--chunk-tokens passes); below the budget it lets several pending prompts advance in one "
     "step; 0: no limit. Default: the budget's (oldest prompt first, bench/itl-under-prefill)",
     0, 4294967295.0, 0},
    {"host-tier-mb", TDM_FLAG_U64, "1024", offsetof(decode_node_params_t, host_tier_mb),
     "host memory for idle sessions' KV pages and state moved out of the pool under page "
     "pressure (restored at their next turn instead of recomputed); 0: no host tier",
     0, 16777216, 0},
    {"spill-dir", TDM_FLAG_PATH, NULL, offsetof(decode_node_params_t, spill_dir),
     "directory for the disk tier below the host tier (checksummed files written atomically; "
     "one directory per node: leftovers are removed at start); unset: no disk tier",
     0, 0, 0},
    {"spill-max-mb", TDM_FLAG_U64, "0", offsetof(decode_node_params_t, spill_max_mb),
     "disk tier cap (the highest-scored files are dropped beyond it); 0: as much as the disk "
     "takes",
     0, 1099511627776.0, 0},
};

int main(int argc, char **argv)
{
    static const node_worker_main_t spec = {
        "tandem-decode", "Tandem decode node: KV page pool, continuous batching, token streaming",
        decode_flags, sizeof(decode_flags) / sizeof(decode_flags[0]),
        offsetof(decode_node_params_t, worker)};
    decode_node_params_t params;
    tdm_flags_action_t action;
    int rc;

    memset(&params, 0, sizeof(params));
    rc = node_worker_main_start(&spec, argc, argv, &params, &action);
    if (rc != NODE_EXIT_OK || action == TDM_FLAGS_HELP) {
        return rc;
    }
    return decode_node_run(&params);
}
