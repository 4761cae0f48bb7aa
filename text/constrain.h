/* constrain.h - the byte-level language of a constrained completion: JSON text that satisfies a
 * JSON-schema subset (OpenAI response_format json_object / json_schema), as an automaton that
 * accepts or rejects one byte at a time.
 *
 * Owns the schema compiler (response_format JSON -> an immutable text_constraint_t) and the
 * automaton's step function over a plain, copyable text_constraint_state_t. Knows nothing of
 * tokens, vocabularies or sampling: engine/constrain.h turns this byte automaton into a token
 * mask. The router links this module to refuse unsupported schemas with a 400 before any work.
 *
 * Language (docs/PROTOCOL.md, "Constrained decoding"):
 *   - RFC 8259 JSON text; strings are valid UTF-8 (no overlong forms, no surrogates, nothing
 *     past U+10FFFF), escapes \" \\ \/ \b \f \n \r \t \uXXXX, where \u0000 and \uD800-\uDFFF
 *     are refused (strict parsers reject lone surrogates and NUL).
 *   - Whitespace (space, \n, \r, \t) is allowed where RFC 8259 allows it, at most
 *     TEXT_CONSTRAINT_MAX_WS bytes in a row, but not before the top-level value nor after it:
 *     the text ends with the value.
 *   - Objects with declared "properties": keys are those names, each at most once, in any
 *     order; "}" only once every "required" name is present; no other key is ever generated
 *     (which satisfies any additionalProperties). Objects without declared properties
 *     (json_object, {"type":"object"}) take any keys, with values of the additionalProperties
 *     schema when it is one (else any value), or no key at all when it is false (only {}).
 *   - enum / const: the value is written exactly as the compact JSON of one of the listed
 *     values (jansson's JSON_COMPACT form, keys in the order given).
 *   - anyOf: any alternative; alternatives sharing a prefix are followed in parallel (at most
 *     TEXT_CONSTRAINT_MAX_THREADS at once; when more would be needed the later ones are dropped,
 *     which keeps every output valid).
 *   - Nesting is at most TEXT_CONSTRAINT_MAX_DEPTH containers deep.
 * Supported schema keywords: type (string or array of "object", "array", "string", "number",
 * "integer", "boolean", "null"), properties, required, additionalProperties (true, false or a
 * schema), enum, const, items (one schema), anyOf; annotations title, description, default,
 * examples, $comment, $schema are ignored. Any other keyword is refused naming it.
 *
 * Tool calls (text_constraint_compile_tool_calls; OpenAI tool_choice "required" or a named
 * function): the completion is one DeepSeek-V4 DSML block, byte for byte as DeepSeek's
 * encoding_dsv4.py renders an assistant's tool calls, and nothing after it:
 *     [reasoning</think>]\n\n<｜DSML｜tool_calls>\n INVOKE (\n INVOKE)* \n</｜DSML｜tool_calls>
 *     INVOKE = <｜DSML｜invoke name="NAME">\n PARAM (\n PARAM)* \n</｜DSML｜invoke>
 *              (no PARAM: <｜DSML｜invoke name="NAME">\n\n</｜DSML｜invoke>)
 *     PARAM  = <｜DSML｜parameter name="KEY" string="true">RAW</｜DSML｜parameter>
 *            | <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
 * (with the reasoning part when thinking is on: free UTF-8 text up to the first "</think>").
 * NAME is one of the allowed tools (several invokes only when parallel calls are allowed); KEY
 * one of that tool's parameters ("properties" of its parameters schema), each at most once, the
 * "required" ones all present before </｜DSML｜invoke>. string="true" (the encoder's form of a
 * string value) is allowed when the parameter's schema admits a string: RAW is then any UTF-8
 * text without the closing tag, or exactly one of the string values of its enum / const;
 * string="false" when it admits anything else: JSON is then a value of the parameter's schema
 * (the JSON language above, with no whitespace before or after the value).
 *
 * Thread-safe: a compiled constraint is read-only; states are plain values owned by callers.
 */
#ifndef TANDEM_TEXT_CONSTRAIN_H
#define TANDEM_TEXT_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Containers open at once (the frame stack of one automaton thread). */
#define TEXT_CONSTRAINT_MAX_DEPTH 16
/* anyOf alternatives followed in parallel. */
#define TEXT_CONSTRAINT_MAX_THREADS 4
/* Longest run of insignificant whitespace, bytes. */
#define TEXT_CONSTRAINT_MAX_WS 16
/* Most declared properties of one object, values of one enum, alternatives of one anyOf. */
#define TEXT_CONSTRAINT_MAX_PROPERTIES 64
#define TEXT_CONSTRAINT_MAX_ENUM       64
#define TEXT_CONSTRAINT_MAX_ANYOF      8
/* Most tools of one tool-call constraint. */
#define TEXT_CONSTRAINT_MAX_TOOLS 64
/* Most schema nodes of one constraint, and the deepest schema nesting. */
#define TEXT_CONSTRAINT_MAX_NODES        4096
#define TEXT_CONSTRAINT_MAX_SCHEMA_DEPTH 32

/* A compiled constraint; opaque, immutable after compile. */
typedef struct text_constraint text_constraint_t;

/* One frame of an automaton thread (internal layout; treat as opaque). */
typedef struct {
    uint64_t bits; /* candidate literals, or the object's seen properties */
    uint32_t pos;  /* byte offset in a literal, the chosen property, \u value */
    uint16_t node; /* schema node */
    uint8_t kind;
    uint8_t phase;
    uint8_t aux; /* UTF-8 continuation bytes pending / number sub-state / hex digits */
    uint8_t ws;  /* whitespace bytes in the current run */
    uint8_t lo;  /* bounds of the next UTF-8 continuation byte */
    uint8_t hi;
} text_constraint_frame_t;

/* One automaton thread: a stack of frames. */
typedef struct {
    uint32_t depth;
    text_constraint_frame_t f[TEXT_CONSTRAINT_MAX_DEPTH];
} text_constraint_thread_t;

/*
 * The automaton's state after some bytes (plain data: copy it with text_constraint_state_copy,
 * which copies only the live part). n_threads == 0 means dead (no continuation exists; never
 * the result of a step that returned 1).
 */
typedef struct {
    uint32_t n_threads;
    text_constraint_thread_t t[TEXT_CONSTRAINT_MAX_THREADS];
} text_constraint_state_t;

/*
 * text_constraint_compile - compile an OpenAI response_format object (`json`, n_json bytes of
 * JSON text, borrowed): {"type":"json_object"} or {"type":"json_schema","json_schema":
 * {"name":..., "schema":{...}, "strict":bool, "description":...}}.
 *
 * Returns TDM_OK and *out (text_constraint_destroy frees it); TDM_ERR_INVALID_ARG with err
 * (err_bytes, may be 0) "<path>: <reason>", the path naming the field or keyword, e.g.
 * "response_format.json_schema.schema.properties.age.minimum: unsupported keyword"; a
 * response_format of type "text" is also TDM_ERR_INVALID_ARG (no constraint: the caller
 * treats it as absent). TDM_ERR_NO_MEMORY. Does not log.
 */
tdm_status_t text_constraint_compile(const char *json, size_t n_json, text_constraint_t **out,
                                     char *err, size_t err_bytes);

/*
 * text_constraint_compile_schema - compile a bare JSON schema (`json`, n_json bytes) as
 * json_schema's "schema" would be. `path` prefixes error paths (e.g. "tools[0].parameters").
 * Returns and errors as text_constraint_compile.
 */
tdm_status_t text_constraint_compile_schema(const char *json, size_t n_json, const char *path,
                                            text_constraint_t **out, char *err, size_t err_bytes);

/*
 * text_constraint_compile_tool_calls - compile the tool-call language (header comment) from
 * `json` (n_json bytes): {"thinking": bool, "parallel": bool, "tools": [{"name": "...",
 * "parameters": {JSON schema of an object, or absent}}, ...]} (1 to TEXT_CONSTRAINT_MAX_TOOLS
 * tools; the router builds it from the request's tools and tool_choice).
 * Parameter schemas take the keywords of the JSON language plus those that only narrow a value of
 * a type already fixed (minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf,
 * minLength, maxLength, pattern, format, minItems, maxItems, uniqueItems, minProperties,
 * maxProperties): agents' tool schemas carry them, and they are NOT enforced (the call is
 * well-formed, with the declared names, types, enums and required parameters). Any other keyword
 * is refused as in text_constraint_compile.
 * Returns and errors as text_constraint_compile; error paths are "tools[i].parameters...", and
 * a tool or parameter name holding '"' (which the markup cannot carry) is refused.
 */
tdm_status_t text_constraint_compile_tool_calls(const char *json, size_t n_json,
                                                text_constraint_t **out, char *err,
                                                size_t err_bytes);

/* text_constraint_destroy - free a compiled constraint; accepts NULL. */
void text_constraint_destroy(text_constraint_t *c);

/* text_constraint_start - *state_out = the state before the first byte. */
void text_constraint_start(const text_constraint_t *c, text_constraint_state_t *state_out);

/* text_constraint_state_copy - *dst = *src (only the live frames are copied). */
void text_constraint_state_copy(text_constraint_state_t *dst, const text_constraint_state_t *src);

/*
 * text_constraint_step - feed one byte. Returns 1 and advances *state when some continuation of
 * the text so far plus `byte` is in the language; returns 0 otherwise (*state then undefined:
 * step a copy when the old state is still needed). Pure given c; thread-safe.
 */
int text_constraint_step(const text_constraint_t *c, text_constraint_state_t *state, uint8_t byte);

/*
 * text_constraint_step_bytes - feed n bytes in order; 1 if all were accepted, else 0 (state
 * undefined).
 */
int text_constraint_step_bytes(const text_constraint_t *c, text_constraint_state_t *state,
                               const uint8_t *bytes, size_t n);

/* text_constraint_accepting - nonzero when the bytes so far are a complete text of the
 * language (the completion may end here). */
int text_constraint_accepting(const text_constraint_t *c, const text_constraint_state_t *state);

/* Where a state stands for the mask's precomputed sets (text_constraint_free_kind). */
typedef enum {
    TEXT_CONSTRAINT_FREE_NONE = 0,
    /* inside a JSON string with no enum or const on it, between characters (no escape or UTF-8
     * sequence open), on one thread: text_constraint_string_class tells what any such state does
     * with a byte string that does not leave the string */
    TEXT_CONSTRAINT_FREE_STRING = 1,
    /* inside raw text (tool-call reasoning or a string="true" parameter) between characters and
     * with no byte of its closing delimiter matched, on one thread: every byte string
     * text_constraint_is_plain_raw_bytes accepts is accepted and leaves the state as it was */
    TEXT_CONSTRAINT_FREE_RAW = 2,
} text_constraint_free_t;

/* text_constraint_free_kind - which precomputed set, if any, applies from this state. */
text_constraint_free_t text_constraint_free_kind(const text_constraint_state_t *state);

/*
 * text_constraint_is_plain_string_bytes - nonzero when the n bytes are all printable ASCII
 * other than '"' and '\\', or complete valid UTF-8 sequences (n >= 1): the bytes a free string
 * accepts without change of state (text_constraint_in_free_string).
 */
int text_constraint_is_plain_string_bytes(const uint8_t *bytes, size_t n);

/* What a free state (text_constraint_free_kind) does with a token, whatever surrounds it. */
typedef enum {
    TEXT_CONSTRAINT_ACCEPTED = 0, /* every such state accepts the bytes */
    TEXT_CONSTRAINT_REFUSED = 1,  /* every such state refuses them */
    TEXT_CONSTRAINT_DEPENDS = 2,  /* the bytes leave the string: the rest decides */
} text_constraint_class_t;

/*
 * text_constraint_string_class - the n bytes fed to a TEXT_CONSTRAINT_FREE_STRING state: refused
 * inside the string (a control byte, a bad escape or UTF-8 sequence before any closing quote),
 * accepted without leaving it (no closing quote; the state may then be inside an escape or a
 * character), or leaving it through a closing quote (then the rest of the constraint decides).
 * n = 0: REFUSED. Pure; thread-safe.
 */
text_constraint_class_t text_constraint_string_class(const uint8_t *bytes, size_t n);

/*
 * text_constraint_is_plain_raw_bytes - nonzero when the n bytes (n >= 1) are complete valid
 * UTF-8 characters, none of them NUL or '<' (every raw-text delimiter starts with '<' and has no
 * other '<'): the bytes raw text accepts without change of state (TEXT_CONSTRAINT_FREE_RAW).
 */
int text_constraint_is_plain_raw_bytes(const uint8_t *bytes, size_t n);

#endif
