/* constrain_impl.h - what text/constrain_compile.c (schema -> nodes) and text/constrain.c (the
 * byte automaton) share. Not a public header: other modules use text/constrain.h. */
#ifndef TANDEM_TEXT_CONSTRAIN_IMPL_H
#define TANDEM_TEXT_CONSTRAIN_IMPL_H

#include "text/constrain.h"

/* JSON types a node admits (bits of cnode_t.types). */
enum {
    CT_OBJECT = 1u << 0,
    CT_ARRAY = 1u << 1,
    CT_STRING = 1u << 2,
    CT_NUMBER = 1u << 3,  /* any JSON number */
    CT_INTEGER = 1u << 4, /* a number without fraction or exponent */
    CT_BOOLEAN = 1u << 5,
    CT_NULL = 1u << 6,
    CT_ANY = 0x7f,
};

/* Node 0 is "any JSON value" (generic objects' values, arrays without items). */
#define CNODE_ANY 0

/* A byte string in the constraint's pool. */
typedef struct {
    uint32_t off;
    uint32_t len;
} cspan_t;

/* A declared property: its key bytes as written after the opening quote (the JSON-escaped name
 * then the closing '"'), and the node of its value. */
typedef struct {
    cspan_t key;
    uint32_t node;
} cprop_t;

/* One schema node. Lists are ranges of the constraint's arrays. */
typedef struct {
    uint32_t types;      /* CT_* bits */
    uint32_t items;      /* array: node of the items */
    uint32_t n_props;    /* object: declared properties (0: generic object) */
    uint32_t props_off;  /* into props[] */
    uint64_t required;   /* bit i: props[props_off + i] is required */
    int generic_closed;  /* object without properties and additionalProperties false: only {} */
    uint32_t n_enum;     /* enum/const values (0: none); the value is one of these literals */
    uint32_t enum_off;   /* into lits[] */
    uint32_t n_words;    /* "true", "false", "null" as the types allow */
    uint32_t words_off;  /* into lits[] */
    uint32_t n_alts;     /* anyOf alternatives (0: none) */
    uint32_t alts_off;   /* into alts[] */
} cnode_t;

struct text_constraint {
    cnode_t *nodes;
    uint32_t n_nodes, cap_nodes;
    cprop_t *props;
    uint32_t n_props, cap_props;
    cspan_t *lits;
    uint32_t n_lits, cap_lits;
    uint32_t *alts;
    uint32_t n_alts, cap_alts;
    uint8_t *pool;
    uint32_t n_pool, cap_pool;
    uint32_t root;
};

#endif
