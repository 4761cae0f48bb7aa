/* agentout.h - the model's agent output split into reasoning, content and tool calls, streamed.
 *
 * Reads the detokenized text of one DeepSeek-V4 completion in chunks of any size (a chunk may
 * end inside a UTF-8 character or inside a marker) and turns it into events: reasoning text (the
 * text before "</think>" in thinking mode), content text, and tool calls (begin with index, id and
 * name; fragments of the arguments JSON; end). The markup is DeepSeek-V4's DSML, as the release's
 * encoding/encoding_dsv4.py writes and parses it:
 *
 *   \n\n<｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="get_weather">
 *   <｜DSML｜parameter name="city" string="true">NYC</｜DSML｜parameter>
 *   <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * ("｜" is U+FF5C). DeepSeek-V4.1's encoder (the release's encoding/encoding.py) writes the same
 * markup with a space before each tag name: <｜DSML｜ calls>, <｜DSML｜ invoke name=...>,
 * <｜DSML｜ parameter ...>. Both dialects are recognised; a block's opener decides the tags of
 * its invokes and parameters. One invoke element is one call; its arguments are the JSON object
 * {"city": "NYC", "days": 3}: a string="true" value becomes a JSON string (escaped), a
 * string="false" value must itself be one JSON value and is inserted as written (trimmed). The
 * whitespace around the tags and the newlines that open the block belong to the markup.
 *
 * Rules (docs/PROTOCOL.md, "Agent output"):
 *   - Text is held back only while its end could still be the start of a marker (or an unfinished
 *     UTF-8 character); everything else is released in the same push.
 *   - A call is released whole when its closing </｜DSML｜invoke> arrives and it is well formed;
 *     the markup is never released as content. Markup that turns out not to be a call (an unknown
 *     tag, an invoke without name, a string="..." other than true/false, a string="false" value
 *     that is not JSON, a repeated parameter name) is released as content, byte for byte, from the
 *     point where the calls stopped being valid: nothing is lost.
 *   - At the end (text_agentout_finish) held text is released: an unfinished call (and the block
 *     opener when no call of the block was complete) becomes content, and unfinished is set.
 *   - Reasoning is only ended by "</think>" (no DSML is recognised inside it); text after a
 *     complete tool_calls block is content again (and may open another block).
 * Knows nothing of tokens, HTTP or the OpenAI JSON around the events. Not thread-safe per parser.
 */
#ifndef TANDEM_TEXT_AGENTOUT_H
#define TANDEM_TEXT_AGENTOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* What a parser recognises (text_agentout_create flags). */
typedef enum {
    TEXT_AGENT_THINKING = 1u << 0, /* the output starts inside reasoning, up to "</think>" */
    TEXT_AGENT_TOOLS = 1u << 1,    /* DSML tool_calls blocks in the content are calls */
} text_agent_flags_t;

/* The kinds of event. */
typedef enum {
    TEXT_AGENT_REASONING = 0,  /* text: reasoning bytes */
    TEXT_AGENT_CONTENT = 1,    /* text: content bytes */
    TEXT_AGENT_CALL_BEGIN = 2, /* index, id, text: the function name */
    TEXT_AGENT_CALL_ARGS = 3,  /* index, text: the next fragment of the arguments JSON text */
    TEXT_AGENT_CALL_END = 4,   /* index: the arguments are complete */
} text_agent_event_kind_t;

/* Longest tool call id, bytes including the NUL ("call_" + 24 hex digits). */
#define TEXT_AGENT_CALL_ID_BYTES 32
/* Longest function or parameter name accepted inside the markup, bytes. */
#define TEXT_AGENT_MAX_NAME_BYTES 256

/*
 * One event (plain data; text and id borrowed from the parser, valid until its next call).
 * Reasoning and content text are whole UTF-8 characters (except the final flush of a text that
 * ends inside one); consecutive text events of one kind in one call are merged.
 */
typedef struct {
    text_agent_event_kind_t kind;
    uint32_t index;   /* calls: 0, 1, ... in order of the whole output */
    const char *text; /* [n_text] bytes; the name for CALL_BEGIN; NULL when n_text is 0 */
    size_t n_text;
    const char *id; /* CALL_BEGIN: "call_" + 24 lowercase hex digits, NUL-terminated; else NULL */
} text_agent_event_t;

/* The parser; opaque. */
typedef struct text_agentout text_agentout_t;

/*
 * text_agentout_create - a parser for one output. flags: text_agent_flags_t bits (0: everything
 * is content). id_seed: call ids are "call_" + hex of SplitMix64 of (id_seed, call index), so
 * they are unique per output when id_seed is. Returns TDM_OK, TDM_ERR_INVALID_ARG (unknown flag
 * bits, NULL out) or TDM_ERR_NO_MEMORY; *parser_out written only on success.
 */
tdm_status_t text_agentout_create(uint32_t flags, uint64_t id_seed, text_agentout_t **parser_out);

/* text_agentout_destroy - free the parser. Accepts NULL. */
void text_agentout_destroy(text_agentout_t *parser);

/*
 * text_agentout_push - feed n_bytes of output text (borrowed; any split). *events_out /
 * *n_events_out: the events this push released, in order (borrowed, valid until the next call).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL bytes with n_bytes > 0, or after finish: nothing
 * changed) or TDM_ERR_NO_MEMORY (the parser is then unusable: destroy it).
 */
tdm_status_t text_agentout_push(text_agentout_t *parser, const char *bytes, size_t n_bytes,
                                const text_agent_event_t **events_out, size_t *n_events_out);

/*
 * text_agentout_finish - the output ended: release everything held (see the rules above) as
 * events like text_agentout_push. A second finish releases nothing. Returns TDM_OK or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t text_agentout_finish(text_agentout_t *parser, const text_agent_event_t **events_out,
                                  size_t *n_events_out);

/* text_agentout_n_calls - complete calls released so far. */
uint32_t text_agentout_n_calls(const text_agentout_t *parser);

/*
 * text_agentout_unfinished - 1 when finish released unfinished markup as content (a call cut off
 * by the end of the output), else 0. The router's finish_reason: "length" when the output hit
 * max_tokens with unfinished markup, else "tool_calls" when n_calls > 0.
 */
int text_agentout_unfinished(const text_agentout_t *parser);

/*
 * text_agentout_json_valid - 1 when text[0, n_text) is exactly one JSON value (RFC 8259), with
 * optional surrounding whitespace and nesting at most 64 deep; else 0. Numbers of any size.
 */
int text_agentout_json_valid(const char *text, size_t n_text);

#endif
