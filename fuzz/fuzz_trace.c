/* fuzz_trace.c - libFuzzer harness: the agent traces tandem-bench replays (bench/replay/trace.h):
 * a Mooncake JSONL trace (bench_trace_parse_mooncake: fields, session grouping and rebuilding by
 * hash_ids) or one SWE-agent .traj file (bench_trace_load_swe_agent: history, tool calls,
 * model_stats), whose text is then cut by --scale (bench_trace_scale_text: UTF-8 boundaries).
 *
 * Input: byte 0 bit 0 picks the format (0 Mooncake, 1 SWE-agent), bits 1-7 the scale
 * ((bits + 1) / 128); the rest is the file (the .traj held in a memfd and opened through
 * /proc/self/fd).
 */
#include <stdint.h>
#include <unistd.h>

#include "bench/replay/trace.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bench_trace_t *trace = NULL;
    char err[256], path[FUZZ_PATH_BYTES];
    int fd;

    if (size < 1) {
        return 0;
    }
    if ((data[0] & 1u) == 0) {
        if (bench_trace_parse_mooncake((const char *)data + 1, size - 1, "trace", &trace, err,
                                       sizeof(err)) == TDM_OK) {
            bench_trace_destroy(trace);
        }
        return 0;
    }
    fd = fuzz_memfd_open(data + 1, size - 1, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    if (bench_trace_load_swe_agent(path, &trace, err, sizeof(err)) == TDM_OK) {
        bench_trace_scale_text(trace, (double)((data[0] >> 1) + 1) / 128.0);
        bench_trace_destroy(trace);
    }
    close(fd);
    return 0;
}
