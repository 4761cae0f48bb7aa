/* tier.c - host store and disk spill of idle sessions' state (tier.h).
 *
 * Spill file format [tandem], little-endian, version 1 (docs/RELIABILITY.md "Spill files"):
 *   header 48 B: magic "TDSP", u32 version, u32 id bytes L, u32 0, u64 n_ids, u64 blob bytes B,
 *     u64 the blob's own trailer (its XXH3-64 over pages and state), u64 0;
 *   id: L bytes (no NUL);
 *   ids: n_ids u32 (int32 token ids);
 *   u64 XXH3-64 of header, id and ids;
 *   blob: B bytes, an engine_seq_export blob with pages, ending in its XXH3-64 trailer.
 * Written to "<dir>/.<name>.tmp", fsync'ed, renamed to "<dir>/<name>", the directory fsync'ed.
 */
#include "decode-node/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/fdio.h"
#include "common/hash.h"
#include "common/log.h"

#define TIER_MAGIC        "TDSP"
#define TIER_VERSION      1u
#define TIER_HEADER_BYTES 48u
#define TIER_ID_MAX       128u
#define TIER_DIR_MAX      3800u
#define TIER_PATH_MAX     4096u

const double decode_tier_restore_bounds_s[DECODE_TIER_N_BOUNDS] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
};

/* One demoted session. Host: blob and ids in memory. Disk: only the file's path and sizes. */
typedef struct {
    char id[TIER_ID_MAX + 1];
    decode_tier_kind_t kind;
    uint8_t *blob; /* host only */
    size_t n_blob;
    int32_t *ids; /* host only */
    int64_t n_ids;
    uint64_t bytes; /* what the entry counts against its tier */
    decode_tier_usage_t usage;
    char path[TIER_PATH_MAX]; /* disk only */
    int gone; /* dropped for room: a tombstone, so the session's next turn counts a miss here */
} entry_t;

struct decode_tier {
    uint64_t host_max_bytes;
    uint64_t spill_max_bytes;
    char dir[TIER_DIR_MAX + 1]; /* "" without a disk tier */
    entry_t **items;
    uint32_t n;
    uint32_t cap;
    uint64_t file_seq;
    decode_tier_stats_t stats;
};

double decode_tier_score(const decode_tier_usage_t *usage, uint64_t now_ns)
{
    double idle = now_ns > usage->last_used_ns ? (double)(now_ns - usage->last_used_ns) * 1e-9 : 0;
    double wait = idle;
    double p_return = (double)usage->n_turns / ((double)usage->n_turns + 1.0);

    if (usage->n_turns >= 2 && usage->gap_mean_ns > 0) {
        wait = fabs((double)usage->gap_mean_ns * 1e-9 - idle);
    }
    if (p_return < 0.25) {
        p_return = 0.25; /* a session not seen to start a turn here: as unlikely as one turn */
    }
    return wait / p_return * (1.0 + log2(1.0 + (double)usage->size));
}

const char *decode_tier_kind_name(decode_tier_kind_t kind)
{
    return kind == DECODE_TIER_DISK ? "disk" : "host";
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);

    return n >= k && strcmp(name + n - k, suffix) == 0;
}

/* Remove files an earlier process left (complete or temporary). */
static void clean_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    unsigned n = 0;

    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char path[TIER_PATH_MAX];
        if (!has_suffix(e->d_name, DECODE_TIER_FILE_SUFFIX) &&
            !has_suffix(e->d_name, DECODE_TIER_FILE_SUFFIX ".tmp")) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        n += unlink(path) == 0;
    }
    closedir(d);
    if (n > 0) {
        tdm_log(TDM_LOG_INFO, "tier", "removed %u spill file(s) an earlier process left in %s", n,
                dir);
    }
}

tdm_status_t decode_tier_create(const decode_tier_params_t *params, decode_tier_t **tier_out)
{
    decode_tier_t *t;

    if (params == NULL || tier_out == NULL ||
        (params->spill_dir != NULL && strlen(params->spill_dir) > TIER_DIR_MAX)) {
        return TDM_ERR_INVALID_ARG;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    t->host_max_bytes = params->host_max_bytes;
    t->spill_max_bytes = params->spill_max_bytes;
    if (params->spill_dir != NULL && params->spill_dir[0] != '\0') {
        snprintf(t->dir, sizeof(t->dir), "%s", params->spill_dir);
        if (mkdir(t->dir, 0700) != 0 && errno != EEXIST) {
            tdm_log(TDM_LOG_WARN, "tier",
                    "spill directory %s cannot be created (%s): spills will fail until it can",
                    t->dir, strerror(errno));
        } else if (access(t->dir, W_OK | X_OK) != 0) {
            tdm_log(TDM_LOG_WARN, "tier",
                    "spill directory %s is not writable (%s): spills will fail until it is",
                    t->dir, strerror(errno));
        } else {
            clean_dir(t->dir);
        }
    }
    tdm_log(TDM_LOG_INFO, "tier", "session tiers: host_bytes=%llu spill_dir=%s spill_max_bytes=%llu",
            (unsigned long long)t->host_max_bytes, t->dir[0] != '\0' ? t->dir : "none",
            (unsigned long long)t->spill_max_bytes);
    *tier_out = t;
    return TDM_OK;
}

static void entry_free(entry_t *e)
{
    if (e->kind == DECODE_TIER_DISK && e->path[0] != '\0') {
        (void)unlink(e->path);
    }
    free(e->blob);
    free(e->ids);
    free(e);
}

void decode_tier_destroy(decode_tier_t *tier)
{
    if (tier == NULL) {
        return;
    }
    for (uint32_t i = 0; i < tier->n; i++) {
        entry_free(tier->items[i]);
    }
    free(tier->items);
    free(tier);
}

int decode_tier_enabled(const decode_tier_t *tier)
{
    return tier != NULL && (tier->host_max_bytes > 0 || tier->dir[0] != '\0');
}

static int find(const decode_tier_t *tier, const char *id)
{
    for (uint32_t i = 0; i < tier->n; i++) {
        if (strcmp(tier->items[i]->id, id) == 0) {
            return (int)i;
        }
    }
    return -1;
}

int decode_tier_holds(const decode_tier_t *tier, const char *id)
{
    int i = tier != NULL && id != NULL ? find(tier, id) : -1;

    return i >= 0 && !tier->items[i]->gone;
}

/* Take entry i out of the table and its tier's gauges (the caller frees or re-adds it). */
static entry_t *unlink_entry(decode_tier_t *tier, uint32_t i)
{
    entry_t *e = tier->items[i];
    decode_tier_counts_t *c = &tier->stats.t[e->kind];

    tier->items[i] = tier->items[--tier->n];
    if (!e->gone) {
        c->sessions--;
        c->bytes -= e->bytes;
    }
    return e;
}

static tdm_status_t add_entry(decode_tier_t *tier, entry_t *e)
{
    decode_tier_counts_t *c = &tier->stats.t[e->kind];

    if (tier->n == tier->cap) {
        uint32_t cap = tier->cap > 0 ? tier->cap * 2 : 16;
        entry_t **grown = realloc(tier->items, cap * sizeof(*grown));
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        tier->items = grown;
        tier->cap = cap;
    }
    tier->items[tier->n++] = e;
    c->sessions++;
    c->bytes += e->bytes;
    c->demotions_total++;
    return TDM_OK;
}

/* The blob's own trailer (its last 8 bytes, little-endian). */
static uint64_t blob_trailer(const uint8_t *blob, size_t n_blob)
{
    tdm_bytes_reader_t r = {blob + n_blob - 8, 8, 0, 0};

    return tdm_bytes_get_u64(&r);
}

/* Header, id, ids and their checksum of entry e (malloc'ed into *meta_out). */
static tdm_status_t build_meta(const entry_t *e, const uint8_t *blob, uint8_t **meta_out,
                               size_t *n_meta_out)
{
    size_t id_len = strlen(e->id);
    size_t n = TIER_HEADER_BYTES + id_len + (size_t)e->n_ids * 4 + 8;
    uint8_t *meta = malloc(n);
    tdm_bytes_writer_t w = {meta, 0, n};

    if (meta == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    tdm_bytes_put(&w, TIER_MAGIC, 4);
    tdm_bytes_put_u32(&w, TIER_VERSION);
    tdm_bytes_put_u32(&w, (uint32_t)id_len);
    tdm_bytes_put_u32(&w, 0);
    tdm_bytes_put_u64(&w, (uint64_t)e->n_ids);
    tdm_bytes_put_u64(&w, (uint64_t)e->n_blob);
    tdm_bytes_put_u64(&w, blob_trailer(blob, e->n_blob));
    tdm_bytes_put_u64(&w, 0);
    tdm_bytes_put(&w, e->id, id_len);
    for (int64_t i = 0; i < e->n_ids; i++) {
        tdm_bytes_put_u32(&w, (uint32_t)e->ids[i]);
    }
    tdm_bytes_put_u64(&w, tdm_hash_xxh3_64(meta, w.used));
    *meta_out = meta;
    *n_meta_out = w.used;
    return TDM_OK;
}

/* fsync the directory so the rename is durable; failures only logged. */
static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);

    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/*
 * Write entry e (a host entry: blob and ids in memory) to a new spill file, atomically. On
 * TDM_OK e->path names the file; on error no file is left and e is unchanged but for path.
 */
static tdm_status_t write_file(decode_tier_t *tier, entry_t *e)
{
    char tmp[TIER_PATH_MAX + 8];
    uint8_t *meta = NULL;
    size_t n_meta = 0;
    const char *step = "open";
    int fd;
    tdm_status_t status;

    if (tier->dir[0] == '\0') {
        return TDM_ERR_UNSUPPORTED;
    }
    status = build_meta(e, e->blob, &meta, &n_meta);
    if (status != TDM_OK) {
        return status;
    }
    snprintf(e->path, sizeof(e->path), "%s/%016llx-%llu" DECODE_TIER_FILE_SUFFIX, tier->dir,
             (unsigned long long)tdm_hash_xxh3_64(e->id, strlen(e->id)),
             (unsigned long long)++tier->file_seq);
    snprintf(tmp, sizeof(tmp), "%s.tmp", e->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    status = fd >= 0 ? TDM_OK : TDM_ERR_IO;
    if (status == TDM_OK) {
        step = "write";
        status = tdm_fd_write_all(fd, meta, n_meta);
    }
    if (status == TDM_OK) {
        status = tdm_fd_write_all(fd, e->blob, e->n_blob);
    }
    if (status == TDM_OK) {
        step = "fsync";
        status = fsync(fd) == 0 ? TDM_OK : TDM_ERR_IO;
    }
    if (fd >= 0 && close(fd) != 0 && status == TDM_OK) {
        step = "close";
        status = TDM_ERR_IO;
    }
    if (status == TDM_OK) {
        step = "rename";
        status = rename(tmp, e->path) == 0 ? TDM_OK : TDM_ERR_IO;
    }
    if (status != TDM_OK) {
        int err = errno;
        tier->stats.spill_failures_total++;
        tdm_log(TDM_LOG_WARN, "tier", "spill failed: session=%s file=%s step=%s: %s", e->id, tmp,
                step, strerror(err));
        if (fd >= 0) {
            (void)unlink(tmp);
        }
        e->path[0] = '\0';
    } else {
        sync_dir(tier->dir);
    }
    free(meta);
    return status;
}

/* Move host entry i to disk (1 when done; 0 when the disk cannot take it: it stays in host). */
static int spill_host_entry(decode_tier_t *tier, uint32_t i)
{
    entry_t *e = tier->items[i];

    if (tier->spill_max_bytes > 0 &&
        tier->stats.t[DECODE_TIER_DISK].bytes + e->bytes > tier->spill_max_bytes) {
        return 0;
    }
    if (write_file(tier, e) != TDM_OK) {
        return 0;
    }
    unlink_entry(tier, i);
    free(e->blob);
    free(e->ids);
    e->blob = NULL;
    e->ids = NULL;
    e->kind = DECODE_TIER_DISK;
    if (add_entry(tier, e) != TDM_OK) { /* no room in the table we just left: cannot happen */
        entry_free(e);
    }
    return 1;
}

/* Drop entry i's state (no room below its tier); the entry stays as a tombstone. */
static void drop_entry(decode_tier_t *tier, uint32_t i, const char *why)
{
    entry_t *e = tier->items[i];
    decode_tier_counts_t *c = &tier->stats.t[e->kind];

    c->drops_total++;
    c->sessions--;
    c->bytes -= e->bytes;
    tdm_log(TDM_LOG_INFO, "tier", "session state dropped from %s (%s): session=%s bytes=%llu",
            decode_tier_kind_name(e->kind), why, e->id, (unsigned long long)e->bytes);
    if (e->kind == DECODE_TIER_DISK && e->path[0] != '\0') {
        (void)unlink(e->path);
    }
    e->path[0] = '\0';
    free(e->blob);
    free(e->ids);
    e->blob = NULL;
    e->ids = NULL;
    e->gone = 1;
}

/* The entry of `kind` with the highest score, or -1. */
static int highest(const decode_tier_t *tier, decode_tier_kind_t kind, uint64_t now, double *score)
{
    int best = -1;

    for (uint32_t i = 0; i < tier->n; i++) {
        double sc;
        if (tier->items[i]->kind != kind || tier->items[i]->gone) {
            continue;
        }
        sc = decode_tier_score(&tier->items[i]->usage, now);
        if (best < 0 || sc > *score) {
            best = (int)i;
            *score = sc;
        }
    }
    return best;
}

/*
 * Make room for `bytes` more in the host tier by moving higher-scored entries than `score`
 * (the newcomer's) to disk, dropping those the disk cannot take only when they are the ones in
 * the way. Returns 1 when the room is there, 0 when the newcomer should go down instead.
 */
static int room_in_host(decode_tier_t *tier, uint64_t bytes, double score, uint64_t now)
{
    while (tier->stats.t[DECODE_TIER_HOST].bytes + bytes > tier->host_max_bytes) {
        double worst = 0;
        int i = highest(tier, DECODE_TIER_HOST, now, &worst);
        if (i < 0 || worst < score) {
            return 0; /* the newcomer is the one to go down */
        }
        if (!spill_host_entry(tier, (uint32_t)i)) {
            return 0; /* the disk refuses: the host entries stay, the newcomer goes down */
        }
    }
    return 1;
}

/* Make room for `bytes` on disk under spill_max_bytes by dropping higher-scored disk entries. */
static int room_on_disk(decode_tier_t *tier, uint64_t bytes, double score, uint64_t now)
{
    if (tier->dir[0] == '\0') {
        return 0;
    }
    while (tier->spill_max_bytes > 0 &&
           tier->stats.t[DECODE_TIER_DISK].bytes + bytes > tier->spill_max_bytes) {
        double worst = 0;
        int i = highest(tier, DECODE_TIER_DISK, now, &worst);
        if (i < 0 || worst < score) {
            return 0;
        }
        drop_entry(tier, (uint32_t)i, "disk tier full");
    }
    return 1;
}

tdm_status_t decode_tier_put(decode_tier_t *tier, const char *id, const decode_tier_usage_t *usage,
                             uint8_t *blob, size_t n_blob, int32_t *ids, int64_t n_ids,
                             decode_tier_kind_t *kind_out)
{
    uint64_t now = tdm_clock_now_ns();
    entry_t *e;
    double score;
    tdm_status_t status;

    if (tier == NULL || id == NULL || id[0] == '\0' || strlen(id) > TIER_ID_MAX ||
        usage == NULL || blob == NULL || n_blob <= 8 || n_ids < 0 ||
        (n_ids > 0 && ids == NULL) || kind_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    decode_tier_drop(tier, id);
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->blob = blob;
    e->n_blob = n_blob;
    e->ids = ids;
    e->n_ids = n_ids;
    e->bytes = (uint64_t)n_blob + (uint64_t)n_ids * sizeof(int32_t);
    e->usage = *usage;
    e->usage.size = e->bytes;
    score = decode_tier_score(&e->usage, now);

    e->kind = DECODE_TIER_HOST;
    if (e->bytes <= tier->host_max_bytes && room_in_host(tier, e->bytes, score, now)) {
        status = add_entry(tier, e);
    } else if (room_on_disk(tier, e->bytes, score, now)) {
        status = write_file(tier, e);
        if (status == TDM_OK) {
            e->kind = DECODE_TIER_DISK;
            status = add_entry(tier, e);
            if (status != TDM_OK) {
                (void)unlink(e->path);
            }
        }
    } else {
        status = TDM_ERR_UNSUPPORTED;
    }
    if (status != TDM_OK) {
        free(e); /* the caller keeps blob and ids */
        return status;
    }
    if (e->kind == DECODE_TIER_DISK) {
        /* the disk has the bytes now */
        free(e->blob);
        free(e->ids);
        e->blob = NULL;
        e->ids = NULL;
    }
    *kind_out = e->kind;
    return TDM_OK;
}

/* Read and check a disk entry's file into fresh buffers. */
static tdm_status_t read_file(const entry_t *e, uint8_t **blob_out, int32_t **ids_out)
{
    size_t id_len = strlen(e->id);
    size_t n_meta = TIER_HEADER_BYTES + id_len + (size_t)e->n_ids * 4 + 8;
    uint8_t *meta = NULL, *blob = NULL;
    int32_t *ids = NULL;
    const char *why = NULL;
    struct stat st;
    tdm_bytes_reader_t r;
    tdm_status_t status = TDM_OK;
    int fd = open(e->path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        tdm_log(TDM_LOG_WARN, "tier", "spill file missing: session=%s file=%s: %s", e->id, e->path,
                strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    meta = malloc(n_meta);
    blob = malloc(e->n_blob);
    ids = malloc((size_t)e->n_ids * sizeof(int32_t) + 1);
    if (meta == NULL || blob == NULL || ids == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto done;
    }
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != n_meta + e->n_blob) {
        why = "size";
    } else if (tdm_fd_read_all(fd, meta, n_meta) != TDM_OK ||
               tdm_fd_read_all(fd, blob, e->n_blob) != TDM_OK) {
        status = TDM_ERR_IO;
        why = "read";
    } else {
        r = (tdm_bytes_reader_t){meta, n_meta, 0, 0};
        const uint8_t *magic = tdm_bytes_get(&r, 4);
        uint32_t version = tdm_bytes_get_u32(&r);
        uint32_t n_id = tdm_bytes_get_u32(&r);
        (void)tdm_bytes_get_u32(&r);
        uint64_t n_ids = tdm_bytes_get_u64(&r);
        uint64_t n_blob = tdm_bytes_get_u64(&r);
        uint64_t trailer = tdm_bytes_get_u64(&r);
        (void)tdm_bytes_get_u64(&r);
        const uint8_t *id = tdm_bytes_get(&r, id_len);

        if (magic == NULL || memcmp(magic, TIER_MAGIC, 4) != 0 || version != TIER_VERSION ||
            n_id != id_len || n_ids != (uint64_t)e->n_ids || n_blob != e->n_blob || id == NULL ||
            memcmp(id, e->id, id_len) != 0) {
            why = "header";
        } else {
            for (int64_t i = 0; i < e->n_ids; i++) {
                ids[i] = (int32_t)tdm_bytes_get_u32(&r);
            }
            if (tdm_hash_xxh3_64(meta, r.at) != tdm_bytes_get_u64(&r) || r.bad) {
                why = "header checksum";
            } else if (blob_trailer(blob, e->n_blob) != trailer ||
                       tdm_hash_xxh3_64(blob, e->n_blob - 8) != trailer) {
                why = "pages and state checksum";
            }
        }
    }
    if (why != NULL && status == TDM_OK) {
        status = TDM_ERR_FORMAT;
    }
    if (why != NULL) {
        tdm_log(TDM_LOG_WARN, "tier",
                "spill file damaged (%s): session=%s file=%s; its state is rebuilt from the "
                "router's history",
                why, e->id, e->path);
    }
done:
    close(fd);
    free(meta);
    if (status != TDM_OK) {
        free(blob);
        free(ids);
        return status;
    }
    *blob_out = blob;
    *ids_out = ids;
    return TDM_OK;
}

tdm_status_t decode_tier_take(decode_tier_t *tier, const char *id, uint8_t **blob_out,
                              size_t *n_blob_out, int32_t **ids_out, int64_t *n_ids_out,
                              decode_tier_kind_t *kind_out)
{
    entry_t *e;
    uint8_t *blob = NULL;
    int32_t *ids = NULL;
    tdm_status_t status = TDM_OK;
    int i;

    if (tier == NULL || id == NULL || blob_out == NULL || n_blob_out == NULL ||
        ids_out == NULL || n_ids_out == NULL || kind_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    i = find(tier, id);
    if (i < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    e = unlink_entry(tier, (uint32_t)i);
    *kind_out = e->kind;
    if (e->gone) {
        status = TDM_ERR_NOT_FOUND;
    } else if (e->kind == DECODE_TIER_HOST) {
        blob = e->blob;
        ids = e->ids;
        e->blob = NULL;
        e->ids = NULL;
    } else {
        status = read_file(e, &blob, &ids);
    }
    if (status != TDM_OK) {
        tier->stats.t[e->kind].misses_total++;
        entry_free(e); /* removes the damaged file */
        return status;
    }
    if (e->n_ids == 0) {
        free(ids);
        ids = NULL;
    }
    *blob_out = blob;
    *n_blob_out = e->n_blob;
    *ids_out = ids;
    *n_ids_out = e->n_ids;
    entry_free(e);
    return TDM_OK;
}

void decode_tier_drop(decode_tier_t *tier, const char *id)
{
    int i;

    if (tier == NULL || id == NULL) {
        return;
    }
    i = find(tier, id);
    if (i >= 0) {
        entry_free(unlink_entry(tier, (uint32_t)i));
    }
}

void decode_tier_note_restore(decode_tier_t *tier, decode_tier_kind_t kind, uint64_t ns,
                              int64_t n_tokens)
{
    decode_tier_counts_t *c = &tier->stats.t[kind];
    double s = (double)ns * 1e-9;
    int b = 0;

    while (b < DECODE_TIER_N_BOUNDS && s > decode_tier_restore_bounds_s[b]) {
        b++;
    }
    c->restore_buckets[b]++;
    c->promotions_total++;
    c->restore_count++;
    c->restore_seconds += s;
    c->restore_tokens += n_tokens > 0 ? (uint64_t)n_tokens : 0;
}

void decode_tier_note_miss(decode_tier_t *tier, decode_tier_kind_t kind)
{
    tier->stats.t[kind].misses_total++;
}

tdm_status_t decode_tier_spill_path(const decode_tier_t *tier, const char *id, char *path_out,
                                    size_t n_path)
{
    int i = tier != NULL && id != NULL ? find(tier, id) : -1;

    if (i < 0 || tier->items[i]->kind != DECODE_TIER_DISK || tier->items[i]->gone) {
        return TDM_ERR_NOT_FOUND;
    }
    snprintf(path_out, n_path, "%s", tier->items[i]->path);
    return TDM_OK;
}

void decode_tier_stats(const decode_tier_t *tier, decode_tier_stats_t *stats_out)
{
    if (tier == NULL) {
        memset(stats_out, 0, sizeof(*stats_out));
        return;
    }
    *stats_out = tier->stats;
}

void decode_tier_render(const decode_tier_stats_t *st, tdm_prom_t *p)
{
    static const struct {
        const char *name;
        tdm_prom_type_t type;
        const char *help;
    } families[] = {
        {"tandem_decode_tier_sessions", TDM_PROM_GAUGE, "idle sessions whose state is in the tier"},
        {"tandem_decode_tier_bytes", TDM_PROM_GAUGE, "bytes of session state in the tier"},
        {"tandem_decode_tier_demotions_total", TDM_PROM_COUNTER,
         "session states moved into the tier (from the pool, or host to disk)"},
        {"tandem_decode_tier_promotions_total", TDM_PROM_COUNTER,
         "session states restored from the tier into the pool at their next turn"},
        {"tandem_decode_tier_misses_total", TDM_PROM_COUNTER,
         "turns whose state was gone or damaged in the tier (rebuilt from history)"},
        {"tandem_decode_tier_drops_total", TDM_PROM_COUNTER,
         "session states dropped from the tier for want of room below it"},
        {"tandem_decode_tier_restored_tokens_total", TDM_PROM_COUNTER,
         "sequence tokens restored from the tier instead of recomputed"},
        {"tandem_decode_tier_hit_rate", TDM_PROM_GAUGE,
         "promotions over promotions plus misses (0 with neither)"},
    };

    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        tdm_prom_family(p, families[f].name, families[f].type, families[f].help);
        for (int k = 0; k < DECODE_TIER_N; k++) {
            const decode_tier_counts_t *c = &st->t[k];
            const tdm_prom_label_t label = {"tier", decode_tier_kind_name((decode_tier_kind_t)k)};
            const uint64_t values[] = {c->sessions,     c->bytes,        c->demotions_total,
                                       c->promotions_total, c->misses_total, c->drops_total,
                                       c->restore_tokens};
            if (f < sizeof(values) / sizeof(values[0])) {
                tdm_prom_sample_u64(p, &label, 1, values[f]);
            } else {
                uint64_t n = c->promotions_total + c->misses_total;
                tdm_prom_sample(p, &label, 1, n > 0 ? (double)c->promotions_total / (double)n : 0);
            }
        }
    }
    tdm_prom_family(p, "tandem_decode_tier_restore_seconds", TDM_PROM_HISTOGRAM,
                    "wall time of one restore from the tier: read, checks, page import");
    for (int k = 0; k < DECODE_TIER_N; k++) {
        const decode_tier_counts_t *c = &st->t[k];
        const tdm_prom_label_t label = {"tier", decode_tier_kind_name((decode_tier_kind_t)k)};
        const tdm_prom_histogram_t h = {decode_tier_restore_bounds_s, DECODE_TIER_N_BOUNDS,
                                        c->restore_buckets, c->restore_seconds};
        tdm_prom_histogram(p, &label, 1, &h);
    }
    tdm_prom_counter(p, "tandem_decode_tier_spill_failures_total",
                     "spill file writes that failed (directory unwritable or disk full)",
                     st->spill_failures_total);
}
