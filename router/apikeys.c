/* apikeys.c - API keys, tenants and per-key limits (apikeys.h). */
#include "router/apikeys.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/prom.h"

#define DIGEST_BYTES 32u
#define NS_PER_MIN   (60ull * 1000000000ull)

/* One key: its digest, public name, limits and usage (guarded by the table's lock). */
typedef struct {
    unsigned char digest[DIGEST_BYTES];
    char name[ROUTER_APIKEY_NAME_BYTES + 1];
    router_apikeys_limits_t limits;
    double tokens;          /* rate bucket: requests available now (<= rpm) */
    uint64_t t_refill_ns;   /* when tokens was last refilled; 0 = never (bucket full) */
    uint32_t inflight;      /* admitted, not yet released */
    uint64_t n_requests;    /* admitted */
    uint64_t n_rate;        /* refused over rpm */
    uint64_t n_concurrency; /* refused over max_concurrency */
} apikey_t;

struct router_apikeys {
    pthread_mutex_t lock;
    apikey_t *keys; /* [n_keys] */
    size_t n_keys;
    size_t cap_keys;
    uint64_t n_auth_failures;
};

static int digest_of(const char *key, size_t n, unsigned char out[DIGEST_BYTES])
{
    unsigned int n_out = 0;

    return EVP_Digest(key, n, out, &n_out, EVP_sha256(), NULL) == 1 && n_out == DIGEST_BYTES;
}

static int key_char_ok(unsigned char c)
{
    return c > 0x20 && c < 0x7f && c != ',';
}

static int name_ok(const char *name, size_t n)
{
    if (n == 0 || n > ROUTER_APIKEY_NAME_BYTES) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '_' && c != '.' && c != '-') {
            return 0;
        }
    }
    return 1;
}

/* Parse an unsigned decimal of n bytes into *out (<= UINT32_MAX). */
static int u32_of(const char *text, size_t n, uint32_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 10) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return 0;
        }
        v = v * 10 + (uint64_t)(text[i] - '0');
    }
    if (v > UINT32_MAX) {
        return 0;
    }
    *out = (uint32_t)v;
    return 1;
}

/* Next whitespace-separated word of line[*at, n): its start and length (0 at the end). */
static size_t next_word(const char *line, size_t n, size_t *at, const char **word_out)
{
    size_t i = *at;
    size_t start;

    while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) {
        i++;
    }
    start = i;
    while (i < n && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
        i++;
    }
    *at = i;
    *word_out = line + start;
    return i - start;
}

/* Add the entry of one line (n bytes, no separator) to t. */
static tdm_status_t add_entry(router_apikeys_t *t, const char *line, size_t n,
                              const router_apikeys_limits_t *defaults, const char *where,
                              size_t line_no, char *err, size_t err_bytes)
{
    const char *word;
    size_t at = 0;
    size_t n_word = next_word(line, n, &at, &word);
    apikey_t k;

    if (n_word == 0 || word[0] == '#') {
        return TDM_OK;
    }
    memset(&k, 0, sizeof(k));
    if (n_word < ROUTER_APIKEY_MIN_BYTES || n_word > ROUTER_APIKEY_MAX_BYTES) {
        snprintf(err, err_bytes, "%s entry %zu: a key must be %u..%u bytes", where, line_no,
                 ROUTER_APIKEY_MIN_BYTES, ROUTER_APIKEY_MAX_BYTES);
        return TDM_ERR_FORMAT;
    }
    for (size_t i = 0; i < n_word; i++) {
        if (!key_char_ok((unsigned char)word[i])) {
            snprintf(err, err_bytes,
                     "%s entry %zu: a key holds printable ASCII without spaces or commas", where,
                     line_no);
            return TDM_ERR_FORMAT;
        }
    }
    if (!digest_of(word, n_word, k.digest)) {
        snprintf(err, err_bytes, "%s entry %zu: cannot digest the key", where, line_no);
        return TDM_ERR_NO_MEMORY;
    }
    k.limits = *defaults;
    snprintf(k.name, sizeof(k.name), "key%zu", t->n_keys + 1);
    while ((n_word = next_word(line, n, &at, &word)) > 0) {
        const char *eq = memchr(word, '=', n_word);
        size_t n_name = eq != NULL ? (size_t)(eq - word) : n_word;
        const char *value = eq != NULL ? eq + 1 : word + n_word;
        size_t n_value = n_word - n_name - (eq != NULL);
        int ok = 0;
        if (eq != NULL && n_name == 4 && memcmp(word, "name", 4) == 0) {
            ok = name_ok(value, n_value);
            if (ok) {
                memcpy(k.name, value, n_value);
                k.name[n_value] = '\0';
            }
        } else if (eq != NULL && n_name == 11 && memcmp(word, "concurrency", 11) == 0) {
            ok = u32_of(value, n_value, &k.limits.max_concurrency);
        } else if (eq != NULL && n_name == 3 && memcmp(word, "rpm", 3) == 0) {
            ok = u32_of(value, n_value, &k.limits.rpm);
        }
        if (!ok) {
            snprintf(err, err_bytes,
                     "%s entry %zu: bad option '%.*s' (expected name=[A-Za-z0-9_.-]{1,63}, "
                     "concurrency=N, rpm=N)",
                     where, line_no, (int)(n_name < 32 ? n_name : 32), word);
            return TDM_ERR_FORMAT;
        }
    }
    for (size_t i = 0; i < t->n_keys; i++) {
        if (CRYPTO_memcmp(t->keys[i].digest, k.digest, DIGEST_BYTES) == 0) {
            snprintf(err, err_bytes, "%s entry %zu: the same key is given twice", where, line_no);
            return TDM_ERR_FORMAT;
        }
        if (strcmp(t->keys[i].name, k.name) == 0) {
            snprintf(err, err_bytes, "%s entry %zu: the name '%s' is used twice", where, line_no,
                     k.name);
            return TDM_ERR_FORMAT;
        }
    }
    if (t->n_keys == ROUTER_APIKEYS_MAX) {
        snprintf(err, err_bytes, "%s entry %zu: more than %u keys", where, line_no,
                 ROUTER_APIKEYS_MAX);
        return TDM_ERR_FORMAT;
    }
    if (t->n_keys == t->cap_keys) {
        apikey_t *grown = tdm_array_grow(t->keys, sizeof(*grown), t->n_keys + 1, 8, &t->cap_keys);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        t->keys = grown;
    }
    k.tokens = (double)k.limits.rpm;
    t->keys[t->n_keys++] = k;
    OPENSSL_cleanse(&k, sizeof(k));
    return TDM_OK;
}

/* Add every entry of text (separated by newlines, and by commas when `commas`). */
static tdm_status_t add_text(router_apikeys_t *t, const char *text, int commas,
                             const router_apikeys_limits_t *defaults, const char *where, char *err,
                             size_t err_bytes)
{
    size_t line_no = 0;

    while (*text != '\0') {
        size_t n = strcspn(text, commas ? "\n," : "\n");
        tdm_status_t status = add_entry(t, text, n, defaults, where, ++line_no, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
        text += n;
        if (*text != '\0') {
            text++;
        }
    }
    return TDM_OK;
}

tdm_status_t router_apikeys_create(const char *path, const char *text,
                                   const router_apikeys_limits_t *defaults,
                                   router_apikeys_t **keys_out, char *err, size_t err_bytes)
{
    char scratch[8];
    tdm_buf_t file = {0};
    router_apikeys_t *t;
    tdm_status_t status;

    if (defaults == NULL || keys_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (err == NULL || err_bytes == 0) {
        err = scratch;
        err_bytes = sizeof(scratch);
    }
    err[0] = '\0';
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return TDM_ERR_NO_MEMORY;
    }
    if (path != NULL && path[0] != '\0') {
        status = tdm_buf_read_file(&file, path);
        if (status != TDM_OK) {
            snprintf(err, err_bytes, "cannot read the API key file %s: %s", path,
                     tdm_status_message(status));
            goto err_free;
        }
        status = add_text(t, file.data != NULL ? file.data : "", 0, defaults, "key file", err,
                          err_bytes);
        if (status != TDM_OK) {
            goto err_free;
        }
    }
    if (text != NULL) {
        status = add_text(t, text, 1, defaults, "--api-keys", err, err_bytes);
        if (status != TDM_OK) {
            goto err_free;
        }
    }
    if (file.data != NULL) {
        OPENSSL_cleanse(file.data, file.n_bytes);
    }
    tdm_buf_fini(&file);
    *keys_out = t;
    return TDM_OK;

err_free:
    if (file.data != NULL) {
        OPENSSL_cleanse(file.data, file.n_bytes);
    }
    tdm_buf_fini(&file);
    router_apikeys_destroy(t);
    return status;
}

void router_apikeys_destroy(router_apikeys_t *keys)
{
    if (keys == NULL) {
        return;
    }
    if (keys->keys != NULL) {
        OPENSSL_cleanse(keys->keys, keys->cap_keys * sizeof(*keys->keys));
    }
    free(keys->keys);
    pthread_mutex_destroy(&keys->lock);
    free(keys);
}

size_t router_apikeys_count(const router_apikeys_t *keys)
{
    return keys != NULL ? keys->n_keys : 0;
}

uint32_t router_apikeys_authenticate(router_apikeys_t *keys, const char *authorization)
{
    unsigned char digest[DIGEST_BYTES];
    const char *key;
    size_t n;
    uint32_t tenant = 0;

    if (keys == NULL || keys->n_keys == 0) {
        return 0;
    }
    if (authorization != NULL && strncasecmp(authorization, "Bearer ", 7) == 0) {
        key = authorization + 7;
        while (*key == ' ') {
            key++;
        }
        n = strlen(key);
        while (n > 0 && key[n - 1] == ' ') {
            n--;
        }
        if (n >= ROUTER_APIKEY_MIN_BYTES && n <= ROUTER_APIKEY_MAX_BYTES &&
            digest_of(key, n, digest)) {
            /* Every entry is compared, whatever matched before. */
            for (size_t i = 0; i < keys->n_keys; i++) {
                uint32_t equal = CRYPTO_memcmp(keys->keys[i].digest, digest, DIGEST_BYTES) == 0;
                tenant |= (uint32_t)(i + 1) & (0u - equal);
            }
            OPENSSL_cleanse(digest, sizeof(digest));
        }
    }
    if (tenant == 0) {
        pthread_mutex_lock(&keys->lock);
        keys->n_auth_failures++;
        pthread_mutex_unlock(&keys->lock);
    }
    return tenant;
}

router_apikey_verdict_t router_apikeys_acquire(router_apikeys_t *keys, uint32_t tenant,
                                               uint64_t now_ns, uint32_t *retry_after_s_out)
{
    router_apikey_verdict_t verdict = ROUTER_APIKEY_ADMITTED;
    apikey_t *k;

    if (keys == NULL || tenant == 0 || tenant > keys->n_keys) {
        return ROUTER_APIKEY_ADMITTED;
    }
    k = &keys->keys[tenant - 1];
    pthread_mutex_lock(&keys->lock);
    if (k->limits.rpm > 0) {
        double rate_per_ns = (double)k->limits.rpm / (double)NS_PER_MIN;
        if (k->t_refill_ns != 0 && now_ns > k->t_refill_ns) {
            k->tokens += (double)(now_ns - k->t_refill_ns) * rate_per_ns;
            if (k->tokens > (double)k->limits.rpm) {
                k->tokens = (double)k->limits.rpm;
            }
        }
        k->t_refill_ns = now_ns > k->t_refill_ns ? now_ns : k->t_refill_ns;
        if (k->tokens < 1.0) {
            double wait_s = (1.0 - k->tokens) / rate_per_ns / 1e9;
            *retry_after_s_out = (uint32_t)wait_s + 1;
            k->n_rate++;
            verdict = ROUTER_APIKEY_RATE_LIMITED;
        }
    }
    if (verdict == ROUTER_APIKEY_ADMITTED && k->limits.max_concurrency > 0 &&
        k->inflight >= k->limits.max_concurrency) {
        *retry_after_s_out = 1;
        k->n_concurrency++;
        verdict = ROUTER_APIKEY_CONCURRENCY_CAP;
    }
    if (verdict == ROUTER_APIKEY_ADMITTED) {
        if (k->limits.rpm > 0) {
            k->tokens -= 1.0;
        }
        k->inflight++;
        k->n_requests++;
    }
    pthread_mutex_unlock(&keys->lock);
    return verdict;
}

void router_apikeys_release(router_apikeys_t *keys, uint32_t tenant)
{
    if (keys == NULL || tenant == 0 || tenant > keys->n_keys) {
        return;
    }
    pthread_mutex_lock(&keys->lock);
    if (keys->keys[tenant - 1].inflight > 0) {
        keys->keys[tenant - 1].inflight--;
    }
    pthread_mutex_unlock(&keys->lock);
}

const char *router_apikeys_name(const router_apikeys_t *keys, uint32_t tenant)
{
    if (keys == NULL || tenant == 0 || tenant > keys->n_keys) {
        return "";
    }
    return keys->keys[tenant - 1].name;
}

tdm_status_t router_apikeys_render(router_apikeys_t *keys, char **text_out, size_t *n_out)
{
    tdm_prom_t *p;
    tdm_status_t status;

    status = tdm_prom_create(&p);
    if (status != TDM_OK) {
        return status;
    }
    pthread_mutex_lock(&keys->lock);
    tdm_prom_counter(p, "tandem_router_api_auth_failures_total",
                     "requests refused with 401: no API key, or a key that is not configured",
                     keys->n_auth_failures);
    if (keys->n_keys > 0) {
        tdm_prom_family(p, "tandem_router_api_key_requests_total", TDM_PROM_COUNTER,
                        "requests admitted, by API key name");
        for (size_t i = 0; i < keys->n_keys; i++) {
            tdm_prom_label_t l = {"key", keys->keys[i].name};
            tdm_prom_sample_u64(p, &l, 1, keys->keys[i].n_requests);
        }
        tdm_prom_family(p, "tandem_router_api_key_refused_total", TDM_PROM_COUNTER,
                        "requests refused with 429, by API key name and limit");
        for (size_t i = 0; i < keys->n_keys; i++) {
            tdm_prom_label_t rate[2] = {{"key", keys->keys[i].name}, {"reason", "rate"}};
            tdm_prom_label_t conc[2] = {{"key", keys->keys[i].name}, {"reason", "concurrency"}};
            tdm_prom_sample_u64(p, rate, 2, keys->keys[i].n_rate);
            tdm_prom_sample_u64(p, conc, 2, keys->keys[i].n_concurrency);
        }
        tdm_prom_family(p, "tandem_router_api_key_inflight", TDM_PROM_GAUGE,
                        "requests in flight, by API key name");
        for (size_t i = 0; i < keys->n_keys; i++) {
            tdm_prom_label_t l = {"key", keys->keys[i].name};
            tdm_prom_sample_u64(p, &l, 1, keys->keys[i].inflight);
        }
    }
    pthread_mutex_unlock(&keys->lock);
    return tdm_prom_finish(p, text_out, n_out);
}
