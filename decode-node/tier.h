/* tier.h - the lower tiers of an idle session's state on a decode node: a host-memory store and
 * an optional disk spill directory (issue 17, "tool-pause tiering"; docs/DEPLOY.md "Session
 * tiers", docs/RELIABILITY.md "Spill files").
 *
 * Owns, per demoted session, its state as one engine_seq_export blob with pages (the section-7
 * record, every KV page sealed, the blob's XXH3-64 trailer) plus the token ids the session had
 * recorded (decode_session_t.ids, for rewinds). An entry lives in exactly one tier: host (the
 * blob and ids in memory) or disk (one file in the spill directory, written to a temporary name,
 * fsync'ed and renamed, its own XXH3-64 trailer over the header and ids beside the blob's over
 * pages and state). The host tier holds at most host_max_bytes; when a new entry does not fit,
 * the host entries with the highest eviction score (decode_tier_score) move to disk first, and
 * only what the disk cannot take (no directory, full, unwritable, over spill_max_bytes) is
 * dropped: its session is then rebuilt from the router's history (ERROR_STATE_LOST), never
 * served from damaged bytes. Reading an entry back checks both checksums; a damaged or missing
 * file is a miss (TDM_ERR_FORMAT / TDM_ERR_NOT_FOUND), the file is removed.
 *
 * Knows nothing of the engine beyond the blob's trailer (engine/seq_state.h imports the blob and
 * checks every page), of the pool or of the scheduler (decode-node/sched_tier.c moves sessions
 * between the pool and here). Not thread-safe: the scheduler's thread only; the stats snapshot
 * is plain data the scheduler publishes under its own lock.
 */
#ifndef TANDEM_DECODE_NODE_TIER_H
#define TANDEM_DECODE_NODE_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "common/prom.h"
#include "common/status.h"

/* Where a demoted session's state lives. */
typedef enum {
    DECODE_TIER_HOST = 0, /* host memory */
    DECODE_TIER_DISK = 1, /* a file in the spill directory */
    DECODE_TIER_N = 2,
} decode_tier_kind_t;

/* The spill file name suffix; decode_tier_create removes leftovers with it from the directory. */
#define DECODE_TIER_FILE_SUFFIX ".tdspill"

/* The restore-time histogram's upper bounds, seconds (decode_tier_restore_bounds_s). */
#define DECODE_TIER_N_BOUNDS 9
extern const double decode_tier_restore_bounds_s[DECODE_TIER_N_BOUNDS];

/* How the tiers are sized (plain data, copied at create; the string is copied). */
typedef struct {
    uint64_t host_max_bytes;  /* host store capacity; 0: no host tier */
    const char *spill_dir;    /* spill directory, or NULL / "": no disk tier */
    uint64_t spill_max_bytes; /* disk tier capacity; 0: as much as the file system takes */
} decode_tier_params_t;

/* What the eviction score reads of a session (plain data). */
typedef struct {
    uint64_t last_used_ns; /* end of its last turn (tdm_clock_now_ns) */
    uint32_t n_turns;      /* turns it started on this node */
    uint64_t gap_mean_ns;  /* mean pause between its turns (0: fewer than two turns) */
    uint64_t size;         /* pages (pool) or bytes (host store): only compared within a tier */
} decode_tier_usage_t;

/* Per-tier counters and gauges (plain data snapshot). */
typedef struct {
    uint64_t sessions;         /* entries now in the tier */
    uint64_t bytes;            /* bytes they hold (blob and ids) */
    uint64_t demotions_total;  /* entries that came into the tier (from the pool or host) */
    uint64_t promotions_total; /* entries restored from the tier into the pool */
    uint64_t misses_total;     /* turns that found their entry gone or damaged here */
    uint64_t drops_total;      /* entries dropped from the tier (no room below it) */
    uint64_t restore_count;    /* restores timed (decode_tier_note_restore) */
    double restore_seconds;    /* their summed wall time: read, check, import */
    uint64_t restore_tokens;   /* their summed sequence lengths (tokens not recomputed) */
    uint64_t restore_buckets[DECODE_TIER_N_BOUNDS + 1]; /* restores per bucket of
                                                           decode_tier_restore_bounds_s, not
                                                           cumulative; the last is above all */
} decode_tier_counts_t;

typedef struct {
    decode_tier_counts_t t[DECODE_TIER_N];
    uint64_t spill_failures_total; /* disk writes that failed (unwritable, full) */
} decode_tier_stats_t;

typedef struct decode_tier decode_tier_t;

/*
 * decode_tier_score - how much a session (or a stored entry) should go down a tier before others:
 * higher goes first. The expected wait until its next turn (with two or more turns: the
 * distance between its idle time and its mean pause, |gap - idle|, so a session due back soon
 * stays and one long overdue goes; with fewer: its idle time), divided by the chance that it
 * comes back at all (n_turns / (n_turns + 1), at least 1/4), times a size factor 1 + log2(1 + size) (a larger
 * session frees more with one move). Seconds-scaled; 0 for a session used at now_ns.
 */
double decode_tier_score(const decode_tier_usage_t *usage, uint64_t now_ns);

/*
 * decode_tier_create - empty tiers sized by *params. With a spill directory: created when
 * absent (one level), and files named *DECODE_TIER_FILE_SUFFIX left in it by an earlier process
 * are removed (the directory belongs to this node). A directory that cannot be created or
 * written is logged (WARN) and tried again at each spill: the node still starts.
 *
 * Returns TDM_OK and *tier_out (decode_tier_destroy frees it), TDM_ERR_INVALID_ARG (NULL, a
 * spill_dir path longer than 3,800 bytes) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t decode_tier_create(const decode_tier_params_t *params, decode_tier_t **tier_out);

/* decode_tier_destroy - free every entry and remove every spill file. Accepts NULL. */
void decode_tier_destroy(decode_tier_t *tier);

/* decode_tier_enabled - 1 when the host or the disk tier can take entries, else 0. */
int decode_tier_enabled(const decode_tier_t *tier);

/*
 * decode_tier_put - store session `id`'s state: blob (an engine_seq_export blob with pages,
 * n_blob bytes, its trailer included) and ids (n_ids recorded token ids, may be NULL when 0).
 * Goes to the host tier when it fits there after moving higher-scored host entries to disk (or
 * dropping them when the disk cannot take them), else straight to disk. An entry already held
 * for `id` is replaced.
 *
 * Returns TDM_OK and *kind_out (the tier it went to): the tier takes ownership of blob and ids
 * (malloc'ed; freed by the tier). On error the caller keeps both and the session's state is the
 * caller's to drop: TDM_ERR_INVALID_ARG (NULL, empty id, a blob shorter than its trailer),
 * TDM_ERR_UNSUPPORTED (no tier has room: host too small or absent, no disk tier), TDM_ERR_IO
 * (the spill write failed: logged, the temporary file removed), TDM_ERR_NO_MEMORY.
 */
tdm_status_t decode_tier_put(decode_tier_t *tier, const char *id, const decode_tier_usage_t *usage,
                             uint8_t *blob, size_t n_blob, int32_t *ids, int64_t n_ids,
                             decode_tier_kind_t *kind_out);

/*
 * decode_tier_take - remove session `id`'s entry and hand its state back: *blob_out (n_blob_out
 * bytes) and *ids_out (n_ids_out ids, NULL when 0), both malloc'ed, the caller frees. A disk
 * entry is read and checked (the file's trailer over header and ids, the blob's trailer over
 * pages and state), then its file removed. *kind_out says where it was (also on a miss).
 *
 * Returns TDM_OK, TDM_ERR_NOT_FOUND (no entry: never stored, dropped for room, or its file
 * vanished), TDM_ERR_FORMAT (the file is damaged: size, header or a checksum; logged WARN),
 * TDM_ERR_IO (a read failed) or TDM_ERR_NO_MEMORY. On any error the entry is gone (a miss is
 * counted against its tier) and the outputs are untouched except *kind_out.
 */
tdm_status_t decode_tier_take(decode_tier_t *tier, const char *id, uint8_t **blob_out,
                              size_t *n_blob_out, int32_t **ids_out, int64_t *n_ids_out,
                              decode_tier_kind_t *kind_out);

/* decode_tier_holds - 1 when an entry for `id` is held (either tier), else 0. */
int decode_tier_holds(const decode_tier_t *tier, const char *id);

/* decode_tier_drop - forget session `id`'s entry (its file removed); no-op when none. Not a
 * miss: the session was removed or its state replaced. */
void decode_tier_drop(decode_tier_t *tier, const char *id);

/* decode_tier_note_restore - count one restore from `kind` that took `ns` of wall time and
 * brought back a sequence of n_tokens tokens (the promotion and restore counters). */
void decode_tier_note_restore(decode_tier_t *tier, decode_tier_kind_t kind, uint64_t ns,
                              int64_t n_tokens);

/* decode_tier_note_miss - count a miss against `kind`: an entry taken from it could not be
 * restored (the engine's import refused it, or the pool had no pages for it). */
void decode_tier_note_miss(decode_tier_t *tier, decode_tier_kind_t kind);

/* decode_tier_spill_path - the file an entry of `id` is (or would be) kept in, for tests that
 * damage it: copies at most n_path bytes (NUL-terminated) into path_out. TDM_ERR_NOT_FOUND when
 * `id` has no disk entry. */
tdm_status_t decode_tier_spill_path(const decode_tier_t *tier, const char *id, char *path_out,
                                    size_t n_path);

/* decode_tier_stats - the counters and gauges now. */
void decode_tier_stats(const decode_tier_t *tier, decode_tier_stats_t *stats_out);

/* decode_tier_kind_name - "host" or "disk". */
const char *decode_tier_kind_name(decode_tier_kind_t kind);

/*
 * decode_tier_render - the tandem_decode_tier_* families of /metrics from a snapshot, each with
 * a tier="host"|"disk" label: sessions and bytes (gauges), demotions, promotions, misses and
 * drops (counters), restore seconds (a histogram: restore time per session = _sum / _count)
 * and restored tokens (counter), hit rate (promotions / (promotions + misses), 0 with neither), and
 * tandem_decode_tier_spill_failures_total.
 */
void decode_tier_render(const decode_tier_stats_t *stats, tdm_prom_t *prom);

#endif
