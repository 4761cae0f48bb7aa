/* constrain_compile.c - response_format / JSON schema subset -> the nodes of a
 * text_constraint_t (see text/constrain.h for the keywords and the language). */
#include "text/constrain_impl.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest error path kept while walking the schema. */
#define PATH_BYTES 256

typedef struct {
    text_constraint_t *c;
    char *err;
    size_t err_bytes;
    tdm_status_t status; /* first failure */
    int lenient;         /* tool parameters: value-narrowing keywords are not enforced */
} compiler_t;

static tdm_status_t fail(compiler_t *cc, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tdm_status_t fail(compiler_t *cc, const char *path, const char *fmt, ...)
{
    char reason[192];
    va_list args;

    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    if (cc->err != NULL && cc->err_bytes > 0) {
        snprintf(cc->err, cc->err_bytes, "%s: %s", path, reason);
    }
    cc->status = TDM_ERR_INVALID_ARG;
    return TDM_ERR_INVALID_ARG;
}

static tdm_status_t oom(compiler_t *cc)
{
    if (cc->err != NULL && cc->err_bytes > 0) {
        snprintf(cc->err, cc->err_bytes, "out of memory compiling the schema");
    }
    cc->status = TDM_ERR_NO_MEMORY;
    return TDM_ERR_NO_MEMORY;
}

/* Grow an array to hold `need` elements (doubling). */
static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    uint32_t n = *cap == 0 ? 16 : *cap;
    void *p;

    if (need <= *cap) {
        return 1;
    }
    while (n < need) {
        n *= 2;
    }
    p = realloc(*arr, (size_t)n * elem);
    if (p == NULL) {
        return 0;
    }
    *arr = p;
    *cap = n;
    return 1;
}

/* Append bytes to the pool; *span_out names them. */
static tdm_status_t pool_add(compiler_t *cc, const void *bytes, size_t n, cspan_t *span_out)
{
    text_constraint_t *c = cc->c;

    if (n > UINT32_MAX / 2 ||
        !grow((void **)&c->pool, &c->cap_pool, c->n_pool + (uint32_t)n + 1, 1)) {
        return oom(cc);
    }
    memcpy(c->pool + c->n_pool, bytes, n);
    span_out->off = c->n_pool;
    span_out->len = (uint32_t)n;
    c->n_pool += (uint32_t)n;
    return TDM_OK;
}

/* A literal: the compact JSON of `value` into lits[]. */
static tdm_status_t lit_add(compiler_t *cc, const json_t *value)
{
    text_constraint_t *c = cc->c;
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    tdm_status_t st;

    if (text == NULL) {
        return oom(cc);
    }
    if (!grow((void **)&c->lits, &c->cap_lits, c->n_lits + 1, sizeof(cspan_t))) {
        free(text);
        return oom(cc);
    }
    st = pool_add(cc, text, strlen(text), &c->lits[c->n_lits]);
    free(text);
    if (st == TDM_OK) {
        c->n_lits++;
    }
    return st;
}

static tdm_status_t word_add(compiler_t *cc, const char *word)
{
    text_constraint_t *c = cc->c;

    if (!grow((void **)&c->lits, &c->cap_lits, c->n_lits + 1, sizeof(cspan_t))) {
        return oom(cc);
    }
    if (pool_add(cc, word, strlen(word), &c->lits[c->n_lits]) != TDM_OK) {
        return cc->status;
    }
    c->n_lits++;
    return TDM_OK;
}

static tdm_status_t node_new(compiler_t *cc, const char *path, uint32_t *index_out)
{
    text_constraint_t *c = cc->c;

    if (c->n_nodes >= TEXT_CONSTRAINT_MAX_NODES) {
        return fail(cc, path, "schema has more than %d nodes", TEXT_CONSTRAINT_MAX_NODES);
    }
    if (!grow((void **)&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof(cnode_t))) {
        return oom(cc);
    }
    memset(&c->nodes[c->n_nodes], 0, sizeof(cnode_t));
    *index_out = c->n_nodes++;
    return TDM_OK;
}

/* The bool/null words of node n (types decide). */
static tdm_status_t node_words(compiler_t *cc, uint32_t n)
{
    uint32_t off = cc->c->n_lits;
    uint32_t types = cc->c->nodes[n].types;
    tdm_status_t st = TDM_OK;

    if ((types & CT_BOOLEAN) != 0) {
        st = word_add(cc, "true");
        if (st == TDM_OK) {
            st = word_add(cc, "false");
        }
    }
    if (st == TDM_OK && (types & CT_NULL) != 0) {
        st = word_add(cc, "null");
    }
    cc->c->nodes[n].words_off = off;
    cc->c->nodes[n].n_words = cc->c->n_lits - off;
    return st;
}

static const struct {
    const char *name;
    uint32_t bit;
} type_names[] = {
    {"object", CT_OBJECT},   {"array", CT_ARRAY},     {"string", CT_STRING}, {"number", CT_NUMBER},
    {"integer", CT_INTEGER}, {"boolean", CT_BOOLEAN}, {"null", CT_NULL},
};

static tdm_status_t type_bit(compiler_t *cc, const char *path, const json_t *v, uint32_t *bit_out)
{
    if (!json_is_string(v)) {
        return fail(cc, path, "a type must be a string");
    }
    for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++) {
        if (strcmp(json_string_value(v), type_names[i].name) == 0) {
            *bit_out = type_names[i].bit;
            return TDM_OK;
        }
    }
    return fail(cc, path, "unsupported type \"%s\"", json_string_value(v));
}

static tdm_status_t parse_types(compiler_t *cc, const char *path, const json_t *v,
                                uint32_t *types_out)
{
    uint32_t types = 0;
    uint32_t bit = 0;
    size_t i;
    json_t *e;

    if (json_is_array(v)) {
        if (json_array_size(v) == 0) {
            return fail(cc, path, "empty type array");
        }
        json_array_foreach(v, i, e)
        {
            if (type_bit(cc, path, e, &bit) != TDM_OK) {
                return cc->status;
            }
            types |= bit;
        }
    } else if (type_bit(cc, path, v, &bit) != TDM_OK) {
        return cc->status;
    } else {
        types = bit;
    }
    /* "number" admits every integer: the automaton then needs no second thread */
    if ((types & CT_NUMBER) != 0) {
        types &= ~(uint32_t)CT_INTEGER;
    }
    *types_out = types;
    return TDM_OK;
}

/* JSON-escape `name` as a key is written after its opening quote, closing quote included. */
static tdm_status_t key_span(compiler_t *cc, const char *name, cspan_t *span_out)
{
    json_t *s = json_string(name);
    char *text;
    size_t n;
    tdm_status_t st;

    if (s == NULL) {
        return oom(cc);
    }
    text = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(s);
    if (text == NULL) {
        return oom(cc);
    }
    n = strlen(text); /* "name" with quotes: keep from after the first quote */
    st = pool_add(cc, text + 1, n - 1, span_out);
    free(text);
    return st;
}

static const char *const ignored_keywords[] = {"title",    "description", "default",
                                               "examples", "$comment",    "$schema"};
static const char *const known_keywords[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "anyOf"};

/* Keywords that only narrow the values of a type the constraint already fixes: a tool's parameters
 * (text_constraint_compile_tool_calls) may carry them, and they are not enforced there. */
static const char *const narrowing_keywords[] = {
    "minimum",   "maximum",     "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength",   "pattern",          "format",           "minItems",
    "maxItems",  "uniqueItems", "minProperties",    "maxProperties"};

static int in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(key, list[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static tdm_status_t compile_node(compiler_t *cc, const json_t *schema, const char *path, int depth,
                                 uint32_t *node_out);

static tdm_status_t compile_object(compiler_t *cc, const json_t *schema, const char *path,
                                   int depth, uint32_t n)
{
    text_constraint_t *c = cc->c;
    const json_t *props = json_object_get(schema, "properties");
    const json_t *required = json_object_get(schema, "required");
    const json_t *additional = json_object_get(schema, "additionalProperties");
    char sub[PATH_BYTES];
    const char *key;
    json_t *value;
    uint32_t n_props = props == NULL ? 0 : (uint32_t)json_object_size(props);
    uint32_t off;
    uint32_t i = 0;
    size_t k;

    if (props != NULL && !json_is_object(props)) {
        snprintf(sub, sizeof(sub), "%s.properties", path);
        return fail(cc, sub, "must be an object");
    }
    c->nodes[n].additional = CNODE_ANY;
    if (additional != NULL && !json_is_boolean(additional)) {
        uint32_t child;

        snprintf(sub, sizeof(sub), "%s.additionalProperties", path);
        if (compile_node(cc, additional, sub, depth + 1, &child) != TDM_OK) {
            return cc->status;
        }
        c->nodes[n].additional = child;
    }
    if (n_props > TEXT_CONSTRAINT_MAX_PROPERTIES) {
        snprintf(sub, sizeof(sub), "%s.properties", path);
        return fail(cc, sub, "more than %d properties", TEXT_CONSTRAINT_MAX_PROPERTIES);
    }
    if (!grow((void **)&c->props, &c->cap_props, c->n_props + n_props, sizeof(cprop_t))) {
        return oom(cc);
    }
    off = c->n_props;
    c->n_props += n_props; /* reserved now: children append their own after */
    if (props != NULL) {
        json_object_foreach((json_t *)props, key, value)
        {
            uint32_t child;

            snprintf(sub, sizeof(sub), "%s.properties.%s", path, key);
            if (key_span(cc, key, &c->props[off + i].key) != TDM_OK) {
                return cc->status;
            }
            if (compile_node(cc, value, sub, depth + 1, &child) != TDM_OK) {
                return cc->status;
            }
            c->props[off + i].node = child;
            i++;
        }
    }
    c->nodes[n].n_props = n_props;
    c->nodes[n].props_off = off;
    c->nodes[n].generic_closed = n_props == 0 && additional != NULL && json_is_false(additional);
    if (required != NULL) {
        snprintf(sub, sizeof(sub), "%s.required", path);
        if (!json_is_array(required)) {
            return fail(cc, sub, "must be an array of property names");
        }
        json_array_foreach(required, k, value)
        {
            uint32_t j = 0;
            const char *name = json_string_value(value);

            if (name == NULL) {
                return fail(cc, sub, "must be an array of property names");
            }
            if (props != NULL) {
                const char *pk;
                json_t *pv;

                json_object_foreach((json_t *)props, pk, pv)
                {
                    (void)pv;
                    if (strcmp(pk, name) == 0) {
                        break;
                    }
                    j++;
                }
            }
            if (j >= n_props) {
                return fail(cc, sub, "\"%s\" is not a declared property", name);
            }
            c->nodes[n].required |= (uint64_t)1 << j;
        }
    }
    return TDM_OK;
}

static tdm_status_t compile_node(compiler_t *cc, const json_t *schema, const char *path, int depth,
                                 uint32_t *node_out)
{
    text_constraint_t *c = cc->c;
    char sub[PATH_BYTES];
    const char *key;
    json_t *value;
    const json_t *v;
    uint32_t n;
    uint32_t types = CT_ANY;

    if (depth > TEXT_CONSTRAINT_MAX_SCHEMA_DEPTH) {
        return fail(cc, path, "schema nested deeper than %d", TEXT_CONSTRAINT_MAX_SCHEMA_DEPTH);
    }
    if (json_is_true(schema)) {
        *node_out = CNODE_ANY;
        return TDM_OK;
    }
    if (!json_is_object(schema)) {
        return fail(cc, path, "a schema must be an object");
    }
    json_object_foreach((json_t *)schema, key, value)
    {
        (void)value;
        if (cc->lenient && in_list(key, narrowing_keywords,
                                   sizeof(narrowing_keywords) / sizeof(narrowing_keywords[0]))) {
            continue;
        }
        if (!in_list(key, known_keywords, sizeof(known_keywords) / sizeof(known_keywords[0])) &&
            !in_list(key, ignored_keywords,
                     sizeof(ignored_keywords) / sizeof(ignored_keywords[0]))) {
            snprintf(sub, sizeof(sub), "%s.%s", path, key);
            return fail(cc, sub, "unsupported keyword");
        }
    }
    v = json_object_get(schema, "type");
    if (v != NULL) {
        snprintf(sub, sizeof(sub), "%s.type", path);
        if (parse_types(cc, sub, v, &types) != TDM_OK) {
            return cc->status;
        }
    } else if (json_object_get(schema, "properties") != NULL) {
        types = CT_OBJECT;
    } else if (json_object_get(schema, "items") != NULL) {
        types = CT_ARRAY;
    }
    if (node_new(cc, path, &n) != TDM_OK) {
        return cc->status;
    }
    c->nodes[n].types = types;
    c->nodes[n].items = CNODE_ANY;

    v = json_object_get(schema, "anyOf");
    if (v != NULL) {
        size_t i;
        json_t *e;
        uint32_t off;
        uint32_t n_alts = (uint32_t)json_array_size(v);

        snprintf(sub, sizeof(sub), "%s.anyOf", path);
        if (!json_is_array(v) || n_alts == 0 || n_alts > TEXT_CONSTRAINT_MAX_ANYOF) {
            return fail(cc, sub, "must be an array of 1 to %d schemas", TEXT_CONSTRAINT_MAX_ANYOF);
        }
        if (json_object_size(schema) > 1 &&
            (json_object_get(schema, "type") != NULL || json_object_get(schema, "enum") != NULL ||
             json_object_get(schema, "const") != NULL)) {
            return fail(cc, sub, "anyOf beside type, enum or const is not supported");
        }
        if (!grow((void **)&c->alts, &c->cap_alts, c->n_alts + n_alts, sizeof(uint32_t))) {
            return oom(cc);
        }
        off = c->n_alts;
        c->n_alts += n_alts;
        json_array_foreach(v, i, e)
        {
            uint32_t child;
            char alt[PATH_BYTES];

            snprintf(alt, sizeof(alt), "%s.anyOf[%zu]", path, i);
            if (compile_node(cc, e, alt, depth + 1, &child) != TDM_OK) {
                return cc->status;
            }
            c->alts[off + i] = child;
        }
        c->nodes[n].alts_off = off;
        c->nodes[n].n_alts = n_alts;
        *node_out = n;
        return TDM_OK;
    }

    v = json_object_get(schema, "enum");
    if (v != NULL || json_object_get(schema, "const") != NULL) {
        uint32_t off = c->n_lits;
        size_t i;
        json_t *e;

        if (v != NULL && json_object_get(schema, "const") != NULL) {
            snprintf(sub, sizeof(sub), "%s.const", path);
            return fail(cc, sub, "enum and const together are not supported");
        }
        if (v != NULL) {
            snprintf(sub, sizeof(sub), "%s.enum", path);
            if (!json_is_array(v) || json_array_size(v) == 0 ||
                json_array_size(v) > TEXT_CONSTRAINT_MAX_ENUM) {
                return fail(cc, sub, "must be an array of 1 to %d values",
                            TEXT_CONSTRAINT_MAX_ENUM);
            }
            json_array_foreach(v, i, e)
            {
                if (lit_add(cc, e) != TDM_OK) {
                    return cc->status;
                }
            }
        } else if (lit_add(cc, json_object_get(schema, "const")) != TDM_OK) {
            return cc->status;
        }
        c->nodes[n].enum_off = off;
        c->nodes[n].n_enum = c->n_lits - off;
        *node_out = n;
        return TDM_OK;
    }

    if ((types & CT_OBJECT) != 0 || json_object_get(schema, "properties") != NULL ||
        json_object_get(schema, "required") != NULL ||
        json_object_get(schema, "additionalProperties") != NULL) {
        if (compile_object(cc, schema, path, depth, n) != TDM_OK) {
            return cc->status;
        }
    }
    v = json_object_get(schema, "items");
    if (v != NULL) {
        uint32_t child;

        snprintf(sub, sizeof(sub), "%s.items", path);
        if (json_is_array(v)) {
            return fail(cc, sub, "tuple items (an array of schemas) are not supported");
        }
        if (compile_node(cc, v, sub, depth + 1, &child) != TDM_OK) {
            return cc->status;
        }
        c->nodes[n].items = child;
    }
    if (node_words(cc, n) != TDM_OK) {
        return cc->status;
    }
    *node_out = n;
    return TDM_OK;
}

/* A fresh constraint holding node 0 = any value. */
static tdm_status_t constraint_new(compiler_t *cc, const char *path)
{
    uint32_t any = CNODE_ANY;

    cc->c = calloc(1, sizeof(*cc->c));
    if (cc->c == NULL) {
        return oom(cc);
    }
    if (node_new(cc, path, &any) != TDM_OK) {
        return cc->status;
    }
    cc->c->nodes[any].types = CT_ANY;
    cc->c->nodes[any].items = CNODE_ANY;
    return node_words(cc, any);
}

static tdm_status_t finish(compiler_t *cc, tdm_status_t st, text_constraint_t **out)
{
    if (st != TDM_OK) {
        text_constraint_destroy(cc->c);
        return st;
    }
    *out = cc->c;
    return TDM_OK;
}

static tdm_status_t compile_schema_json(compiler_t *cc, const json_t *schema, const char *path)
{
    tdm_status_t st = constraint_new(cc, path);

    if (st == TDM_OK) {
        st = compile_node(cc, schema, path, 0, &cc->c->root);
    }
    return st;
}

tdm_status_t text_constraint_compile_schema(const char *json, size_t n_json, const char *path,
                                            text_constraint_t **out, char *err, size_t err_bytes)
{
    compiler_t cc = {NULL, err, err_bytes, TDM_OK, 0};
    json_error_t jerr;
    json_t *root;
    tdm_status_t st;

    if (json == NULL || out == NULL) {
        return fail(&cc, "schema", "null argument");
    }
    root = json_loadb(json, n_json, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        return fail(&cc, path, "invalid JSON: %s", jerr.text);
    }
    st = compile_schema_json(&cc, root, path);
    json_decref(root);
    return finish(&cc, st, out);
}

tdm_status_t text_constraint_compile(const char *json, size_t n_json, text_constraint_t **out,
                                     char *err, size_t err_bytes)
{
    compiler_t cc = {NULL, err, err_bytes, TDM_OK, 0};
    json_error_t jerr;
    json_t *root;
    const json_t *type;
    const char *kind;
    tdm_status_t st = TDM_OK;

    if (json == NULL || out == NULL) {
        return fail(&cc, "response_format", "null argument");
    }
    root = json_loadb(json, n_json, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        return fail(&cc, "response_format", "invalid JSON: %s", jerr.text);
    }
    type = json_object_get(root, "type");
    kind = json_string_value(type);
    if (!json_is_object(root) || kind == NULL) {
        st = fail(&cc, "response_format.type",
                  "must be \"text\", \"json_object\" or \"json_schema\"");
    } else if (strcmp(kind, "json_object") == 0) {
        st = constraint_new(&cc, "response_format");
        if (st == TDM_OK) {
            uint32_t n;

            st = node_new(&cc, "response_format", &n);
            if (st == TDM_OK) {
                cc.c->nodes[n].types = CT_OBJECT;
                cc.c->root = n;
            }
        }
    } else if (strcmp(kind, "json_schema") == 0) {
        const json_t *js = json_object_get(root, "json_schema");
        const json_t *schema = json_object_get(js, "schema");
        const char *key;
        json_t *value;

        if (!json_is_object(js)) {
            st = fail(&cc, "response_format.json_schema", "missing or not an object");
        } else {
            json_object_foreach((json_t *)js, key, value)
            {
                if (strcmp(key, "name") != 0 && strcmp(key, "schema") != 0 &&
                    strcmp(key, "strict") != 0 && strcmp(key, "description") != 0) {
                    char sub[PATH_BYTES];

                    snprintf(sub, sizeof(sub), "response_format.json_schema.%s", key);
                    st = fail(&cc, sub, "unsupported field");
                    break;
                }
                if (strcmp(key, "strict") == 0 && !json_is_boolean(value) && !json_is_null(value)) {
                    st = fail(&cc, "response_format.json_schema.strict", "must be a boolean");
                    break;
                }
            }
            if (st == TDM_OK) {
                /* OpenAI: a json_schema without "schema" means any JSON object would do */
                if (schema == NULL) {
                    json_t *obj = json_pack("{s:s}", "type", "object");

                    st = obj == NULL
                             ? oom(&cc)
                             : compile_schema_json(&cc, obj, "response_format.json_schema.schema");
                    json_decref(obj);
                } else {
                    st = compile_schema_json(&cc, schema, "response_format.json_schema.schema");
                }
            }
        }
    } else if (strcmp(kind, "text") == 0) {
        st = fail(&cc, "response_format.type", "\"text\" is no constraint");
    } else {
        st = fail(&cc, "response_format.type", "unsupported type \"%s\"", kind);
    }
    json_decref(root);
    return finish(&cc, st, out);
}

/* ---- the tool-call language ----------------------------------------------------------------- */

/* clang-format off */
#define DSML_PARAM_CLOSE "</" TEXT_TOKENIZER_DSML "parameter>"
/* clang-format on */

/* A new list whose strings are appended next (lists are built one at a time). */
static tdm_status_t list_begin(compiler_t *cc, uint32_t *id_out)
{
    text_constraint_t *c = cc->c;

    if (!grow((void **)&c->clists, &c->cap_clists, c->n_clists + 1, sizeof(clist_t))) {
        return oom(cc);
    }
    c->clists[c->n_clists].off = c->n_lits;
    c->clists[c->n_clists].n = 0;
    *id_out = c->n_clists++;
    return TDM_OK;
}

/* Append a + b (b may be NULL) to list `id` (the list being built). */
static tdm_status_t list_add(compiler_t *cc, uint32_t id, const char *a, size_t n_a, const char *b)
{
    text_constraint_t *c = cc->c;
    size_t n_b = b == NULL ? 0 : strlen(b);
    char *joined = malloc(n_a + n_b + 1);
    tdm_status_t st;

    if (joined == NULL || !grow((void **)&c->lits, &c->cap_lits, c->n_lits + 1, sizeof(cspan_t))) {
        free(joined);
        return oom(cc);
    }
    memcpy(joined, a, n_a);
    if (n_b > 0) {
        memcpy(joined + n_a, b, n_b);
    }
    st = pool_add(cc, joined, n_a + n_b, &c->lits[c->n_lits]);
    free(joined);
    if (st == TDM_OK) {
        c->n_lits++;
        c->clists[id].n++;
    }
    return st;
}

/* A list of fixed strings (NULL-terminated). */
static tdm_status_t list_fixed(compiler_t *cc, const char *const *strs, uint32_t *id_out)
{
    tdm_status_t st = list_begin(cc, id_out);

    for (size_t i = 0; st == TDM_OK && strs[i] != NULL; i++) {
        st = list_add(cc, *id_out, strs[i], strlen(strs[i]), NULL);
    }
    return st;
}

/* Does node n (or an anyOf alternative of it) take any string / anything but a string? */
static void node_forms(const text_constraint_t *c, uint32_t n, int *str_out, int *other_out)
{
    const cnode_t *nd = &c->nodes[n];

    if (nd->n_alts > 0) {
        for (uint32_t i = 0; i < nd->n_alts; i++) {
            int s = 0;
            int o = 0;

            node_forms(c, c->alts[nd->alts_off + i], &s, &o);
            *str_out |= s && c->nodes[c->alts[nd->alts_off + i]].n_enum == 0;
            *other_out |= o || s; /* a JSON string is a JSON value too */
        }
        return;
    }
    if (nd->n_enum > 0) {
        for (uint32_t i = 0; i < nd->n_enum; i++) {
            const cspan_t *l = &c->lits[nd->enum_off + i];

            if (c->pool[l->off] == '"') {
                *str_out = 1;
            } else {
                *other_out = 1;
            }
        }
        return;
    }
    *str_out |= (nd->types & CT_STRING) != 0;
    *other_out |= (nd->types & ~(uint32_t)CT_STRING) != 0;
}

/* The raw values of a string enum / const: each decoded string + the parameter's closing tag. */
static tdm_status_t raw_enum_list(compiler_t *cc, uint32_t n, const char *path, uint32_t *id_out)
{
    const cnode_t nd = cc->c->nodes[n];
    tdm_status_t st = list_begin(cc, id_out);

    for (uint32_t i = 0; st == TDM_OK && i < nd.n_enum; i++) {
        const cspan_t l = cc->c->lits[nd.enum_off + i];
        json_t *v = json_loadb((const char *)cc->c->pool + l.off, l.len, JSON_DECODE_ANY, NULL);

        if (json_is_string(v)) {
            const char *raw = json_string_value(v);

            if (strstr(raw, DSML_PARAM_CLOSE) != NULL) {
                st = fail(cc, path, "an enum string holds the parameter's closing tag");
            } else {
                st = list_add(cc, *id_out, raw, json_string_length(v), DSML_PARAM_CLOSE);
            }
        }
        json_decref(v);
    }
    return st;
}

/* One tool: {"name": ..., "parameters": schema}. */
static tdm_status_t compile_tool(compiler_t *cc, const json_t *tool, size_t index, ctool_t *out)
{
    text_constraint_t *c = cc->c;
    cdsml_t *d = &c->dsml;
    const json_t *params = json_object_get(tool, "parameters");
    const json_t *props;
    char path[PATH_BYTES];
    uint32_t node = CNODE_ANY;
    const cnode_t *nd;
    const char *key;
    json_t *value;
    uint32_t i = 0;

    cparam_t *grown;

    snprintf(path, sizeof(path), "tools[%zu].parameters", index);
    memset(out, 0, sizeof(*out));
    if (params != NULL && !json_is_null(params)) {
        if (compile_node(cc, params, path, 0, &node) != TDM_OK) {
            return cc->status;
        }
    }
    nd = &c->nodes[node];
    if (node != CNODE_ANY && ((nd->types & CT_OBJECT) == 0 || nd->n_alts > 0 || nd->n_enum > 0)) {
        return fail(cc, path, "must be an object schema");
    }
    out->n_params = node == CNODE_ANY ? 0 : nd->n_props;
    out->required = node == CNODE_ANY ? 0 : nd->required;
    out->params_off = d->n_params;
    grown = realloc(d->params, (d->n_params + out->n_params + 1) * sizeof(cparam_t));
    if (grown == NULL) {
        return oom(cc);
    }
    d->params = grown;
    d->n_params += out->n_params;
    if (list_begin(cc, &out->keys_list) != TDM_OK) {
        return cc->status;
    }
    props = json_object_get(params, "properties");
    json_object_foreach((json_t *)props, key, value)
    {
        (void)value;
        if (strchr(key, '"') != NULL) {
            snprintf(path, sizeof(path), "tools[%zu].parameters.properties", index);
            return fail(cc, path, "a parameter name holds '\"'");
        }
        if (list_add(cc, out->keys_list, key, strlen(key), "\" string=\"") != TDM_OK) {
            return cc->status;
        }
    }
    for (i = 0; i < out->n_params; i++) {
        cparam_t *p = &d->params[out->params_off + i];
        uint32_t pn = c->props[c->nodes[node].props_off + i].node;
        int str = 0;
        int other = 0;

        node_forms(c, pn, &str, &other);
        p->node = pn;
        p->raw_list = CLIST_NONE;
        p->raw_ok = str;
        p->json_ok = other;
        if (c->nodes[pn].n_enum > 0 && str) {
            snprintf(path, sizeof(path), "tools[%zu].parameters.properties", index);
            if (raw_enum_list(cc, pn, path, &p->raw_list) != TDM_OK) {
                return cc->status;
            }
        }
    }
    return TDM_OK;
}

tdm_status_t text_constraint_compile_tool_calls(const char *json, size_t n_json,
                                                text_constraint_t **out, char *err,
                                                size_t err_bytes)
{
    /* clang-format off */
    static const char *const think[] = {"</think>", NULL};
    static const char *const prefix[] = {
        "\n\n<" TEXT_TOKENIZER_DSML "tool_calls>\n<" TEXT_TOKENIZER_DSML
        "invoke name=\"",
        NULL};
    static const char *const after_header[] = {
        "<" TEXT_TOKENIZER_DSML "parameter name=\"",
        "\n</" TEXT_TOKENIZER_DSML "invoke>", NULL};
    static const char *const str[] = {"true\">", "false\">", NULL};
    static const char *const pclose[] = {DSML_PARAM_CLOSE, NULL};
    static const char *const after_param[] = {
        "\n<" TEXT_TOKENIZER_DSML "parameter name=\"",
        "\n</" TEXT_TOKENIZER_DSML "invoke>", NULL};
    static const char *const after_invoke[] = {
        "\n<" TEXT_TOKENIZER_DSML "invoke name=\"",
        "\n</" TEXT_TOKENIZER_DSML "tool_calls>", NULL};
    /* clang-format on */
    compiler_t cc = {NULL, err, err_bytes, TDM_OK, 1};
    json_error_t jerr;
    json_t *root;
    const json_t *tools;
    json_t *tool;
    size_t i;
    cdsml_t *d;
    tdm_status_t st;

    if (json == NULL || out == NULL) {
        return fail(&cc, "tools", "null argument");
    }
    root = json_loadb(json, n_json, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        return fail(&cc, "tools", "invalid JSON: %s", jerr.text);
    }
    tools = json_object_get(root, "tools");
    st = constraint_new(&cc, "tools");
    if (st == TDM_OK && (!json_is_array(tools) || json_array_size(tools) == 0 ||
                         json_array_size(tools) > TEXT_CONSTRAINT_MAX_TOOLS)) {
        st = fail(&cc, "tools", "must be an array of 1 to %d tools", TEXT_CONSTRAINT_MAX_TOOLS);
    }
    if (st == TDM_OK) {
        d = &cc.c->dsml;
        d->on = 1;
        d->thinking = json_is_true(json_object_get(root, "thinking"));
        d->parallel = json_is_true(json_object_get(root, "parallel"));
        d->tools = calloc(json_array_size(tools), sizeof(ctool_t));
        st = d->tools == NULL ? oom(&cc) : TDM_OK;
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, think, &cc.c->dsml.l_think);
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, prefix, &cc.c->dsml.l_prefix);
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, after_header, &cc.c->dsml.l_after_header);
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, str, &cc.c->dsml.l_str);
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, pclose, &cc.c->dsml.l_pclose);
        cc.c->dsml.l_param_delim = cc.c->dsml.l_pclose;
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, after_param, &cc.c->dsml.l_after_param);
    }
    if (st == TDM_OK) {
        st = list_fixed(&cc, after_invoke, &cc.c->dsml.l_after_invoke);
    }
    /* the names list is built across the tools: its strings must stay contiguous, so each
     * tool's own lists (keys, raw enums) are made after all names */
    if (st == TDM_OK) {
        st = list_begin(&cc, &cc.c->dsml.l_names);
    }
    json_array_foreach(tools, i, tool)
    {
        const char *name = json_string_value(json_object_get(tool, "name"));
        char path[PATH_BYTES];

        if (st != TDM_OK) {
            break;
        }
        snprintf(path, sizeof(path), "tools[%zu].name", i);
        if (name == NULL || name[0] == '\0' || strchr(name, '"') != NULL) {
            st = fail(&cc, path, "must be a non-empty string without '\"'");
            break;
        }
        st = list_add(&cc, cc.c->dsml.l_names, name, strlen(name), "\">\n");
    }
    json_array_foreach(tools, i, tool)
    {
        if (st != TDM_OK) {
            break;
        }
        st = compile_tool(&cc, tool, i, &cc.c->dsml.tools[i]);
        cc.c->dsml.n_tools = (uint32_t)i + 1;
    }
    json_decref(root);
    return finish(&cc, st, out);
}

void text_constraint_destroy(text_constraint_t *c)
{
    if (c == NULL) {
        return;
    }
    free(c->dsml.tools);
    free(c->dsml.params);
    free(c->clists);
    free(c->nodes);
    free(c->props);
    free(c->lits);
    free(c->alts);
    free(c->pool);
    free(c);
}
