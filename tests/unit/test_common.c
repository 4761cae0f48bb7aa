/* test_common.c - status codes, logging levels, flags, start-up, error buffers, byte blobs, arena,
 * clock and hashing in common/. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/errbuf.h"
#include "common/flags.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "common/startup.h"
#include "common/status.h"

typedef struct {
    const char *model_dir;
    uint32_t n_pages;
    double temperature;
    int verbose;
    int64_t offset;
    const char *log_level;
} demo_cfg_t;

static const tdm_flag_t demo_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(demo_cfg_t, model_dir), "model directory", 0, 0, 1},
    {"pages", TDM_FLAG_U32, "4096", offsetof(demo_cfg_t, n_pages), "KV pages", 1, 65536, 0},
    {"temperature", TDM_FLAG_F64, "1.0", offsetof(demo_cfg_t, temperature), "temp", 0, 2, 0},
    {"verbose", TDM_FLAG_BOOL, "false", offsetof(demo_cfg_t, verbose), "log more", 0, 0, 0},
    {"offset", TDM_FLAG_I64, "-3", offsetof(demo_cfg_t, offset), "an offset", 0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(demo_cfg_t, log_level), "level", 0, 0, 0},
};
#define N_DEMO_FLAGS (sizeof(demo_flags) / sizeof(demo_flags[0]))

static tdm_status_t parse(int argc, char **argv, demo_cfg_t *cfg, tdm_flags_action_t *action)
{
    memset(cfg, 0, sizeof(*cfg));
    return tdm_flags_parse(demo_flags, N_DEMO_FLAGS, argc, argv, "demo", "a demo", cfg, NULL,
                           NULL, action);
}

static void test_status_names_and_messages(void **state)
{
    (void)state;
    assert_string_equal(tdm_status_name(TDM_ERR_NO_PAGES), "TDM_ERR_NO_PAGES");
    assert_string_equal(tdm_status_message(TDM_ERR_NO_PAGES), "kv pool exhausted");
    assert_string_equal(tdm_status_name((tdm_status_t)-999), "TDM_ERR_UNKNOWN");
    assert_int_equal(TDM_OK, 0);
    assert_true(TDM_ERR_INVALID_ARG < 0);
}

static void test_log_level_parse(void **state)
{
    tdm_log_level_t level = TDM_LOG_INFO;
    (void)state;
    assert_int_equal(tdm_log_level_parse("debug", &level), TDM_OK);
    assert_int_equal(level, TDM_LOG_DEBUG);
    assert_int_equal(tdm_log_level_parse("loud", &level), TDM_ERR_INVALID_ARG);
    assert_int_equal(level, TDM_LOG_DEBUG);
}

static void test_flags_command_line_env_and_defaults(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action;
    char *argv[] = {"demo", "--model", "/m", "--temperature=0.5", "--verbose"};
    (void)state;

    setenv("TANDEM_PAGES", "128", 1);
    assert_int_equal(parse(5, argv, &cfg, &action), TDM_OK);
    unsetenv("TANDEM_PAGES");
    assert_int_equal(action, TDM_FLAGS_RUN);
    assert_string_equal(cfg.model_dir, "/m");
    assert_int_equal(cfg.n_pages, 128);
    assert_true(cfg.temperature == 0.5);
    assert_int_equal(cfg.verbose, 1);
    assert_int_equal(cfg.offset, -3);
}

/* Issue 16: an underflowing number (strtod's ERANGE for 1e-310) is its nearest double, not an
 * error; overflow still is. tandem-generate and the router then agree on tiny temperatures. */
static void test_flags_accept_underflow_and_refuse_overflow(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action;
    char *tiny[] = {"demo", "--model", "/m", "--temperature", "1e-310"};
    char *zero_exp[] = {"demo", "--model", "/m", "--temperature", "1e-400"};
    char *huge[] = {"demo", "--model", "/m", "--temperature", "1e999"};
    (void)state;

    assert_int_equal(parse(5, tiny, &cfg, &action), TDM_OK);
    assert_true(cfg.temperature > 0.0 && cfg.temperature < 1e-300);
    assert_int_equal(parse(5, zero_exp, &cfg, &action), TDM_OK);
    assert_true(cfg.temperature == 0.0);
    assert_int_equal(parse(5, huge, &cfg, &action), TDM_ERR_INVALID_ARG);
}

static void test_flags_rejects_bad_values(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action;
    char *out_of_range[] = {"demo", "--model", "/m", "--pages", "0"};
    char *unknown[] = {"demo", "--model", "/m", "--nope", "1"};
    char *missing_value[] = {"demo", "--model"};
    char *nan_temp[] = {"demo", "--model", "/m", "--temperature", "nan"};
    char *not_number[] = {"demo", "--model", "/m", "--pages", "12x"};
    char *no_model[] = {"demo"};
    (void)state;

    assert_int_equal(parse(5, out_of_range, &cfg, &action), TDM_ERR_INVALID_ARG);
    assert_int_equal(parse(5, unknown, &cfg, &action), TDM_ERR_INVALID_ARG);
    assert_int_equal(parse(2, missing_value, &cfg, &action), TDM_ERR_INVALID_ARG);
    assert_int_equal(parse(5, nan_temp, &cfg, &action), TDM_ERR_INVALID_ARG);
    assert_int_equal(parse(5, not_number, &cfg, &action), TDM_ERR_INVALID_ARG);
    assert_int_equal(parse(1, no_model, &cfg, &action), TDM_ERR_INVALID_ARG);
}

static void test_flags_help(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action = TDM_FLAGS_RUN;
    char *argv[] = {"demo", "--help"};
    (void)state;
    assert_int_equal(parse(2, argv, &cfg, &action), TDM_OK);
    assert_int_equal(action, TDM_FLAGS_HELP);
}

static tdm_status_t start(int argc, char **argv, size_t log_level_offset, demo_cfg_t *cfg,
                          tdm_flags_action_t *action)
{
    const tdm_main_spec_t spec = {"demo", "a demo", demo_flags, N_DEMO_FLAGS, log_level_offset};

    memset(cfg, 0, sizeof(*cfg));
    return tdm_main_start(&spec, argc, argv, cfg, action);
}

static void test_main_start_parses_flags_and_sets_log_level(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action = TDM_FLAGS_HELP;
    char *argv[] = {"demo", "--model", "/m", "--pages", "7", "--log-level", "error"};
    tdm_log_level_t saved = tdm_log_get_level();
    (void)state;

    tdm_log_set_level(TDM_LOG_DEBUG);
    assert_int_equal(start(7, argv, offsetof(demo_cfg_t, log_level), &cfg, &action), TDM_OK);
    assert_int_equal(action, TDM_FLAGS_RUN);
    assert_string_equal(cfg.model_dir, "/m");
    assert_int_equal(cfg.n_pages, 7);
    assert_int_equal(tdm_log_get_level(), TDM_LOG_ERROR);
    tdm_log_set_level(saved);
}

static void test_main_start_rejects_bad_log_level_and_keeps_threshold(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action;
    char *bad_level[] = {"demo", "--model", "/m", "--log-level", "loud"};
    char *bad_flag[] = {"demo", "--model", "/m", "--nope"};
    tdm_log_level_t saved = tdm_log_get_level();
    (void)state;

    tdm_log_set_level(TDM_LOG_WARN);
    assert_int_equal(start(5, bad_level, offsetof(demo_cfg_t, log_level), &cfg, &action),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_log_get_level(), TDM_LOG_WARN);
    assert_int_equal(start(4, bad_flag, offsetof(demo_cfg_t, log_level), &cfg, &action),
                     TDM_ERR_INVALID_ARG);
    /* Without a log-level field the text is never read, so "loud" is just a string. */
    assert_int_equal(start(5, bad_level, TDM_MAIN_NO_LOG_LEVEL, &cfg, &action), TDM_OK);
    assert_int_equal(action, TDM_FLAGS_RUN);
    assert_string_equal(cfg.log_level, "loud");
    assert_int_equal(tdm_log_get_level(), TDM_LOG_WARN);
    tdm_log_set_level(saved);
}

static void test_main_start_help_skips_validation(void **state)
{
    demo_cfg_t cfg;
    tdm_flags_action_t action = TDM_FLAGS_RUN;
    char *argv[] = {"demo", "--log-level", "loud", "--help"};
    (void)state;

    /* --help needs no --model and ignores a bad level: it prints and asks for exit 0. */
    assert_int_equal(start(4, argv, offsetof(demo_cfg_t, log_level), &cfg, &action), TDM_OK);
    assert_int_equal(action, TDM_FLAGS_HELP);
}

static volatile sig_atomic_t demo_stop_signal;

static void demo_on_stop(int signo)
{
    demo_stop_signal = signo;
}

static void test_signals_install_routes_stop_and_ignores_pipe(void **state)
{
    struct sigaction old_int, old_term, old_pipe, now;
    (void)state;

    sigaction(SIGINT, NULL, &old_int);
    sigaction(SIGTERM, NULL, &old_term);
    sigaction(SIGPIPE, NULL, &old_pipe);
    assert_int_equal(tdm_signals_install(NULL, TDM_SIGNALS_DEFAULT), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_signals_install(demo_on_stop, TDM_SIGNALS_CHILD), TDM_ERR_INVALID_ARG);
    sigaction(SIGTERM, NULL, &now);
    assert_true(now.sa_handler == old_term.sa_handler); /* nothing changed */

    assert_int_equal(tdm_signals_install(demo_on_stop, TDM_SIGNALS_IGNORE_PIPE), TDM_OK);
    demo_stop_signal = 0;
    raise(SIGTERM);
    assert_int_equal(demo_stop_signal, SIGTERM);
    raise(SIGINT);
    assert_int_equal(demo_stop_signal, SIGINT);
    sigaction(SIGPIPE, NULL, &now);
    assert_true(now.sa_handler == SIG_IGN);
    raise(SIGPIPE); /* would end the process if it were not ignored */

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
}

static void test_signals_block_queues_stop_for_sigwait(void **state)
{
    sigset_t old_mask, set, pending;
    struct sigaction old_pipe, old_chld, now;
    int signo = 0;
    (void)state;

    pthread_sigmask(SIG_SETMASK, NULL, &old_mask);
    sigaction(SIGPIPE, NULL, &old_pipe);
    sigaction(SIGCHLD, NULL, &old_chld);
    signal(SIGCHLD, SIG_IGN); /* as a parent that ignores it would leave it across exec */
    assert_int_equal(tdm_signals_block(TDM_SIGNALS_CHILD, &set), TDM_OK);
    sigaction(SIGCHLD, NULL, &now);
    assert_true(now.sa_handler == SIG_DFL);
    /* a child's exit is reported to waitpid (with SIGCHLD ignored it would be reaped unseen) */
    pid_t child = fork();
    if (child == 0) {
        _exit(7);
    }
    assert_true(child > 0);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 7);
    assert_int_equal(sigwait(&set, &signo), 0); /* its SIGCHLD, pending while blocked */
    assert_int_equal(signo, SIGCHLD);
    assert_true(sigismember(&set, SIGINT) == 1);
    assert_true(sigismember(&set, SIGTERM) == 1);
    assert_true(sigismember(&set, SIGCHLD) == 1);
    assert_true(sigismember(&set, SIGPIPE) == 0);
    sigaction(SIGPIPE, NULL, &now);
    assert_true(now.sa_handler == old_pipe.sa_handler); /* not asked to ignore it */

    raise(SIGTERM); /* blocked: stays pending until sigwait takes it */
    sigpending(&pending);
    assert_true(sigismember(&pending, SIGTERM) == 1);
    assert_int_equal(sigwait(&set, &signo), 0);
    assert_int_equal(signo, SIGTERM);

    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);
}

static void test_errbuf_formats_truncates_and_accepts_null(void **state)
{
    char err[8];
    (void)state;

    memset(err, 'x', sizeof(err));
    tdm_errbuf_set(err, sizeof(err), "%s=%d", "pages", 12);
    assert_string_equal(err, "pages=1"); /* truncated to 7 characters and terminated */
    tdm_errbuf_set(err, sizeof(err), "ok");
    assert_string_equal(err, "ok");
    tdm_errbuf_set(NULL, 16, "not written %d", 1);
    memset(err, 'x', sizeof(err));
    tdm_errbuf_set(err, 0, "not written");
    assert_int_equal(err[0], 'x');
}

static void test_bytes_measure_write_and_read_back_little_endian(void **state)
{
    uint8_t buf[16];
    tdm_bytes_writer_t measure = {NULL, 0, 0};
    tdm_bytes_writer_t w = {buf, 0, sizeof(buf)};
    tdm_bytes_reader_t r = {buf, sizeof(buf), 0, 0};
    (void)state;

    tdm_bytes_put(&measure, "TD", 2);
    tdm_bytes_put_u32(&measure, 1);
    tdm_bytes_put_u64(&measure, 2);
    assert_int_equal(measure.used, 14);

    memset(buf, 0xee, sizeof(buf));
    tdm_bytes_put(&w, "TD", 2);
    tdm_bytes_put_u32(&w, 0x04030201u);
    tdm_bytes_put_u64(&w, 0x0c0b0a0908070605ull);
    assert_int_equal(w.used, 14);
    for (int i = 0; i < 12; i++) {
        assert_int_equal(buf[2 + i], i + 1); /* least significant byte first */
    }
    assert_int_equal(buf[14], 0xee);

    assert_memory_equal(tdm_bytes_get(&r, 2), "TD", 2);
    assert_int_equal(tdm_bytes_get_u32(&r), 0x04030201u);
    assert_true(tdm_bytes_get_u64(&r) == 0x0c0b0a0908070605ull);
    assert_int_equal(r.at, 14);
    assert_int_equal(r.bad, 0);
}

static void test_bytes_overflow_is_counted_and_reads_past_end_stay_bad(void **state)
{
    uint8_t buf[6] = {0};
    tdm_bytes_writer_t w = {buf, 0, 4};
    tdm_bytes_reader_t r = {buf, 6, 0, 0};
    (void)state;

    tdm_bytes_put_u32(&w, 0xffffffffu);
    tdm_bytes_put_u32(&w, 0xffffffffu); /* does not fit: counted, not copied */
    assert_int_equal(w.used, 8);
    assert_int_equal(buf[4], 0);
    assert_int_equal(buf[5], 0);

    assert_int_equal(tdm_bytes_get_u32(&r), 0xffffffffu);
    assert_true(tdm_bytes_get_u64(&r) == 0); /* 2 bytes left */
    assert_int_equal(r.bad, 1);
    assert_int_equal(r.at, 4);
    assert_null(tdm_bytes_get(&r, 1)); /* sticky, though one byte is there */
    assert_int_equal(r.at, 4);
}

static void test_arena_alignment_capacity_and_reset(void **state)
{
    tdm_arena_t arena;
    (void)state;

    assert_int_equal(tdm_arena_init(&arena, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_arena_init(&arena, 1024), TDM_OK);
    unsigned char *a = tdm_arena_alloc(&arena, 10, 0);
    unsigned char *b = tdm_arena_alloc(&arena, 10, 256);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)b % 256, 0);
    assert_true(b >= a + 10);
    size_t used = arena.used_bytes;
    assert_null(tdm_arena_alloc(&arena, 2000, 0));
    assert_int_equal(arena.used_bytes, used);
    assert_null(tdm_arena_alloc(&arena, 8, 3));
    tdm_arena_reset(&arena);
    assert_int_equal(arena.used_bytes, 0);
    assert_int_equal(arena.high_water_bytes, used);
    tdm_arena_fini(&arena);
    tdm_arena_fini(&arena);
}

/* An arena over the caller's buffer carves it like an owned one and leaves it to the caller. */
static void test_arena_over_caller_memory(void **state)
{
    _Alignas(64) static unsigned char buf[1024];
    tdm_arena_t arena;
    (void)state;

    assert_int_equal(tdm_arena_init_over(&arena, NULL, 64), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_arena_init_over(&arena, buf + 1, 64), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_arena_init_over(&arena, buf, 0), TDM_ERR_INVALID_ARG);
    assert_int_equal(tdm_arena_init_over(&arena, buf, sizeof(buf)), TDM_OK);
    unsigned char *a = tdm_arena_alloc(&arena, 100, 0);
    unsigned char *b = tdm_arena_alloc(&arena, 100, 64);
    assert_ptr_equal(a, buf);
    assert_ptr_equal(b, buf + 128);
    assert_null(tdm_arena_alloc(&arena, 1024, 0));
    tdm_arena_fini(&arena); /* frees nothing (ASan would report a bad free) */
    assert_null(arena.base);
    buf[0] = 1; /* still the caller's */
}

static void test_clock_is_monotonic(void **state)
{
    (void)state;
    uint64_t t0 = tdm_clock_now_ns();
    uint64_t t1 = tdm_clock_now_ns();
    assert_true(t1 >= t0);
    assert_true(tdm_clock_elapsed_ms(t0) >= 0.0);
}

static void test_hashes_match_reference_values(void **state)
{
    (void)state;
    /* XXH3-64 of the empty input with seed 0 (xxHash's published test value). */
    assert_true(tdm_hash_xxh3_64("", 0) == 0x2D06800538D394C2ULL);
    /* splitmix64 worked by hand from MODEL.md 12.8 for state 0: first output of seed 0. */
    assert_true(tdm_hash_splitmix64(0) == 0xE220A8397B1DCDAFULL);
    assert_true(tdm_hash_xxh3_64_seeded("abc", 3, 1) != tdm_hash_xxh3_64("abc", 3));
}

static void test_json_errors_name_line(void **state)
{
    json_t *root = NULL;
    char err[256];
    (void)state;
    assert_int_equal(tdm_json_load_text("{\"a\": 1,\n}", 10, "inline", &root, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    assert_null(root);
    assert_non_null(strstr(err, "inline:2:"));
    assert_int_equal(tdm_json_load_file("/nonexistent/x.json", &root, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    int64_t v = 0;
    json_t *num = json_real(3.0);
    assert_int_equal(tdm_json_int_exact(num, &v), TDM_OK);
    assert_int_equal(v, 3);
    json_real_set(num, 3.5);
    assert_int_equal(tdm_json_int_exact(num, &v), TDM_ERR_FORMAT);
    json_decref(num);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names_and_messages),
        cmocka_unit_test(test_log_level_parse),
        cmocka_unit_test(test_flags_command_line_env_and_defaults),
        cmocka_unit_test(test_flags_accept_underflow_and_refuse_overflow),
        cmocka_unit_test(test_flags_rejects_bad_values),
        cmocka_unit_test(test_flags_help),
        cmocka_unit_test(test_main_start_parses_flags_and_sets_log_level),
        cmocka_unit_test(test_main_start_rejects_bad_log_level_and_keeps_threshold),
        cmocka_unit_test(test_main_start_help_skips_validation),
        cmocka_unit_test(test_signals_install_routes_stop_and_ignores_pipe),
        cmocka_unit_test(test_signals_block_queues_stop_for_sigwait),
        cmocka_unit_test(test_errbuf_formats_truncates_and_accepts_null),
        cmocka_unit_test(test_bytes_measure_write_and_read_back_little_endian),
        cmocka_unit_test(test_bytes_overflow_is_counted_and_reads_past_end_stay_bad),
        cmocka_unit_test(test_arena_alignment_capacity_and_reset),
        cmocka_unit_test(test_arena_over_caller_memory),
        cmocka_unit_test(test_clock_is_monotonic),
        cmocka_unit_test(test_hashes_match_reference_values),
        cmocka_unit_test(test_json_errors_name_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
