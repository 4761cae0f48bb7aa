/* engine_bench_ep.h - tandem-bench-engine --devices: batched decode on an expert-parallel group
 * (engine/ep.h, data-parallel attention) against the same batches on one device, measured in
 * the same run.
 *
 * For each batch size B: the B sequences are dealt round-robin to the ranks (sequence i to rank
 * i mod R), each prefilled with `context` seeded tokens; then `steps` greedy decode steps in each
 * rank's own batch (engine_fwd_decode_greedy), timed around the whole group's run; the same B
 * sequences on one device (the list's first device, the whole model; on the CPU with R times the
 * kernel threads, so both sides use the same cores) are the baseline. The two alternate `repeat`
 * times and the best run of each is printed, with their ratio and whether the greedy ids agree
 * (bit-identical on the CPU; within MODEL.md 6(e) on CUDA, where they may differ). Also prints
 * each rank's resident weight bytes against the one device's (the expert split).
 */
#ifndef TANDEM_BENCH_ENGINE_BENCH_EP_H
#define TANDEM_BENCH_ENGINE_BENCH_EP_H

#include <stdint.h>

/* What to run (tandem-bench-engine's flags). */
typedef struct {
    const char *model_dir;
    const char *devices; /* kern_device_parse_list text */
    int n_threads;       /* kernel threads per rank */
    int64_t context;     /* tokens prefilled per sequence */
    int steps;           /* decode steps per batch */
    const int *batches;  /* batch sizes */
    int n_batches;
    int repeat;
} bench_ep_cfg_t;

/* Run it, printing one line per figure. Returns the exit status: 0, 1 (a run failed, said on
 * stderr), or 2 (a bad --devices value or one this build or machine cannot open). */
int bench_ep_run(const bench_ep_cfg_t *cfg);

#endif
