/* fingerprint.c - the model fingerprint of a checkpoint directory (common/fingerprint.h). */
#include "common/fingerprint.h"

#include "common/clock.h"
#include "common/errbuf.h"
#include "common/hash.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define FP_PATH_BYTES         4096
#define SAFETENSORS_LEN_BYTES 8

/* Chain up to `limit_bytes` of an open file into *h (from its current offset); n_read_out gets
 * the bytes consumed. */
static tdm_status_t chain_stream(FILE *f, uint64_t limit_bytes, uint64_t *h, uint64_t *n_read_out)
{
    unsigned char *buf = malloc(TDM_FINGERPRINT_READ_BYTES);
    uint64_t total = 0;

    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    while (total < limit_bytes) {
        size_t want = limit_bytes - total < TDM_FINGERPRINT_READ_BYTES
                          ? (size_t)(limit_bytes - total)
                          : TDM_FINGERPRINT_READ_BYTES;
        size_t got = fread(buf, 1, want, f);
        if (got > 0) {
            *h = tdm_hash_xxh3_64_seeded(buf, got, *h);
            total += got;
        }
        if (got < want) {
            break;
        }
    }
    free(buf);
    if (ferror(f)) {
        return TDM_ERR_IO;
    }
    *n_read_out = total;
    return TDM_OK;
}

/* Whether chain_whole_file accepts a file that does not exist. */
typedef enum {
    FILE_REQUIRED = 0,
    FILE_OPTIONAL = 1, /* absent: nothing is hashed, TDM_OK */
} file_need_t;

static tdm_status_t chain_whole_file(const char *path, file_need_t need, uint64_t *h, char *err,
                                     size_t err_bytes)
{
    FILE *f = fopen(path, "rb");
    uint64_t n_read;
    tdm_status_t status;

    if (f == NULL) {
        int open_errno = errno;
        if (open_errno == ENOENT && need == FILE_OPTIONAL) {
            return TDM_OK;
        }
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(open_errno));
        return open_errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    status = chain_stream(f, UINT64_MAX, h, &n_read);
    fclose(f);
    if (status != TDM_OK) {
        tdm_errbuf_set(err, err_bytes, "%s: read failed", path);
    }
    return status;
}

static tdm_status_t chain_shard(const char *path, uint64_t *h, char *err, size_t err_bytes)
{
    unsigned char len_bytes[SAFETENSORS_LEN_BYTES];
    uint64_t header_bytes = 0;
    uint64_t n_read;
    tdm_status_t status;
    FILE *f = fopen(path, "rb");

    if (f == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
        return TDM_ERR_IO;
    }
    if (fread(len_bytes, 1, sizeof(len_bytes), f) != sizeof(len_bytes)) {
        tdm_errbuf_set(err, err_bytes, "%s: shorter than the 8-byte header length", path);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    for (int i = SAFETENSORS_LEN_BYTES - 1; i >= 0; i--) {
        header_bytes = (header_bytes << 8) | len_bytes[i];
    }
    if (header_bytes > TDM_FINGERPRINT_MAX_HEADER_BYTES) {
        tdm_errbuf_set(err, err_bytes, "%s: header length %llu too large", path,
                       (unsigned long long)header_bytes);
        status = TDM_ERR_FORMAT;
        goto out_close;
    }
    *h = tdm_hash_xxh3_64_seeded(len_bytes, sizeof(len_bytes), *h);
    status = chain_stream(f, header_bytes, h, &n_read);
    if (status == TDM_OK && n_read != header_bytes) {
        tdm_errbuf_set(err, err_bytes, "%s: header truncated (%llu of %llu bytes)", path,
                       (unsigned long long)n_read, (unsigned long long)header_bytes);
        status = TDM_ERR_FORMAT;
    }
    if (status == TDM_OK) {
        status = chain_stream(f, TDM_FINGERPRINT_DATA_BYTES, h, &n_read);
    }
    if (status == TDM_ERR_IO) {
        tdm_errbuf_set(err, err_bytes, "%s: read failed", path);
    }
out_close:
    fclose(f);
    return status;
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name);
    size_t m = strlen(suffix);
    return n > m && strcmp(name + n - m, suffix) == 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted names of the *.safetensors files of dir; caller frees each and the array. */
static tdm_status_t list_shards(const char *dir, char ***names_out, size_t *n_names_out, char *err,
                                size_t err_bytes)
{
    DIR *d = opendir(dir);
    struct dirent *entry;
    char **names;
    size_t n_names = 0;
    tdm_status_t status = TDM_OK;

    if (d == NULL) {
        int open_errno = errno;
        tdm_errbuf_set(err, err_bytes, "%s: %s", dir, strerror(open_errno));
        return open_errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    names = calloc(TDM_FINGERPRINT_MAX_SHARDS, sizeof(*names));
    if (names == NULL) {
        closedir(d);
        return TDM_ERR_NO_MEMORY;
    }
    while ((entry = readdir(d)) != NULL) {
        if (!has_suffix(entry->d_name, ".safetensors")) {
            continue;
        }
        if (n_names == TDM_FINGERPRINT_MAX_SHARDS) {
            tdm_errbuf_set(err, err_bytes, "%s: more than %d safetensors files", dir,
                           TDM_FINGERPRINT_MAX_SHARDS);
            status = TDM_ERR_FORMAT;
            break;
        }
        names[n_names] = strdup(entry->d_name);
        if (names[n_names] == NULL) {
            status = TDM_ERR_NO_MEMORY;
            break;
        }
        n_names++;
    }
    closedir(d);
    if (status != TDM_OK) {
        for (size_t i = 0; i < n_names; i++) {
            free(names[i]);
        }
        free(names);
        return status;
    }
    qsort(names, n_names, sizeof(*names), compare_names);
    *names_out = names;
    *n_names_out = n_names;
    return TDM_OK;
}

tdm_status_t tdm_model_fingerprint(const char *model_dir, uint64_t *fingerprint_out, char *err,
                                   size_t err_bytes)
{
    char path[FP_PATH_BYTES];
    char **names = NULL;
    size_t n_names = 0;
    uint64_t h = 0;
    tdm_status_t status;

    if (model_dir == NULL || fingerprint_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    status = chain_whole_file(path, FILE_REQUIRED, &h, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    status = chain_whole_file(path, FILE_OPTIONAL, &h, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = list_shards(model_dir, &names, &n_names, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    for (size_t i = 0; i < n_names && status == TDM_OK; i++) {
        snprintf(path, sizeof(path), "%s/%s", model_dir, names[i]);
        status = chain_shard(path, &h, err, err_bytes);
    }
    for (size_t i = 0; i < n_names; i++) {
        free(names[i]);
    }
    free(names);
    if (status != TDM_OK) {
        return status;
    }
    *fingerprint_out = h;
    return TDM_OK;
}

/* ---- the weights digest ----------------------------------------------------------------- */

#define DIGEST_CACHE_MAGIC     "tandem-weights-digest 2\n"
#define DIGEST_CACHE_MAX_BYTES (4u << 20) /* a cache file is the key plus one line */
#define DIGEST_KEY_LINE_BYTES  (NAME_MAX + 64)
#define DIGEST_PROGRESS_STEPS  10u

static void free_names(char **names, size_t n_names)
{
    for (size_t i = 0; i < n_names; i++) {
        free(names[i]);
    }
    free(names);
}

/* The cache key: the magic line, then "shard SIZE SEC.NSEC NAME" per shard in name order;
 * *total_out gets the bytes of every shard. Caller frees the text. */
static tdm_status_t digest_key(const char *dir, char *const *names, size_t n_names, char **key_out,
                               uint64_t *total_out, char *err, size_t err_bytes)
{
    size_t cap = sizeof(DIGEST_CACHE_MAGIC) + n_names * DIGEST_KEY_LINE_BYTES;
    char *key = malloc(cap);
    size_t used;
    uint64_t total = 0;

    if (key == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    used = (size_t)snprintf(key, cap, "%s", DIGEST_CACHE_MAGIC);
    for (size_t i = 0; i < n_names; i++) {
        char path[FP_PATH_BYTES];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (stat(path, &st) != 0) {
            tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
            free(key);
            return TDM_ERR_IO;
        }
        used += (size_t)snprintf(key + used, cap - used, "shard %llu %lld.%09ld %s\n",
                                 (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
                                 (long)st.st_mtim.tv_nsec, names[i]);
        total += (uint64_t)st.st_size;
    }
    *key_out = key;
    *total_out = total;
    return TDM_OK;
}

/* The digest a cache file at `path` holds for `key`; 0 on success, -1 when absent or stale. */
static int cache_read(const char *path, const char *key, uint64_t *digest_out)
{
    size_t n_key = strlen(key);
    FILE *f = fopen(path, "rb");
    char *text;
    size_t n;
    unsigned long long digest;
    char tail;
    int rc = -1;

    if (f == NULL) {
        return -1;
    }
    text = malloc(DIGEST_CACHE_MAX_BYTES + 1);
    if (text != NULL) {
        n = fread(text, 1, DIGEST_CACHE_MAX_BYTES, f);
        text[n] = '\0';
        if (n > n_key && memcmp(text, key, n_key) == 0 &&
            sscanf(text + n_key, "digest 0x%16llx%c", &digest, &tail) == 2 && tail == '\n' &&
            strlen(text + n_key) == strlen("digest 0x") + 16 + 1) {
            *digest_out = (uint64_t)digest;
            rc = 0;
        }
        free(text);
    }
    fclose(f);
    return rc;
}

/* Write key + digest to `path` through a temporary file and a rename. 0 or -1 (errno set). */
static int cache_write(const char *path, const char *key, uint64_t digest)
{
    char tmp[FP_PATH_BYTES + 64];
    char line[64];
    FILE *f;
    int ok;
    int saved;

    snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%08llx", path, (int)getpid(),
             (unsigned long long)(tdm_hash_splitmix64(tdm_clock_now_ns()) & 0xffffffffull));
    f = fopen(tmp, "wbx");
    if (f == NULL) {
        return -1;
    }
    snprintf(line, sizeof(line), "digest 0x%016llx\n", (unsigned long long)digest);
    ok = fputs(key, f) >= 0 && fputs(line, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path) == 0) {
        return 0;
    }
    saved = errno;
    unlink(tmp);
    errno = saved;
    return -1;
}

/* The cache file outside the checkpoint: "<cache dir>/weights-<hash of real path>.digest", the
 * directory created when missing. Returns 0 with path set, -1 when no cache directory is known. */
static int fallback_cache_path(const char *model_dir, char *path, size_t path_bytes)
{
    char real[PATH_MAX];
    char dir[FP_PATH_BYTES - 64]; /* room for the file name in `path` */
    const char *env = getenv("TANDEM_CACHE_DIR");
    const char *base;

    if (realpath(model_dir, real) == NULL) {
        return -1;
    }
    if (env != NULL && env[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s", env);
    } else if ((base = getenv("XDG_CACHE_HOME")) != NULL && base[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s/tandem", base);
    } else if ((base = getenv("HOME")) != NULL && base[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s/.cache", base);
        (void)mkdir(dir, 0755);
        snprintf(dir, sizeof(dir), "%s/.cache/tandem", base);
    } else {
        return -1;
    }
    (void)mkdir(dir, 0755); /* EEXIST is fine; any other failure shows at the write */
    snprintf(path, path_bytes, "%s/weights-%016llx.digest", dir,
             (unsigned long long)tdm_hash_xxh3_64(real, strlen(real)));
    return 0;
}

/* The shards of one digest, hashed by up to TDM_WEIGHTS_DIGEST_MAX_THREADS threads. */
typedef struct {
    const char *dir;
    char *const *names;
    size_t n_names;
    uint64_t *sizes;  /* [n_names] */
    uint64_t *hashes; /* [n_names] XXH3-64 of each whole shard */
    uint64_t total;
    uint64_t t0_ns;
    pthread_mutex_t lock; /* guards what follows */
    size_t next;          /* next shard to take */
    uint64_t done;        /* bytes hashed so far, every thread */
    uint32_t logged_step; /* progress lines written, of DIGEST_PROGRESS_STEPS */
    tdm_status_t status;  /* the first failure */
    char err[FP_PATH_BYTES + 128];
} digest_job_t;

static void job_fail(digest_job_t *job, tdm_status_t status, const char *fmt, const char *path)
{
    pthread_mutex_lock(&job->lock);
    if (job->status == TDM_OK) {
        job->status = status;
        snprintf(job->err, sizeof(job->err), fmt, path, strerror(errno));
    }
    pthread_mutex_unlock(&job->lock);
}

/* Count n bytes hashed; log when the total crosses the next tenth (big checkpoints only). */
static void job_progress(digest_job_t *job, uint64_t n)
{
    uint32_t step;

    pthread_mutex_lock(&job->lock);
    job->done += n;
    step = (uint32_t)((double)job->done / (double)job->total * DIGEST_PROGRESS_STEPS);
    if (job->total >= TDM_WEIGHTS_DIGEST_PROGRESS_BYTES && step > job->logged_step) {
        double s = (double)(tdm_clock_now_ns() - job->t0_ns) / TDM_NS_PER_S;
        double gib = (double)job->done / (double)(1ull << 30);
        job->logged_step = step;
        tdm_log(TDM_LOG_INFO, "fingerprint", "weights digest: %.1f of %.1f GiB (%.0f%%) %.2f GiB/s",
                gib, (double)job->total / (double)(1ull << 30),
                100.0 * (double)job->done / (double)job->total, s > 0.0 ? gib / s : 0.0);
    }
    pthread_mutex_unlock(&job->lock);
}

/* XXH3-64 of every byte of shard i into job->hashes[i], its size into job->sizes[i]. */
static void digest_shard(digest_job_t *job, size_t i, XXH3_state_t *state, unsigned char *buf)
{
    char path[FP_PATH_BYTES];
    struct stat st;
    uint64_t n = 0;
    int fd;

    snprintf(path, sizeof(path), "%s/%s", job->dir, job->names[i]);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        job_fail(job, TDM_ERR_IO, "%s: %s", path);
        if (fd >= 0) {
            close(fd);
        }
        return;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_64bits_reset(state);
    for (;;) {
        ssize_t got = read(fd, buf, TDM_WEIGHTS_DIGEST_READ_BYTES);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            job_fail(job, TDM_ERR_IO, "%s: read failed: %s", path);
            close(fd);
            return;
        }
        if (got == 0) {
            break;
        }
        XXH3_64bits_update(state, buf, (size_t)got);
        n += (uint64_t)got;
        job_progress(job, (uint64_t)got);
    }
    close(fd);
    job->sizes[i] = n;
    job->hashes[i] = (uint64_t)XXH3_64bits_digest(state);
}

static void *digest_thread(void *arg)
{
    digest_job_t *job = arg;
    XXH3_state_t *state = XXH3_createState();
    unsigned char *buf = malloc(TDM_WEIGHTS_DIGEST_READ_BYTES);

    if (state == NULL || buf == NULL) {
        pthread_mutex_lock(&job->lock);
        if (job->status == TDM_OK) {
            job->status = TDM_ERR_NO_MEMORY;
            snprintf(job->err, sizeof(job->err), "out of memory");
        }
        pthread_mutex_unlock(&job->lock);
    }
    for (;;) {
        size_t i;
        pthread_mutex_lock(&job->lock);
        i = job->status == TDM_OK && state != NULL && buf != NULL ? job->next++ : job->n_names;
        pthread_mutex_unlock(&job->lock);
        if (i >= job->n_names) {
            break;
        }
        digest_shard(job, i, state, buf);
    }
    free(buf);
    XXH3_freeState(state);
    return NULL;
}

static tdm_status_t digest_all(const char *dir, char *const *names, size_t n_names,
                               uint64_t total, uint64_t *digest_out, char *err, size_t err_bytes)
{
    pthread_t threads[TDM_WEIGHTS_DIGEST_MAX_THREADS];
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = n_names < TDM_WEIGHTS_DIGEST_MAX_THREADS ? n_names
                                                                 : TDM_WEIGHTS_DIGEST_MAX_THREADS;
    size_t n_started = 0;
    digest_job_t job;
    tdm_status_t status;

    memset(&job, 0, sizeof(job));
    job.dir = dir;
    job.names = names;
    job.n_names = n_names;
    job.total = total;
    job.t0_ns = tdm_clock_now_ns();
    job.sizes = calloc(n_names > 0 ? n_names : 1, sizeof(uint64_t));
    job.hashes = calloc(n_names > 0 ? n_names : 1, sizeof(uint64_t));
    if (job.sizes == NULL || job.hashes == NULL) {
        free(job.sizes);
        free(job.hashes);
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&job.lock, NULL);
    if (n_cpu > 0 && (size_t)n_cpu < n_threads) {
        n_threads = (size_t)n_cpu;
    }
    /* this thread takes part; the others are extra */
    for (size_t t = 1; t < n_threads; t++) {
        if (pthread_create(&threads[n_started], NULL, digest_thread, &job) != 0) {
            break; /* fewer threads: slower, not wrong */
        }
        n_started++;
    }
    digest_thread(&job);
    for (size_t t = 0; t < n_started; t++) {
        pthread_join(threads[t], NULL);
    }
    status = job.status;
    if (status == TDM_OK) {
        /* one XXH3-64 over (size, hash) of each shard, in name order */
        XXH3_state_t *state = XXH3_createState();
        if (state == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            XXH3_64bits_reset(state);
            for (size_t i = 0; i < n_names; i++) {
                unsigned char pair[16];
                for (int b = 0; b < 8; b++) {
                    pair[b] = (unsigned char)(job.sizes[i] >> (8 * b));
                    pair[8 + b] = (unsigned char)(job.hashes[i] >> (8 * b));
                }
                XXH3_64bits_update(state, pair, sizeof(pair));
            }
            *digest_out = (uint64_t)XXH3_64bits_digest(state);
            XXH3_freeState(state);
        }
    } else {
        tdm_errbuf_set(err, err_bytes, "%s", job.err);
    }
    if (status == TDM_OK && total >= TDM_WEIGHTS_DIGEST_PROGRESS_BYTES) {
        tdm_log(TDM_LOG_INFO, "fingerprint",
                "weights digest done: dir=%s bytes=%llu threads=%zu seconds=%.1f "
                "digest=0x%016llx",
                dir, (unsigned long long)total, n_started + 1,
                tdm_clock_elapsed_ms(job.t0_ns) / 1e3, (unsigned long long)*digest_out);
    }
    pthread_mutex_destroy(&job.lock);
    free(job.sizes);
    free(job.hashes);
    return status;
}

tdm_status_t tdm_weights_digest(const char *model_dir, uint32_t flags, uint64_t *digest_out,
                                char *err, size_t err_bytes)
{
    char beside[FP_PATH_BYTES];
    char elsewhere[FP_PATH_BYTES];
    char **names = NULL;
    size_t n_names = 0;
    char *key = NULL;
    uint64_t total = 0;
    uint64_t digest = 0;
    int have_elsewhere;
    int write_errno;
    tdm_status_t status;

    if (model_dir == NULL || digest_out == NULL) {
        tdm_errbuf_set(err, err_bytes, "invalid argument");
        return TDM_ERR_INVALID_ARG;
    }
    status = list_shards(model_dir, &names, &n_names, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = digest_key(model_dir, names, n_names, &key, &total, err, err_bytes);
    if (status != TDM_OK) {
        free_names(names, n_names);
        return status;
    }
    snprintf(beside, sizeof(beside), "%s/%s", model_dir, TDM_WEIGHTS_DIGEST_CACHE_NAME);
    have_elsewhere = fallback_cache_path(model_dir, elsewhere, sizeof(elsewhere)) == 0;
    if (!(flags & TDM_WEIGHTS_DIGEST_NO_CACHE) &&
        (cache_read(beside, key, &digest) == 0 ||
         (have_elsewhere && cache_read(elsewhere, key, &digest) == 0))) {
        goto done;
    }
    status = digest_all(model_dir, names, n_names, total, &digest, err, err_bytes);
    if (status != TDM_OK || (flags & TDM_WEIGHTS_DIGEST_NO_CACHE)) {
        goto done;
    }
    if (cache_write(beside, key, digest) != 0) {
        write_errno = errno;
        if (!have_elsewhere || cache_write(elsewhere, key, digest) != 0) {
            tdm_log(TDM_LOG_INFO, "fingerprint",
                    "weights digest not cached: dir=%s reason=\"%s\" (set TANDEM_CACHE_DIR to a "
                    "writable directory)",
                    model_dir, strerror(write_errno));
        } else {
            tdm_log(TDM_LOG_INFO, "fingerprint",
                    "weights digest cached outside the checkpoint: dir=%s cache=%s reason=\"%s\"",
                    model_dir, elsewhere, strerror(write_errno));
        }
    }
done:
    free(key);
    free_names(names, n_names);
    if (status == TDM_OK) {
        *digest_out = digest;
    }
    return status;
}
