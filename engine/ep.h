/* ep.h - one model split by experts over several devices of a node (issue 14 item 6): the
 * ranks of an expert-parallel group, each with its own thread, device, model shard, KV pool and
 * forward context.
 *
 * Weights: every rank holds the attention, dense layers, router, shared expert, head and Engram
 * tables; the routed experts are split into contiguous ranges (engine_model_params_t.ep_rank /
 * ep_size, engine_expert_range: the layout of docs/DEPLOY.md section 10). The expert weights are
 * 97 % of the full model's bytes (MODEL.md 10), so R ranks hold about 1/R of it each: what makes
 * the full model fit on 2 x B300 or 8 x H200.
 *
 * Two forms (engine_fwd_params_t.ep_data_parallel in params.fwd):
 *   - data-parallel attention (1, what a serving instance wants): each rank holds its own
 *     sequences and KV pages and runs its own calls, with its own batches and lengths; in each MoE
 *     layer the tokens routed to another rank's experts go there and their outputs come back
 *     (all-to-all, kernels/comm.h), and a rank whose work in a run is done serves the others
 *     (engine_fwd_ep_serve, called here after the run's function) until all are done;
 *   - replicated attention (0): every rank is given the same calls on the same sequences and
 *     computes only its experts; one all-gather per MoE layer.
 * Either way a token's expert outputs are added in the one-device order, so every sequence's
 * logits are the one-device logits bit for bit on the CPU (tests/unit/test_engine_ep.c) and
 * within MODEL.md 6(e) on CUDA (test_engine_cuda).
 *
 * Threads: rank r's thread loads its shard (its device made current first), then waits for work;
 * engine_ep_run hands one function to all ranks and waits for all. The caller keeps each rank's
 * sequences (made on that rank's model and pool, inside a run: a CUDA rank's memory is used on
 * its own thread only). Not thread-safe: one caller thread drives a group.
 */
#ifndef TANDEM_ENGINE_EP_H
#define TANDEM_ENGINE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "kernels/device.h"

/* Most ranks of one group (the GPUs of one node; kernels/comm.h allows a whole NVL72 domain). */
#define ENGINE_EP_MAX_RANKS 8

/*
 * engine_ep_params_t - what to open. n_ranks 1..ENGINE_EP_MAX_RANKS; devices[r] is rank r's
 * device: all "cpu" (the CPU group: tests, `--devices cpu,cpu`) or all CUDA with distinct
 * ordinals (NCCL). model and fwd are each rank's load and context parameters (model.ops,
 * ep_rank, ep_size and fwd.comm are set per rank here; the rest, fwd.ep_data_parallel included,
 * is used as given). n_pages: KV pool pages of each rank.
 */
typedef struct {
    int n_ranks;
    kern_device_t devices[ENGINE_EP_MAX_RANKS];
    engine_model_params_t model;
    engine_fwd_params_t fwd;
    uint32_t n_pages;
} engine_ep_params_t;

/*
 * engine_ep_params_from_devices - *out for a group over the `--devices` list text `devices`
 * (kern_device_parse_list: "0,1", "cpu,cpu", ...): the default model and forward parameters with
 * n_threads kernel threads per rank, data-parallel attention (fwd.ep_data_parallel = 1) and
 * n_pages KV pages per rank; the caller may change any field before engine_ep_open (the tools
 * set their chunk size here).
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG with the list's message in err (*out then unspecified).
 */
tdm_status_t engine_ep_params_from_devices(const char *devices, int n_threads, uint32_t n_pages,
                                           engine_ep_params_t *out, char *err, size_t err_bytes);

/* One rank as a run's function sees it: its index, the group size, and its model shard, page
 * pool and forward context (owned by the group; valid until engine_ep_close). */
typedef struct {
    int rank;
    int n_ranks;
    engine_model_t *model;
    engine_kv_pool_t *pool;
    engine_fwd_t *fwd;
} engine_ep_rank_t;

/* A group; opaque. */
typedef struct engine_ep engine_ep_t;

/*
 * engine_ep_open - load `dir` as n_ranks expert shards, one per device, each on its own thread
 * (which keeps its device current), with a KV pool and forward context each, joined by a
 * kern_comm group (cpu or nccl by the devices' kind).
 * Returns TDM_OK with *ep_out (engine_ep_close frees it), or with *ep_out untouched and one line
 * in err (err_bytes may be 0): TDM_ERR_INVALID_ARG (NULL, n_ranks out of range, mixed device
 * kinds, a CUDA ordinal named twice), TDM_ERR_UNSUPPORTED (CUDA devices without a usable CUDA
 * device, the CUDA backend or NCCL in this build), TDM_ERR_NOT_FOUND (a device ordinal the driver
 * does not have; checked before NCCL is asked), the first failing rank's load status with its
 * message (prefixed "rank r: "), or the status of the ranks' first collectives (kern_comm_warmup,
 * run here once every rank has loaded).
 */
tdm_status_t engine_ep_open(const char *dir, const engine_ep_params_t *params, engine_ep_t **ep_out,
                            char *err, size_t err_bytes);

/* engine_ep_close - join the rank threads and free every rank's context, pool and model, then
 * the comm group; accepts NULL. No run may be in progress. */
void engine_ep_close(engine_ep_t *ep);

/* engine_ep_size - the rank count. */
int engine_ep_size(const engine_ep_t *ep);

/* engine_ep_rank - rank r's view (0 <= r < size), NULL otherwise; for reading between runs (a
 * CUDA rank's buffers must only be used on its own thread, inside a run). */
const engine_ep_rank_t *engine_ep_rank(const engine_ep_t *ep, int r);

/* The work of one run on one rank, called on that rank's thread. */
typedef tdm_status_t engine_ep_fn(const engine_ep_rank_t *rank, void *user);

/*
 * engine_ep_run - call fn(rank, user) on every rank at once and wait for all of them (with
 * ep_data_parallel each rank then serves the others' experts until all are done).
 * A rank whose fn fails aborts the comm group at once (the others, waiting in or reaching an
 * all-gather, return TDM_ERR_PEER_LOST); the group is reset once all have returned, so the next
 * run works. Sequences that took part in a failed run are in an unspecified state on every rank:
 * release them.
 * Returns TDM_OK when every rank returned TDM_OK; otherwise the status of the first rank to fail
 * (recorded before it aborts the group, so a rank failing because of the abort never hides the
 * cause); TDM_ERR_INVALID_ARG for NULL ep or fn.
 */
tdm_status_t engine_ep_run(engine_ep_t *ep, engine_ep_fn *fn, void *user);

#endif
