/* sampler.c - Philox-4x32-10 Gumbel-max sampling with temperature, top-k, top-p and min-p
 * (MODEL.md 8); log-probabilities of the raw model distribution. See sampler.h. */
#include "engine/sampler.h"

#include "common/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLER_MODULE "sampler"

/* 2^-32: scales a 32-bit word (plus one half) into the open unit interval. */
#define WORD_TO_UNIT (1.0 / 4294967296.0)

/* Added to Gumbel upper bounds when pruning tokens that cannot win (guards libm's last ulp;
 * pruning only skips work and never changes a result). */
#define GUMBEL_BOUND_SLACK 1e-9

/* Top-p candidates: the kept mass is binned by s_max - s in quarter-nat buckets (the last one
 * holds everything past 31.75 nats); only buckets up to the one where the binned mass passes
 * top_p * Z (with a relative margin far above rounding) are sorted. */
#define TOP_P_BUCKETS         128
#define TOP_P_BUCKETS_PER_NAT 4.0
#define TOP_P_MASS_MARGIN     1e-9

/* Gumbel pruning: an upper bound on G for each value of the top 8 bits of w. */
#define GUMBEL_TABLE_BITS 8
#define GUMBEL_TABLE_SIZE (1 << GUMBEL_TABLE_BITS)

/* Longest validation message kept when sample() logs a rejected request. */
#define ERR_TEXT_BYTES 160

/* One token in rank order: (logit descending, id ascending). */
typedef struct {
    float logit;
    int32_t id;
} entry_t;

/*
 * The set the filters keep, as membership tests every pass can apply in any order:
 * finite logit, not after the cut (when has_cut) in rank order, and s - s_max >= log_min_p.
 */
typedef struct {
    double tau;
    double s_max;
    int has_cut;
    entry_t cut;
    double log_min_p; /* -inf when min-p is off */
} keep_t;

/* What one pass over the logits finds (the NaN check lives here). */
typedef struct {
    float max_logit;
    int32_t argmax; /* first id with the largest logit */
    int64_t n_finite;
} scan_t;

/* ---- Philox and Gumbel ------------------------------------------------------------------ */

static void philox_round(uint32_t c[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)ENGINE_SAMPLER_PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)ENGINE_SAMPLER_PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32);
    uint32_t lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32);
    uint32_t lo1 = (uint32_t)p1;
    uint32_t c1 = c[1];
    uint32_t c3 = c[3];

    c[0] = hi1 ^ c1 ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c3 ^ k[1];
    c[3] = lo0;
}

void engine_sampler_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
    uint32_t k[2] = {key[0], key[1]};

    for (int round = 0; round < ENGINE_SAMPLER_PHILOX_ROUNDS; round++) {
        if (round > 0) {
            k[0] += ENGINE_SAMPLER_PHILOX_W0;
            k[1] += ENGINE_SAMPLER_PHILOX_W1;
        }
        philox_round(c, k);
    }
    memcpy(out, c, sizeof(c));
}

static double gumbel_of_word(uint32_t w)
{
    double u = ((double)w + 0.5) * WORD_TO_UNIT;

    return -log(-log(u));
}

double engine_sampler_gumbel(uint64_t seed, uint32_t position, uint32_t token)
{
    const uint32_t counter[4] = {position, token, 0, 0};
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    uint32_t out[4];

    engine_sampler_philox4x32_10(counter, key, out);
    return gumbel_of_word(out[0]);
}

/* Word 0 of Philox-4x32-10(key, counter = (position, token, 0, 0)), all in registers. */
static uint32_t philox_word0(uint32_t k0, uint32_t k1, uint32_t position, uint32_t token)
{
    uint32_t c0 = position;
    uint32_t c1 = token;
    uint32_t c2 = 0;
    uint32_t c3 = 0;

    for (int round = 0; round < ENGINE_SAMPLER_PHILOX_ROUNDS; round++) {
        uint64_t p0 = (uint64_t)ENGINE_SAMPLER_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)ENGINE_SAMPLER_PHILOX_M1 * c2;

        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        k0 += ENGINE_SAMPLER_PHILOX_W0;
        k1 += ENGINE_SAMPLER_PHILOX_W1;
    }
    return c0;
}

/* ---- parameters ------------------------------------------------------------------------- */

void engine_sampler_params_default(engine_sampler_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->temperature = 1.0;
    params->top_k = 0;
    params->top_p = 1.0;
    params->min_p = 0.0;
    params->seed = 0;
    params->n_logprobs = ENGINE_SAMPLER_LOGPROBS_OFF;
    params->n_stop_ids = 0;
}

int engine_sampler_is_greedy(const engine_sampler_params_t *params)
{
    return params->temperature < ENGINE_SAMPLER_GREEDY_BELOW;
}

static tdm_status_t reject(char *err, size_t err_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tdm_status_t reject(char *err, size_t err_bytes, const char *fmt, ...)
{
    va_list args;

    if (err != NULL && err_bytes > 0) {
        va_start(args, fmt);
        vsnprintf(err, err_bytes, fmt, args);
        va_end(args);
    }
    return TDM_ERR_INVALID_ARG;
}

tdm_status_t engine_sampler_params_validate(const engine_sampler_params_t *params, int64_t n_vocab,
                                            char *err, size_t err_bytes)
{
    if (params == NULL) {
        return reject(err, err_bytes, "params: null");
    }
    if (n_vocab < 1 || n_vocab > INT32_MAX) {
        return reject(err, err_bytes, "n_vocab: %lld outside [1, %d]", (long long)n_vocab,
                      INT32_MAX);
    }
    if (!isfinite(params->temperature) || params->temperature < 0.0) {
        return reject(err, err_bytes, "temperature: %g is not a finite value >= 0",
                      params->temperature);
    }
    if (params->top_k < 0) {
        return reject(err, err_bytes, "top_k: %d is negative (0 turns top-k off)",
                      (int)params->top_k);
    }
    if (!(params->top_p > 0.0 && params->top_p <= 1.0)) {
        return reject(err, err_bytes, "top_p: %g outside (0, 1]", params->top_p);
    }
    if (!(params->min_p >= 0.0 && params->min_p <= 1.0)) {
        return reject(err, err_bytes, "min_p: %g outside [0, 1]", params->min_p);
    }
    if (params->n_logprobs < ENGINE_SAMPLER_LOGPROBS_OFF ||
        params->n_logprobs > ENGINE_SAMPLER_MAX_LOGPROBS) {
        return reject(err, err_bytes, "n_logprobs: %d outside [%d, %d]", params->n_logprobs,
                      ENGINE_SAMPLER_LOGPROBS_OFF, ENGINE_SAMPLER_MAX_LOGPROBS);
    }
    if (params->n_stop_ids < 0 || params->n_stop_ids > ENGINE_SAMPLER_MAX_STOP_IDS) {
        return reject(err, err_bytes, "n_stop_ids: %d outside [0, %d]", params->n_stop_ids,
                      ENGINE_SAMPLER_MAX_STOP_IDS);
    }
    for (int i = 0; i < params->n_stop_ids; i++) {
        if (params->stop_ids[i] < 0 || params->stop_ids[i] >= n_vocab) {
            return reject(err, err_bytes, "stop_ids[%d]: %d outside [0, %lld)", i,
                          (int)params->stop_ids[i], (long long)n_vocab);
        }
    }
    return TDM_OK;
}

size_t engine_sampler_scratch_bytes(int64_t n_vocab)
{
    if (n_vocab < 0) {
        n_vocab = 0;
    }
    return (size_t)n_vocab * sizeof(entry_t) + _Alignof(entry_t);
}

int engine_sampler_is_stop(const engine_sampler_params_t *params, int32_t token)
{
    for (int i = 0; i < params->n_stop_ids && i < ENGINE_SAMPLER_MAX_STOP_IDS; i++) {
        if (params->stop_ids[i] == token) {
            return 1;
        }
    }
    return 0;
}

/* ---- rank order, heap, sort --------------------------------------------------------------- */

/* Nonzero when a comes strictly before b in (logit descending, id ascending) order. */
static int ranks_before(const entry_t *a, const entry_t *b)
{
    if (a->logit != b->logit) {
        return a->logit > b->logit;
    }
    return a->id < b->id;
}

/* qsort comparator for rank order (ids are distinct, so the order is total). */
static int compare_rank(const void *pa, const void *pb)
{
    const entry_t *a = pa;
    const entry_t *b = pb;

    if (ranks_before(a, b)) {
        return -1;
    }
    return ranks_before(b, a) ? 1 : 0;
}

/* Restore the heap property below index i of a heap whose root is its worst-ranked entry. */
static void heap_sift_down(entry_t *heap, int64_t n, int64_t i)
{
    for (;;) {
        int64_t worst = i;
        int64_t left = 2 * i + 1;
        int64_t right = left + 1;
        entry_t tmp;

        if (left < n && ranks_before(&heap[worst], &heap[left])) {
            worst = left;
        }
        if (right < n && ranks_before(&heap[worst], &heap[right])) {
            worst = right;
        }
        if (worst == i) {
            return;
        }
        tmp = heap[i];
        heap[i] = heap[worst];
        heap[worst] = tmp;
        i = worst;
    }
}

/* Offer e to a heap holding the best `cap` entries seen so far (root = worst of them). */
static void heap_offer(entry_t *heap, int64_t *n, int64_t cap, entry_t e)
{
    int64_t i;

    if (*n < cap) {
        i = (*n)++;
        heap[i] = e;
        while (i > 0) {
            int64_t parent = (i - 1) / 2;
            entry_t tmp;

            if (!ranks_before(&heap[parent], &heap[i])) {
                break;
            }
            tmp = heap[i];
            heap[i] = heap[parent];
            heap[parent] = tmp;
            i = parent;
        }
        return;
    }
    if (ranks_before(&e, &heap[0])) {
        heap[0] = e;
        heap_sift_down(heap, *n, 0);
    }
}

/* The best `cap` finite-logit tokens, sorted in rank order, into best[]; returns how many. */
static int64_t best_tokens(const float *logits, int64_t n_vocab, int64_t cap, entry_t *best)
{
    int64_t n = 0;

    for (int64_t x = 0; x < n_vocab; x++) {
        entry_t e = {logits[x], (int32_t)x};

        if (isfinite(e.logit)) {
            heap_offer(best, &n, cap, e);
        }
    }
    qsort(best, (size_t)n, sizeof(best[0]), compare_rank);
    return n;
}

/* ---- the kept set ------------------------------------------------------------------------ */

/* s(x) - s_max: the log of p(x)/p_max at temperature tau. */
static double rel_scaled(const keep_t *keep, float logit)
{
    return (double)logit / keep->tau - keep->s_max;
}

static int keeps(const keep_t *keep, float logit, int32_t id)
{
    entry_t e = {logit, id};

    if (!isfinite(logit)) {
        return 0;
    }
    if (keep->has_cut && ranks_before(&keep->cut, &e)) {
        return 0;
    }
    return keep->log_min_p == -INFINITY || rel_scaled(keep, logit) >= keep->log_min_p;
}

/*
 * One pass: NaN or +inf is an engine error; finds the largest logit, its first id and the
 * number of finite logits (all -inf is an engine error too). Logged here, once.
 */
static tdm_status_t scan_logits(const float *logits, int64_t n_vocab, scan_t *scan_out)
{
    scan_t scan = {-INFINITY, -1, 0};

    for (int64_t x = 0; x < n_vocab; x++) {
        float v = logits[x];

        if (isnan(v) || v == INFINITY) {
            tdm_log(TDM_LOG_ERROR, SAMPLER_MODULE, "bad logit: token=%lld value=%s n_vocab=%lld",
                    (long long)x, isnan(v) ? "nan" : "+inf", (long long)n_vocab);
            return TDM_ERR_INTERNAL;
        }
        if (v == -INFINITY) {
            continue;
        }
        scan.n_finite++;
        if (scan.argmax < 0 || v > scan.max_logit) {
            scan.max_logit = v;
            scan.argmax = (int32_t)x;
        }
    }
    if (scan.n_finite == 0) {
        tdm_log(TDM_LOG_ERROR, SAMPLER_MODULE, "no finite logit: n_vocab=%lld", (long long)n_vocab);
        return TDM_ERR_INTERNAL;
    }
    *scan_out = scan;
    return TDM_OK;
}

/* The top-p bucket of a token with s - s_max = rel (<= 0); monotone, so buckets up to any b hold
 * a prefix of rank order. */
static int mass_bucket(double rel)
{
    double b = -rel * TOP_P_BUCKETS_PER_NAT;

    return b < (double)(TOP_P_BUCKETS - 1) ? (int)b : TOP_P_BUCKETS - 1;
}

/*
 * Candidates for the top-p cut: kept tokens in buckets <= max_bucket, sorted in rank order.
 * Sets *found and the cut when a running sum (rank order) reaches target; *n_dropped counts kept
 * tokens left out by max_bucket.
 */
static void top_p_prefix(keep_t *keep, const float *logits, int64_t n_vocab, double target,
                         int max_bucket, entry_t *cand, int *found, int64_t *n_dropped)
{
    int64_t n_cand = 0;
    double sum = 0.0;

    *found = 0;
    *n_dropped = 0;
    for (int64_t x = 0; x < n_vocab; x++) {
        if (!keeps(keep, logits[x], (int32_t)x)) {
            continue;
        }
        if (mass_bucket(rel_scaled(keep, logits[x])) > max_bucket) {
            (*n_dropped)++;
            continue;
        }
        cand[n_cand].logit = logits[x];
        cand[n_cand].id = (int32_t)x;
        n_cand++;
    }
    qsort(cand, (size_t)n_cand, sizeof(cand[0]), compare_rank);
    for (int64_t i = 0; i < n_cand; i++) {
        sum += exp(rel_scaled(keep, cand[i].logit));
        if (sum >= target) {
            keep->has_cut = 1;
            keep->cut = cand[i];
            *found = 1;
            return;
        }
    }
}

/*
 * The set the filters keep at tau > 0 (order: top-k, top-p on the top-k set, min-p). Every filter
 * keeps a prefix of rank order, so the result is the shortest of the three prefixes; min-p is a
 * plain threshold and restricts top-p's candidates without changing its cut. work: [n_vocab].
 */
static void build_keep(const engine_sampler_params_t *params, const float *logits, int64_t n_vocab,
                       const scan_t *scan, entry_t *work, keep_t *keep_out)
{
    keep_t keep;

    keep.tau = params->temperature;
    keep.s_max = (double)scan->max_logit / keep.tau;
    keep.has_cut = 0;
    keep.cut.logit = scan->max_logit;
    keep.cut.id = scan->argmax;
    keep.log_min_p = params->min_p > 0.0 ? log(params->min_p) : -INFINITY;

    if (params->top_k > 0 && params->top_k < scan->n_finite) {
        int64_t n_best = best_tokens(logits, n_vocab, params->top_k, work);

        keep.has_cut = 1;
        keep.cut = work[n_best - 1];
    }

    if (params->top_p < 1.0) {
        keep_t top_k_set = keep;
        double mass[TOP_P_BUCKETS] = {0};
        double z = 0.0;
        double binned = 0.0;
        double target;
        int max_bucket = TOP_P_BUCKETS - 1;
        int found;
        int64_t n_dropped;

        top_k_set.log_min_p = -INFINITY;
        for (int64_t x = 0; x < n_vocab; x++) {
            if (keeps(&top_k_set, logits[x], (int32_t)x)) {
                double rel = rel_scaled(&keep, logits[x]);
                double e = exp(rel);

                z += e;
                mass[mass_bucket(rel)] += e;
            }
        }
        target = params->top_p * z;
        for (int b = 0; b < TOP_P_BUCKETS; b++) {
            binned += mass[b];
            if (binned >= target * (1.0 + TOP_P_MASS_MARGIN)) {
                max_bucket = b;
                break;
            }
        }
        /* The cut lies in max_bucket or before unless rounding says otherwise; then no prefix
         * of the candidates reaches the target and the cut is looked for again among every
         * token (a safety net: the result must equal the plain definition, never depend on
         * the buckets). */
        top_p_prefix(&keep, logits, n_vocab, target, max_bucket, work, &found, &n_dropped);
        if (found == 0 && n_dropped > 0) {
            top_p_prefix(&keep, logits, n_vocab, target, TOP_P_BUCKETS - 1, work, &found,
                         &n_dropped);
        }
    }
    *keep_out = keep;
}

/*
 * Gumbel-max over the kept set. The argmax (always kept) seeds the best score; a token whose
 * s + (upper bound of G over its w's top bits) cannot reach the best is skipped before the two
 * logs, which leaves the result exactly that of scoring every kept token.
 */
static int32_t gumbel_argmax(const keep_t *keep, const float *logits, int64_t n_vocab,
                             uint64_t seed, uint32_t position, int32_t argmax)
{
    double g_upper[GUMBEL_TABLE_SIZE];
    uint32_t k0 = (uint32_t)(seed & 0xffffffffu);
    uint32_t k1 = (uint32_t)(seed >> 32);
    int32_t best = argmax;
    double best_score = (double)logits[argmax] / keep->tau +
                        engine_sampler_gumbel(seed, position, (uint32_t)argmax);

    for (uint32_t i = 0; i < GUMBEL_TABLE_SIZE; i++) {
        uint32_t top_word = (i << (32 - GUMBEL_TABLE_BITS)) | (UINT32_MAX >> GUMBEL_TABLE_BITS);

        g_upper[i] = gumbel_of_word(top_word) + GUMBEL_BOUND_SLACK;
    }
    for (int64_t x = 0; x < n_vocab; x++) {
        double s;
        double score;
        uint32_t w;

        if (!keeps(keep, logits[x], (int32_t)x)) {
            continue;
        }
        s = (double)logits[x] / keep->tau;
        w = philox_word0(k0, k1, position, (uint32_t)x);
        if (s + g_upper[w >> (32 - GUMBEL_TABLE_BITS)] < best_score) {
            continue;
        }
        score = s + gumbel_of_word(w);
        if (score > best_score || (score == best_score && x < best)) {
            best_score = score;
            best = (int32_t)x;
        }
    }
    return best;
}

/* Log-softmax of the raw logits (temperature 1, unfiltered) for `token` and the best n. */
static void fill_logprobs(const float *logits, int64_t n_vocab, const scan_t *scan, int n_top,
                          engine_sample_t *sample)
{
    entry_t best[ENGINE_SAMPLER_MAX_LOGPROBS];
    double max_logit = (double)scan->max_logit;
    double sum = 0.0;
    double lse;
    int64_t n_best = 0;

    for (int64_t x = 0; x < n_vocab; x++) {
        if (isfinite(logits[x])) {
            sum += exp((double)logits[x] - max_logit);
        }
    }
    lse = max_logit + log(sum);
    sample->logprob = (double)logits[sample->token] - lse;
    if (n_top > 0) {
        n_best = best_tokens(logits, n_vocab, n_top, best);
    }
    for (int64_t i = 0; i < n_best; i++) {
        sample->top[i].token = best[i].id;
        sample->top[i].logprob = (double)best[i].logit - lse;
    }
    sample->n_top = (int)n_best;
}

/* ---- entry points ------------------------------------------------------------------------ */

/* Checks shared by sample and filtered_probs; logs the reason (the caller does not). */
static tdm_status_t check_call(const engine_sampler_params_t *params, const float *logits,
                               int64_t n_vocab, tdm_arena_t *scratch)
{
    char err[ERR_TEXT_BYTES];

    if (engine_sampler_params_validate(params, n_vocab, err, sizeof(err)) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, SAMPLER_MODULE, "sampling rejected: %s", err);
        return TDM_ERR_INVALID_ARG;
    }
    if (logits == NULL || scratch == NULL) {
        tdm_log(TDM_LOG_WARN, SAMPLER_MODULE, "sampling rejected: %s is null",
                logits == NULL ? "logits" : "scratch");
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

/* The arena's scratch for one call; NULL when it lacks room (logged). */
static entry_t *take_scratch(tdm_arena_t *scratch, int64_t n_vocab)
{
    entry_t *work = tdm_arena_alloc(scratch, (size_t)n_vocab * sizeof(entry_t), _Alignof(entry_t));

    if (work == NULL) {
        tdm_log(TDM_LOG_ERROR, SAMPLER_MODULE,
                "sampler scratch too small: need_bytes=%zu free_bytes=%zu",
                engine_sampler_scratch_bytes(n_vocab),
                scratch->capacity_bytes - scratch->used_bytes);
    }
    return work;
}

/*
 * The logits the filters see: `logits` itself, or with params->suppress_stop a malloc'ed copy
 * (*copy_out, caller frees) with every stop id at -inf (min_tokens; only the first tokens of such
 * a request pay the copy, so the scratch size stays that of the plain path). NULL when out of
 * memory.
 */
static const float *masked_logits(const engine_sampler_params_t *params, const float *logits,
                                  int64_t n_vocab, float **copy_out)
{
    float *copy;

    *copy_out = NULL;
    if (!params->suppress_stop || params->n_stop_ids == 0) {
        return logits;
    }
    copy = malloc((size_t)n_vocab * sizeof(float));
    if (copy == NULL) {
        tdm_log(TDM_LOG_ERROR, SAMPLER_MODULE, "no memory for the suppress_stop copy");
        return NULL;
    }
    *copy_out = copy;
    memcpy(copy, logits, (size_t)n_vocab * sizeof(float));
    for (int i = 0; i < params->n_stop_ids && i < ENGINE_SAMPLER_MAX_STOP_IDS; i++) {
        if (params->stop_ids[i] >= 0 && params->stop_ids[i] < n_vocab) {
            copy[params->stop_ids[i]] = -INFINITY;
        }
    }
    return copy;
}

tdm_status_t engine_sampler_sample(const engine_sampler_params_t *params, const float *logits,
                                   int64_t n_vocab, int64_t position, tdm_arena_t *scratch,
                                   engine_sample_t *sample_out)
{
    engine_sample_t sample;
    float *copy = NULL;
    size_t mark;
    entry_t *work;
    scan_t scan;
    keep_t keep;
    tdm_status_t status;

    status = check_call(params, logits, n_vocab, scratch);
    if (status != TDM_OK) {
        return status;
    }
    if (position < 0 || position > ENGINE_SAMPLER_MAX_POSITION) {
        tdm_log(TDM_LOG_WARN, SAMPLER_MODULE, "sampling rejected: position=%lld outside [0, %lld]",
                (long long)position, (long long)ENGINE_SAMPLER_MAX_POSITION);
        return TDM_ERR_INVALID_ARG;
    }
    mark = scratch->used_bytes;
    work = take_scratch(scratch, n_vocab);
    logits = work != NULL ? masked_logits(params, logits, n_vocab, &copy) : NULL;
    if (work == NULL || logits == NULL) {
        scratch->used_bytes = mark;
        return TDM_ERR_NO_MEMORY;
    }
    status = scan_logits(logits, n_vocab, &scan);
    if (status != TDM_OK) {
        goto out_release_scratch;
    }

    memset(&sample, 0, sizeof(sample));
    if (engine_sampler_is_greedy(params)) {
        sample.token = scan.argmax;
    } else {
        build_keep(params, logits, n_vocab, &scan, work, &keep);
        sample.token =
            gumbel_argmax(&keep, logits, n_vocab, params->seed, (uint32_t)position, scan.argmax);
    }
    if (params->n_logprobs != ENGINE_SAMPLER_LOGPROBS_OFF) {
        fill_logprobs(logits, n_vocab, &scan, params->n_logprobs, &sample);
    }
    *sample_out = sample;

out_release_scratch:
    free(copy);
    scratch->used_bytes = mark;
    return status;
}

tdm_status_t engine_sampler_filtered_probs(const engine_sampler_params_t *params,
                                           const float *logits, int64_t n_vocab,
                                           tdm_arena_t *scratch, double *probs_out)
{
    size_t mark;
    entry_t *work;
    scan_t scan;
    keep_t keep;
    double z = 0.0;
    float *copy = NULL;
    tdm_status_t status;

    status = check_call(params, logits, n_vocab, scratch);
    if (status != TDM_OK) {
        return status;
    }
    if (probs_out == NULL) {
        tdm_log(TDM_LOG_WARN, SAMPLER_MODULE, "sampling rejected: probs_out is null");
        return TDM_ERR_INVALID_ARG;
    }
    mark = scratch->used_bytes;
    work = take_scratch(scratch, n_vocab);
    logits = work != NULL ? masked_logits(params, logits, n_vocab, &copy) : NULL;
    if (work == NULL || logits == NULL) {
        scratch->used_bytes = mark;
        return TDM_ERR_NO_MEMORY;
    }
    status = scan_logits(logits, n_vocab, &scan);
    if (status != TDM_OK) {
        goto out_release_scratch;
    }

    if (engine_sampler_is_greedy(params)) {
        memset(probs_out, 0, (size_t)n_vocab * sizeof(probs_out[0]));
        probs_out[scan.argmax] = 1.0;
        goto out_release_scratch;
    }
    build_keep(params, logits, n_vocab, &scan, work, &keep);
    for (int64_t x = 0; x < n_vocab; x++) {
        if (keeps(&keep, logits[x], (int32_t)x)) {
            probs_out[x] = exp(rel_scaled(&keep, logits[x]));
            z += probs_out[x];
        } else {
            probs_out[x] = 0.0;
        }
    }
    for (int64_t x = 0; x < n_vocab; x++) {
        probs_out[x] /= z;
    }

out_release_scratch:
    free(copy);
    scratch->used_bytes = mark;
    return status;
}
