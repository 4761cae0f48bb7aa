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

/* Frame kinds. A VALUE frame turns into the value's own kind on its first byte. K_DSML, K_CHOICE
 * and K_RAW are the tool-call language's (constrain_dsml.c). */
enum {
    K_VALUE,
    K_OBJECT,
    K_KEY,
    K_ARRAY,
    K_STRING,
    K_NUMBER,
    K_ENUM,
    K_WORD,
    K_DSML,
    K_CHOICE,
    K_RAW
};

/* Object phases: what the object expects next (set before a child frame is pushed). */
enum { OB_FIRST, OB_COMMA, OB_COLON, OB_AFTER_VALUE };
/* Array phases. */
enum { AR_FIRST, AR_COMMA, AR_AFTER_VALUE };
/* String phases. */
enum { ST_BODY, ST_ESCAPE, ST_HEX };
/* Number sub-states (aux); N_ZERO, N_INT, N_FRAC and N_EXP_DIGITS are complete. */
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_E_SIGN, N_EXP_DIGITS };

/* What one frame did with a byte. */
typedef enum {
    R_REJECT = 0,
    R_TAKEN = 1,  /* consumed */
    R_REFEED = 2, /* frame popped (value complete) without consuming: feed the parent */
    R_REDO = 3,   /* frame changed kind without consuming: feed the same depth again */
} res_t;

/* No list (a parameter without raw string values). */
#define CLIST_NONE UINT32_MAX

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
    uint32_t additional; /* object without properties: node of every value (CNODE_ANY, or the
                            additionalProperties schema) */
    uint32_t n_enum;     /* enum/const values (0: none); the value is one of these literals */
    uint32_t enum_off;   /* into lits[] */
    uint32_t n_words;    /* "true", "false", "null" as the types allow */
    uint32_t words_off;  /* into lits[] */
    uint32_t n_alts;     /* anyOf alternatives (0: none) */
    uint32_t alts_off;   /* into alts[] */
} cnode_t;

/* A list of byte strings: lits[off .. off + n). */
typedef struct {
    uint32_t off;
    uint32_t n;
} clist_t;

/* A tool parameter of the DSML language: its JSON schema node (string="false" values), the raw
 * values allowed with string="true" (a list of raw strings each followed by the parameter's
 * closing tag; CLIST_NONE: any raw text), and which of the two forms the schema admits. */
typedef struct {
    uint32_t node;
    uint32_t raw_list;
    int raw_ok;
    int json_ok;
} cparam_t;

/* A tool: its parameters params[off .. off + n), keys list (name + "\" string=\""), required
 * parameters (bits). */
typedef struct {
    uint32_t params_off;
    uint32_t n_params;
    uint32_t keys_list;
    uint64_t required;
} ctool_t;

/* The tool-call language (a DSML <｜DSML｜tool_calls> block; constrain_dsml.c). */
typedef struct {
    int on;         /* the constraint is a tool-call block (not a JSON value) */
    int thinking;   /* free reasoning up to </think> first */
    int parallel;   /* more than one invoke allowed */
    ctool_t *tools; /* [n_tools] */
    uint32_t n_tools;
    cparam_t *params; /* all tools' parameters */
    uint32_t n_params;
    /* lists (clists[] ids) */
    uint32_t l_think, l_prefix, l_names, l_after_header, l_str, l_pclose, l_after_param;
    uint32_t l_after_invoke, l_param_delim;
} cdsml_t;

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
    clist_t *clists;
    uint32_t n_clists, cap_clists;
    cdsml_t dsml;
    uint32_t root;
};

/* ---- shared by constrain.c and constrain_dsml.c ------------------------------------------- */

/* Zero a frame and set its kind and node. */
void constraint_frame_init(text_constraint_frame_t *f, uint8_t kind, uint32_t node);

/* Push a frame onto a thread; 0 when the nesting limit is reached. */
int constraint_push(text_constraint_thread_t *t, uint8_t kind, uint32_t node);

/* The UTF-8 lead byte b: continuation bytes to come and the range of the first one (RFC 3629
 * table 2); 0 continuation bytes for ASCII; -1 for a byte no character starts with. */
int constraint_utf8_lead(uint8_t b, uint8_t *lo_out, uint8_t *hi_out);

/* constrain_dsml.c: one byte on a K_DSML, K_CHOICE or K_RAW top frame; the first frames of a
 * tool-call constraint (into an empty thread); 1 when the raw frame is between characters with
 * no delimiter byte matched (its free state). */
res_t constraint_dsml_step(const text_constraint_t *c, text_constraint_thread_t *t, uint8_t b);
int constraint_dsml_start(const text_constraint_t *c, text_constraint_thread_t *t);
int constraint_raw_is_free(const text_constraint_frame_t *f);

#endif
