/* synth.c - the deterministic synthetic tokenizer.json of random test checkpoints.
 *
 * Layout (docs/TOKENIZER.md): BOS/EOS/PAD at 0/1/2 (the model config fixes them), the 256 byte
 * tokens at 3..258, merged tokens, the chat/tool/FIM/task special tokens, then the image token at
 * vocab-2 and the DSpark noise token at vocab-1 (MODEL.md section 9). Merges: first the most
 * frequent adjacent pairs of an embedded code-like ASCII corpus (greedy BPE training, ties by
 * byte order), then every 2- and 3-character string over tab, newline and printable ASCII in
 * byte order. The JSON is written by hand, so its bytes depend on nothing but vocab_size.
 */
#include "text/tokenizer.h"

#include "common/buf.h"
#include "common/errbuf.h"
#include "common/hash.h"
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Added tokens before the two reserved ids at the top, in id order (vocab-26 .. vocab-3). The
 * DSML token came last and sits first, so the older ones kept their ids. */
static const struct {
    const char *text;
    int special;
} chat_tokens[] = {
    {TEXT_TOKENIZER_DSML, 1},
    {TEXT_TOKENIZER_DS_USER, 1},
    {TEXT_TOKENIZER_DS_ASSISTANT, 1},
    {TEXT_TOKENIZER_DS_THINK, 0},
    {TEXT_TOKENIZER_DS_END_THINK, 0},
    {"<\uff5ctool\u2581calls\u2581begin\uff5c>", 1},
    {"<\uff5ctool\u2581calls\u2581end\uff5c>", 1},
    {"<\uff5ctool\u2581call\u2581begin\uff5c>", 1},
    {"<\uff5ctool\u2581call\u2581end\uff5c>", 1},
    {"<\uff5ctool\u2581sep\uff5c>", 1},
    {"<\uff5ctool\u2581outputs\u2581begin\uff5c>", 1},
    {"<\uff5ctool\u2581outputs\u2581end\uff5c>", 1},
    {TEXT_TOKENIZER_DS_TOOL_OUTPUT_BEGIN, 1},
    {TEXT_TOKENIZER_DS_TOOL_OUTPUT_END, 1},
    {"<\uff5cfim\u2581hole\uff5c>", 1},
    {"<\uff5cfim\u2581begin\uff5c>", 1},
    {"<\uff5cfim\u2581end\uff5c>", 1},
    {"<\uff5clatest_reminder\uff5c>", 1},
    {"<\uff5caction\uff5c>", 1},
    {"<\uff5cquery\uff5c>", 1},
    {"<\uff5cauthority\uff5c>", 1},
    {"<\uff5cdomain\uff5c>", 1},
    {"<\uff5ctitle\uff5c>", 1},
    {"<\uff5cread_url\uff5c>", 1},
};
#define N_CHAT_TOKENS  (sizeof(chat_tokens) / sizeof(chat_tokens[0]))
#define SYNTH_IMAGE    "<\uff5cimage\uff5c>"
#define SYNTH_NOISE    "<\uff5cdspark\u2581noise\uff5c>"
#define N_LOW_SPECIALS 3u
#define N_TOP_SPECIALS 2u
#define FIRST_BYTE_ID  N_LOW_SPECIALS

/* DeepSeek-V3's tokenizer.json pre-tokenizer: three Isolated splits, then ByteLevel. */
static const char *const split_patterns[] = {
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./"
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

/* The training corpus: original code-like text in the styles an agent reads and writes. */
static const char corpus[] =
    "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n"
    "static int count_lines(const char *path, size_t *count_out)\n{\n"
    "    FILE *file = fopen(path, \"r\");\n    size_t count = 0;\n    int c;\n\n"
    "    if (file == NULL) {\n        return -1;\n    }\n"
    "    while ((c = fgetc(file)) != EOF) {\n        if (c == '\\n') {\n            count++;\n"
    "        }\n    }\n    fclose(file);\n    *count_out = count;\n    return 0;\n}\n\n"
    "int main(int argc, char **argv)\n{\n    for (int i = 1; i < argc; i++) {\n"
    "        size_t count = 0;\n        if (count_lines(argv[i], &count) != 0) {\n"
    "            fprintf(stderr, \"cannot read %s\\n\", argv[i]);\n            return 1;\n"
    "        }\n        printf(\"%zu %s\\n\", count, argv[i]);\n    }\n    return 0;\n}\n\n"
    "def parse_config(path):\n    \"\"\"Read a key=value file into a dict.\"\"\"\n"
    "    config = {}\n    with open(path) as handle:\n        for line in handle:\n"
    "            line = line.strip()\n            if not line or line.startswith(\"#\"):\n"
    "                continue\n            key, _, value = line.partition(\"=\")\n"
    "            config[key.strip()] = value.strip()\n    return config\n\n\n"
    "class Request:\n    def __init__(self, method, url, headers=None):\n"
    "        self.method = method\n        self.url = url\n"
    "        self.headers = headers or {}\n\n    def header(self, name, default=None):\n"
    "        return self.headers.get(name.lower(), default)\n\n\n"
    "if __name__ == \"__main__\":\n    import sys\n    print(parse_config(sys.argv[1]))\n\n"
    "{\n  \"name\": \"service\",\n  \"version\": \"1.2.0\",\n  \"port\": 8080,\n"
    "  \"workers\": 4,\n  \"routes\": [\"/health\", \"/metrics\", \"/v1/chat/completions\"],\n"
    "  \"enabled\": true\n}\n\n"
    "$ git status\nOn branch main\nChanges not staged for commit:\n"
    "  modified:   src/server.c\n  modified:   tests/test_server.c\n\n"
    "$ make test\ncc -O2 -Wall -Wextra -c src/server.c -o build/server.o\n"
    "ok 1 - server starts and listens\nok 2 - request with a bad header is rejected\n"
    "not ok 3 - timeout is reported\n\n"
    "fn checksum(data: &[u8]) -> u32 {\n    let mut sum: u32 = 0;\n"
    "    for byte in data.iter() {\n        sum = sum.wrapping_mul(31).wrapping_add(*byte as "
    "u32);\n"
    "    }\n    sum\n}\n\n"
    "function retry(fn, attempts) {\n  for (let i = 0; i < attempts; i++) {\n"
    "    try {\n      return fn();\n    } catch (error) {\n"
    "      console.log(`attempt ${i + 1} failed: ${error.message}`);\n    }\n  }\n"
    "  throw new Error(\"all attempts failed\");\n}\n\n"
    "SELECT name, count(*) AS total FROM requests WHERE status >= 500 GROUP BY name "
    "ORDER BY total DESC LIMIT 10;\n\n"
    "The function returns the number of lines in the file. If the file cannot be opened, "
    "it returns an error and the caller prints a message. Tests check the return value, "
    "the output and the error path.\n";

/* Token table of the generator: raw bytes pooled, with a hash set for existence checks. */
typedef struct {
    uint8_t *pool;
    size_t n_pool, cap_pool;
    uint32_t *offset; /* [n + 1] */
    uint32_t n, cap;
    int32_t *set; /* open addressing: token index or -1 */
    uint32_t set_mask;
} table_t;

/* Merges as (left, right) indices into the table. */
typedef struct {
    uint32_t *pairs;
    uint32_t n, cap;
} merge_list_t;

static int32_t table_find(const table_t *t, const uint8_t *bytes, size_t n, uint32_t *slot_out)
{
    uint32_t slot = (uint32_t)tdm_hash_xxh3_64(bytes, n) & t->set_mask;

    for (;;) {
        int32_t id = t->set[slot];
        if (id < 0 || (t->offset[id + 1] - t->offset[id] == n &&
                       memcmp(t->pool + t->offset[id], bytes, n) == 0)) {
            *slot_out = slot;
            return id;
        }
        slot = (slot + 1) & t->set_mask;
    }
}

static tdm_status_t table_add(table_t *t, const uint8_t *bytes, size_t n)
{
    uint32_t slot;

    if (t->n_pool + n > t->cap_pool) {
        size_t cap = t->cap_pool * 2 + n;
        uint8_t *pool = realloc(t->pool, cap);
        if (pool == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        t->pool = pool;
        t->cap_pool = cap;
    }
    (void)table_find(t, bytes, n, &slot);
    memcpy(t->pool + t->n_pool, bytes, n);
    t->n_pool += n;
    t->set[slot] = (int32_t)t->n;
    t->offset[++t->n] = (uint32_t)t->n_pool;
    return TDM_OK;
}

static tdm_status_t merge_add(merge_list_t *m, uint32_t left, uint32_t right)
{
    if (m->n == m->cap) {
        uint32_t cap = m->cap == 0 ? 1024 : m->cap * 2;
        uint32_t *pairs = realloc(m->pairs, (size_t)cap * 2 * sizeof(*pairs));
        if (pairs == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        m->pairs = pairs;
        m->cap = cap;
    }
    m->pairs[2 * m->n] = left;
    m->pairs[2 * m->n + 1] = right;
    m->n++;
    return TDM_OK;
}

/* Special texts made only of printable ASCII could equal a normal token's byte-level text. */
static int is_reserved(const uint8_t *bytes, size_t n)
{
    static const char *const reserved[] = {TEXT_TOKENIZER_DS_THINK, TEXT_TOKENIZER_DS_END_THINK};

    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
        if (strlen(reserved[i]) == n && memcmp(reserved[i], bytes, n) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Join tokens a and b: record the merge and, if the joined bytes are new, add the token
 * (*added_out = 1). *merged_out = the joined token's index. A join longer than 64 bytes or
 * spelling a reserved special text records nothing. */
static tdm_status_t join(table_t *t, merge_list_t *m, uint32_t a, uint32_t b, int *added_out,
                         int32_t *merged_out)
{
    size_t na = t->offset[a + 1] - t->offset[a], nb = t->offset[b + 1] - t->offset[b];
    uint8_t buf[64];
    uint32_t slot;
    int32_t found;
    tdm_status_t status;

    *added_out = 0;
    if (na + nb > sizeof(buf)) {
        return TDM_OK;
    }
    memcpy(buf, t->pool + t->offset[a], na);
    memcpy(buf + na, t->pool + t->offset[b], nb);
    if (is_reserved(buf, na + nb)) {
        return TDM_OK;
    }
    found = table_find(t, buf, na + nb, &slot);
    status = merge_add(m, a, b);
    if (status == TDM_OK && found < 0) {
        found = (int32_t)t->n;
        status = table_add(t, buf, na + nb);
        *added_out = status == TDM_OK;
    }
    *merged_out = found;
    return status;
}

/* ---- phase 1: greedy BPE over the corpus ----------------------------------------------------- */

/* One distinct pre-token of the corpus as a symbol sequence, with its frequency. */
typedef struct {
    uint32_t *syms;
    uint32_t n;
    uint32_t freq;
} word_t;

static int compare_bytes(const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);

    return c != 0 ? c : (na < nb ? -1 : (na > nb ? 1 : 0));
}

/* Is pair (a1, b1) preferred over (a2, b2) on a count tie: smaller bytes first. */
static int pair_before(const table_t *t, uint32_t a1, uint32_t b1, uint32_t a2, uint32_t b2)
{
    int c = compare_bytes(t->pool + t->offset[a1], t->offset[a1 + 1] - t->offset[a1],
                          t->pool + t->offset[a2], t->offset[a2 + 1] - t->offset[a2]);
    if (c == 0) {
        c = compare_bytes(t->pool + t->offset[b1], t->offset[b1 + 1] - t->offset[b1],
                          t->pool + t->offset[b2], t->offset[b2 + 1] - t->offset[b2]);
    }
    return c < 0;
}

/* Pre-tokenize the corpus and collect its distinct words. */
static tdm_status_t corpus_words(word_t **words_out, uint32_t *n_out)
{
    text_tokenizer_pretok_t pretok;
    text_tokenizer_scratch_t scratch;
    word_t *words = NULL;
    uint32_t n_words = 0;
    tdm_status_t status = TDM_OK;

    memset(&pretok, 0, sizeof(pretok));
    for (size_t i = 0; i < sizeof(split_patterns) / sizeof(split_patterns[0]) && status == TDM_OK;
         i++) {
        status =
            text_tokenizer_pretok_add_split(&pretok, split_patterns[i], strlen(split_patterns[i]),
                                            0, TEXT_TOKENIZER_SPLIT_ISOLATED, 0, NULL, 0);
    }
    if (status == TDM_OK) {
        status = text_tokenizer_scratch_init(&scratch);
    }
    if (status != TDM_OK) {
        text_tokenizer_pretok_fini(&pretok);
        return status;
    }
    status =
        text_tokenizer_pretok_run(&pretok, (const uint8_t *)corpus, sizeof(corpus) - 1, &scratch);
    if (status == TDM_OK) {
        words = calloc(scratch.n_pieces > 0 ? scratch.n_pieces : 1, sizeof(*words));
        status = words == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    }
    for (size_t i = 0; status == TDM_OK && i < scratch.n_pieces; i++) {
        const uint8_t *p = scratch.work + scratch.pieces[i].offset;
        uint32_t n = (uint32_t)scratch.pieces[i].n_bytes, w;
        for (w = 0; w < n_words; w++) {
            if (words[w].n == n) {
                int same = 1;
                for (uint32_t k = 0; k < n && same; k++) {
                    same = words[w].syms[k] == p[k];
                }
                if (same) {
                    break;
                }
            }
        }
        if (w < n_words) {
            words[w].freq++;
            continue;
        }
        words[n_words].syms = malloc(n * sizeof(uint32_t));
        if (words[n_words].syms == NULL) {
            status = TDM_ERR_NO_MEMORY;
            break;
        }
        for (uint32_t k = 0; k < n; k++) {
            words[n_words].syms[k] = p[k]; /* table index of byte k is the byte value */
        }
        words[n_words].n = n;
        words[n_words].freq = 1;
        n_words++;
    }
    text_tokenizer_scratch_fini(&scratch);
    text_tokenizer_pretok_fini(&pretok);
    if (status != TDM_OK) {
        for (uint32_t w = 0; words != NULL && w < n_words; w++) {
            free(words[w].syms);
        }
        free(words);
        return status;
    }
    *words_out = words;
    *n_out = n_words;
    return TDM_OK;
}

/* Pair counts of one training round: open addressing on (a << 32 | b). */
typedef struct {
    uint64_t *keys; /* UINT64_MAX: empty */
    uint32_t *counts;
    uint32_t mask;
} pair_counts_t;

static void count_pair(pair_counts_t *pc, uint32_t a, uint32_t b, uint32_t freq)
{
    uint64_t key = ((uint64_t)a << 32) | b;
    uint32_t slot = (uint32_t)tdm_hash_splitmix64(key) & pc->mask;

    while (pc->keys[slot] != UINT64_MAX && pc->keys[slot] != key) {
        slot = (slot + 1) & pc->mask;
    }
    pc->keys[slot] = key;
    pc->counts[slot] += freq;
}

/* Replace every non-overlapping (a, b) in the words by `merged`, left to right. */
static void apply_merge(word_t *words, uint32_t n_words, uint32_t a, uint32_t b, uint32_t merged)
{
    for (uint32_t w = 0; w < n_words; w++) {
        uint32_t out = 0;
        for (uint32_t k = 0; k < words[w].n; k++) {
            if (k + 1 < words[w].n && words[w].syms[k] == a && words[w].syms[k + 1] == b) {
                words[w].syms[out++] = merged;
                k++;
            } else {
                words[w].syms[out++] = words[w].syms[k];
            }
        }
        words[w].n = out;
    }
}

/* Merge the most frequent pair until `target` tokens exist or no pair occurs twice. */
static tdm_status_t train_corpus(table_t *t, merge_list_t *m, uint32_t target)
{
    word_t *words = NULL;
    uint32_t n_words = 0, n_syms = 0, cap = 1024;
    pair_counts_t pc = {0};
    tdm_status_t status = corpus_words(&words, &n_words);

    for (uint32_t w = 0; status == TDM_OK && w < n_words; w++) {
        n_syms += words[w].n;
    }
    while (cap < 2 * n_syms) {
        cap <<= 1;
    }
    if (status == TDM_OK) {
        pc.keys = malloc((size_t)cap * sizeof(*pc.keys));
        pc.counts = malloc((size_t)cap * sizeof(*pc.counts));
        pc.mask = cap - 1;
        status = pc.keys == NULL || pc.counts == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    }
    while (status == TDM_OK && t->n < target) {
        uint32_t best_a = 0, best_b = 0, best_count = 0, n_merges = m->n;
        int32_t merged;
        int added;
        memset(pc.keys, 0xff, (size_t)cap * sizeof(*pc.keys));
        memset(pc.counts, 0, (size_t)cap * sizeof(*pc.counts));
        for (uint32_t w = 0; w < n_words; w++) {
            for (uint32_t k = 0; k + 1 < words[w].n; k++) {
                count_pair(&pc, words[w].syms[k], words[w].syms[k + 1], words[w].freq);
            }
        }
        /* The best pair: highest count, then smallest bytes (a total order: independent of the
         * table's slot order). */
        for (uint32_t slot = 0; slot < cap; slot++) {
            uint32_t a = (uint32_t)(pc.keys[slot] >> 32), b = (uint32_t)pc.keys[slot];
            if (pc.keys[slot] == UINT64_MAX) {
                continue;
            }
            if (pc.counts[slot] > best_count ||
                (pc.counts[slot] == best_count && pair_before(t, a, b, best_a, best_b))) {
                best_a = a;
                best_b = b;
                best_count = pc.counts[slot];
            }
        }
        if (best_count < 2) {
            break;
        }
        status = join(t, m, best_a, best_b, &added, &merged);
        if (status != TDM_OK || m->n == n_merges) {
            break; /* refused (too long or reserved): training stops here */
        }
        apply_merge(words, n_words, best_a, best_b, (uint32_t)merged);
    }
    free(pc.keys);
    free(pc.counts);
    for (uint32_t w = 0; w < n_words; w++) {
        free(words[w].syms);
    }
    free(words);
    return status;
}

/* ---- phase 2: enumerated strings ------------------------------------------------------------- */

/* Tab, newline, then printable ASCII: 97 bytes in byte order. */
static uint8_t alphabet_byte(uint32_t i)
{
    return i == 0 ? '\t' : (i == 1 ? '\n' : (uint8_t)(0x20 + i - 2));
}
#define ALPHABET_SIZE 97u

static tdm_status_t enumerate(table_t *t, merge_list_t *m, uint32_t target)
{
    uint8_t buf[3];
    uint32_t slot;
    int32_t merged;
    int added;
    tdm_status_t status = TDM_OK;

    for (uint32_t i = 0; i < ALPHABET_SIZE && t->n < target && status == TDM_OK; i++) {
        for (uint32_t j = 0; j < ALPHABET_SIZE && t->n < target && status == TDM_OK; j++) {
            buf[0] = alphabet_byte(i);
            buf[1] = alphabet_byte(j);
            if (table_find(t, buf, 2, &slot) < 0) {
                status = join(t, m, buf[0], buf[1], &added, &merged);
            }
        }
    }
    for (uint32_t i = 0; i < ALPHABET_SIZE && t->n < target && status == TDM_OK; i++) {
        for (uint32_t j = 0; j < ALPHABET_SIZE && t->n < target && status == TDM_OK; j++) {
            buf[0] = alphabet_byte(i);
            buf[1] = alphabet_byte(j);
            int32_t left = table_find(t, buf, 2, &slot);
            for (uint32_t k = 0; k < ALPHABET_SIZE && t->n < target && status == TDM_OK; k++) {
                buf[2] = alphabet_byte(k);
                if (left >= 0 && table_find(t, buf, 3, &slot) < 0) {
                    status = join(t, m, (uint32_t)left, buf[2], &added, &merged);
                }
            }
        }
    }
    return status;
}

/* ---- JSON output ----------------------------------------------------------------------------- */

typedef struct {
    tdm_buf_t text;
    tdm_status_t status; /* the first failure; later puts do nothing */
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    if (o->status == TDM_OK && tdm_buf_append(&o->text, s, n) != TDM_OK) {
        o->status = TDM_ERR_NO_MEMORY;
    }
}

static void puts_(out_t *o, const char *s)
{
    put(o, s, strlen(s));
}

/* A JSON string of UTF-8 text: quotes, backslash and control bytes escaped. */
static void put_json_string(out_t *o, const char *s, size_t n)
{
    put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(o, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(o, esc, 6);
        } else {
            put(o, (const char *)&c, 1);
        }
    }
    put(o, "\"", 1);
}

/* Byte-level text of raw bytes (each byte as its GPT-2 code point). */
static void put_byte_level(out_t *o, const table_t *t, uint32_t index)
{
    char text[64 * 2];
    size_t n = 0;

    for (uint32_t i = t->offset[index]; i < t->offset[index + 1]; i++) {
        n += text_tokenizer_utf8_put(text_tokenizer_byte_to_cp(t->pool[i]), (uint8_t *)text + n);
    }
    put_json_string(o, text, n);
}

/* Text and special flag of added token id (vocab ids outside the merged range). */
static void added_token(uint32_t vocab_size, uint32_t id, const char **text_out, int *special_out)
{
    static const char *const low[N_LOW_SPECIALS] = {TEXT_TOKENIZER_DS_BOS, TEXT_TOKENIZER_DS_EOS,
                                                    TEXT_TOKENIZER_DS_PAD};
    uint32_t first_chat = vocab_size - N_TOP_SPECIALS - (uint32_t)N_CHAT_TOKENS;

    *special_out = 1;
    if (id < N_LOW_SPECIALS) {
        *text_out = low[id];
    } else if (id == vocab_size - 2) {
        *text_out = SYNTH_IMAGE;
    } else if (id == vocab_size - 1) {
        *text_out = SYNTH_NOISE;
    } else {
        *text_out = chat_tokens[id - first_chat].text;
        *special_out = chat_tokens[id - first_chat].special;
    }
}

static void write_json(out_t *o, uint32_t vocab_size, const table_t *t, const merge_list_t *m)
{
    uint32_t first_chat = vocab_size - N_TOP_SPECIALS - (uint32_t)N_CHAT_TOKENS;
    char line[160];
    int first = 1;

    puts_(o, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
             "  \"added_tokens\": [");
    for (uint32_t id = 0; id < vocab_size; id++) {
        const char *text;
        int special;
        if (id >= N_LOW_SPECIALS && id < first_chat) {
            continue;
        }
        added_token(vocab_size, id, &text, &special);
        snprintf(line, sizeof(line), "%s\n    {\"id\": %u, \"content\": ", first ? "" : ",", id);
        puts_(o, line);
        put_json_string(o, text, strlen(text));
        puts_(o, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                 "\"normalized\": false, \"special\": ");
        puts_(o, special ? "true}" : "false}");
        first = 0;
    }
    puts_(o, "\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\n"
             "    \"type\": \"Sequence\",\n    \"pretokenizers\": [");
    for (size_t i = 0; i < sizeof(split_patterns) / sizeof(split_patterns[0]); i++) {
        puts_(o, i == 0 ? "\n" : ",\n");
        puts_(o, "      {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
        put_json_string(o, split_patterns[i], strlen(split_patterns[i]));
        puts_(o, "}, \"behavior\": \"Isolated\", \"invert\": false}");
    }
    puts_(o, ",\n      {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
             "\"trim_offsets\": true, \"use_regex\": false}\n    ]\n  },\n"
             "  \"post_processor\": null,\n"
             "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
             "\"trim_offsets\": true, \"use_regex\": true},\n"
             "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
             "    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
             "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
             "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {");
    for (uint32_t id = 0; id < vocab_size; id++) {
        puts_(o, id == 0 ? "\n      " : ",\n      ");
        if (id >= N_LOW_SPECIALS && id < first_chat) {
            put_byte_level(o, t, id - N_LOW_SPECIALS);
        } else {
            const char *text;
            int special;
            added_token(vocab_size, id, &text, &special);
            put_json_string(o, text, strlen(text));
        }
        snprintf(line, sizeof(line), ": %u", id);
        puts_(o, line);
    }
    puts_(o, "\n    },\n    \"merges\": [");
    for (uint32_t i = 0; i < m->n; i++) {
        puts_(o, i == 0 ? "\n      [" : ",\n      [");
        put_byte_level(o, t, m->pairs[2 * i]);
        puts_(o, ", ");
        put_byte_level(o, t, m->pairs[2 * i + 1]);
        puts_(o, "]");
    }
    puts_(o, "\n    ]\n  }\n}\n");
}

tdm_status_t text_tokenizer_synthetic_hf_text(uint32_t vocab_size, char **json_out,
                                              size_t *n_bytes_out, char *err, size_t err_bytes)
{
    table_t t;
    merge_list_t m = {0};
    out_t o = {0};
    uint32_t n_normal, cap_set;
    tdm_status_t status = TDM_OK;

    if (json_out == NULL || n_bytes_out == NULL || vocab_size < TEXT_TOKENIZER_SYNTH_MIN_VOCAB ||
        vocab_size > TEXT_TOKENIZER_SYNTH_MAX_VOCAB) {
        tdm_errbuf_set(err, err_bytes, "synthetic vocab_size %u outside %u..%u", vocab_size,
                       TEXT_TOKENIZER_SYNTH_MIN_VOCAB, TEXT_TOKENIZER_SYNTH_MAX_VOCAB);
        return TDM_ERR_INVALID_ARG;
    }
    /* Normal tokens: the 256 bytes plus merged tokens fill the ids between the specials. */
    n_normal = vocab_size - N_LOW_SPECIALS - N_TOP_SPECIALS - (uint32_t)N_CHAT_TOKENS;
    memset(&t, 0, sizeof(t));
    cap_set = 1u << 10;
    while (cap_set < 2 * (n_normal + (uint32_t)N_CHAT_TOKENS)) {
        cap_set <<= 1;
    }
    t.offset = calloc((size_t)n_normal + N_CHAT_TOKENS + 1, sizeof(*t.offset));
    t.cap = n_normal + (uint32_t)N_CHAT_TOKENS;
    t.set = malloc((size_t)cap_set * sizeof(*t.set));
    t.set_mask = cap_set - 1;
    if (t.offset == NULL || t.set == NULL) {
        status = TDM_ERR_NO_MEMORY;
    } else {
        memset(t.set, 0xff, (size_t)cap_set * sizeof(*t.set));
    }
    for (uint32_t b = 0; b < 256 && status == TDM_OK; b++) {
        uint8_t byte = (uint8_t)b;
        status = table_add(&t, &byte, 1);
    }
    if (status == TDM_OK) {
        status = train_corpus(&t, &m, n_normal);
    }
    if (status == TDM_OK) {
        status = enumerate(&t, &m, n_normal);
    }
    if (status == TDM_OK && t.n != n_normal) {
        tdm_errbuf_set(err, err_bytes, "synthetic vocabulary ran out of merges at %u", t.n);
        status = TDM_ERR_INTERNAL;
    }
    if (status == TDM_OK) {
        write_json(&o, vocab_size, &t, &m);
        status = o.status;
    }
    free(t.pool);
    free(t.offset);
    free(t.set);
    free(m.pairs);
    if (status == TDM_OK) {
        size_t n_json = 0;
        char *json = tdm_buf_take(&o.text, &n_json);
        if (json == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            *json_out = json;
            *n_bytes_out = n_json;
        }
    }
    tdm_buf_fini(&o.text);
    return status;
}

tdm_status_t text_tokenizer_write_synthetic_hf(const char *path, uint32_t vocab_size, char *err,
                                               size_t err_bytes)
{
    char tmp[4096];
    char *json = NULL;
    size_t n = 0;
    FILE *f;
    tdm_status_t status;

    if (path == NULL || (size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) {
        tdm_errbuf_set(err, err_bytes, "path missing or too long");
        return TDM_ERR_INVALID_ARG;
    }
    status = text_tokenizer_synthetic_hf_text(vocab_size, &json, &n, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    f = fopen(tmp, "wb");
    if (f == NULL) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", tmp, strerror(errno));
        free(json);
        return TDM_ERR_IO;
    }
    if (fwrite(json, 1, n, f) != n) {
        tdm_errbuf_set(err, err_bytes, "%s: write: %s", tmp, strerror(errno));
        fclose(f);
        remove(tmp);
        free(json);
        return TDM_ERR_IO;
    }
    free(json);
    if (fclose(f) != 0) {
        tdm_errbuf_set(err, err_bytes, "%s: close: %s", tmp, strerror(errno));
        remove(tmp);
        return TDM_ERR_IO;
    }
    if (rename(tmp, path) != 0) {
        tdm_errbuf_set(err, err_bytes, "rename %s -> %s: %s", tmp, path, strerror(errno));
        remove(tmp);
        return TDM_ERR_IO;
    }
    return TDM_OK;
}
