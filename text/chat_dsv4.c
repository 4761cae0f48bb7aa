/* chat_dsv4.c - the DeepSeek-V4 conversation format (encoding/encoding_dsv4.py of the
 * DeepSeek-V4 release, modelled for DeepSeek-V4.1 here): system prompt with the tool schemas,
 * user turns holding tool results, assistant turns with reasoning and DSML tool calls.
 *
 * Follows encode_messages with its defaults (drop_thinking=True, no context, no reasoning
 * effort): merge_tool_messages, sort_tool_results_by_call_order, then render_message per
 * message. Golden outputs of the reference: tests/fixtures/chat_dsv4 (docs/TOKENIZER.md).
 */
#include "text/chat_impl.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* TOOLS_TEMPLATE of encoding_dsv4.py around its {tool_schemas}, placeholders filled in. The
 * text is the model's prompt format and must stay byte for byte. */
static const char TOOLS_HEAD[] =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<" TEXT_TOKENIZER_DSML "tool_calls>\" block like the following:\n"
    "\n"
    "<" TEXT_TOKENIZER_DSML "tool_calls>\n"
    "<" TEXT_TOKENIZER_DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" TEXT_TOKENIZER_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</" TEXT_TOKENIZER_DSML "parameter>\n"
    "...\n"
    "</" TEXT_TOKENIZER_DSML "invoke>\n"
    "<" TEXT_TOKENIZER_DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" TEXT_TOKENIZER_DSML "invoke>\n"
    "</" TEXT_TOKENIZER_DSML "tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";
/* REASONING_EFFORT_MAX of encoding_dsv4.py (thinking mode, reasoning_effort "max"). */
static const char REASONING_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
static const char TOOLS_TAIL[] = "\n"
                                 "\n"
                                 "You MUST strictly follow the above defined tool name and "
                                 "parameter schemas to invoke tool calls.\n";

/* One message after merge_tool_messages: a run of user messages and tool results is one USER
 * message made of blocks; a synthetic SYSTEM message (src NULL) may carry the tools. */
typedef struct {
    text_chat_role_t role;          /* SYSTEM, USER or ASSISTANT */
    const text_chat_message_t *src; /* SYSTEM/ASSISTANT: the message (NULL: synthetic system) */
    size_t first_block, n_blocks;   /* USER: blocks[first_block .. +n_blocks) */
    int has_tools;
} dsv4_msg_t;

/* The schema lines of `tools_json`: json.dumps of each tool's "function" object, joined by
 * "\n", into *buf. *n_tools_out = 0 when there are none. */
static tdm_status_t tool_schemas(const char *tools_json, size_t n_bytes, tdm_buf_t *buf,
                                 size_t *n_tools_out)
{
    json_t *tools;
    tdm_status_t status = TDM_OK;

    *n_tools_out = 0;
    if (tools_json == NULL || n_bytes == 0) {
        return TDM_OK;
    }
    tools = json_loadb(tools_json, n_bytes, 0, NULL);
    if (!json_is_array(tools)) {
        json_decref(tools);
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < json_array_size(tools) && status == TDM_OK; i++) {
        json_t *tool = json_array_get(tools, i);
        json_t *type = json_object_get(tool, "type");
        json_t *fn = json_object_get(tool, "function");
        json_t *shown;
        const char *key;
        json_t *value;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_object(fn)) {
            status = TDM_ERR_INVALID_ARG;
            break;
        }
        /* The function object as the client wrote it, less "strict" and null members. */
        shown = json_object();
        if (shown == NULL) {
            status = TDM_ERR_NO_MEMORY;
            break;
        }
        json_object_foreach(fn, key, value)
        {
            if (strcmp(key, "strict") != 0 && !json_is_null(value) &&
                json_object_set(shown, key, value) != 0) {
                status = TDM_ERR_NO_MEMORY;
            }
        }
        if (status == TDM_OK && i > 0) {
            status = tdm_buf_append(buf, "\n", 1);
        }
        if (status == TDM_OK) {
            status = chat_json_dumps_py(shown, buf);
        }
        json_decref(shown);
    }
    if (status == TDM_OK) {
        *n_tools_out = json_array_size(tools);
    }
    json_decref(tools);
    return status;
}

/* "\n\n" + the tools section (render_tools). `schemas` is moved into the segment list. */
static void render_tools(tdm_buf_t *schemas, chat_segs_t *out)
{
    size_t n = 0;
    char *text;

    chat_seg_literal(out, "\n\n");
    chat_seg_template(out, TOOLS_HEAD);
    text = tdm_buf_take(schemas, &n);
    if (text != NULL) {
        chat_seg_owned(out, text, n);
    }
    chat_seg_literal(out, TOOLS_TAIL);
}

/* "<｜DSML｜" + name: a DSML tag opening (close = "</｜DSML｜"). */
static void dsml_tag(chat_segs_t *out, const char *open, const char *name)
{
    chat_seg_literal(out, open);
    chat_seg_marker(out, TEXT_TOKENIZER_DSML);
    chat_seg_literal(out, name);
}

/* One parameter line (encode_arguments_to_dsml). */
static void render_parameter(chat_segs_t *out, const char *key, const json_t *value)
{
    int is_string = json_is_string(value);

    dsml_tag(out, "<", "parameter name=\"");
    chat_seg_text(out, key, strlen(key));
    chat_seg_literal(out, is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    if (is_string) {
        chat_seg_text(out, json_string_value(value), json_string_length(value));
    } else {
        tdm_buf_t buf = {0};
        size_t n = 0;
        char *text;
        tdm_status_t status = chat_json_dumps_py(value, &buf);
        if (status != TDM_OK) {
            tdm_buf_fini(&buf);
            if (out->status == TDM_OK) {
                out->status = status;
            }
            return;
        }
        text = tdm_buf_take(&buf, &n);
        if (text != NULL) {
            chat_seg_owned(out, text, n);
        }
    }
    dsml_tag(out, "</", "parameter>");
}

/* The parameters of one call: its arguments parsed as JSON; text that is not JSON becomes one
 * string parameter "arguments" (the encoder's fallback); other JSON than an object is refused. */
static void render_arguments(chat_segs_t *out, const text_chat_tool_call_t *call)
{
    json_t *args = json_loadb(call->arguments != NULL ? call->arguments : "", call->arguments_bytes,
                              JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    const char *key;
    json_t *value;
    int first = 1;

    if (args == NULL) {
        args = json_object();
        if (args == NULL ||
            json_object_set_new(args, "arguments",
                                json_stringn(call->arguments != NULL ? call->arguments : "",
                                             call->arguments_bytes)) != 0) {
            json_decref(args);
            /* not UTF-8 (json_stringn refuses it) or no memory */
            out->status = out->status == TDM_OK ? TDM_ERR_INVALID_ARG : out->status;
            return;
        }
    }
    if (!json_is_object(args)) {
        json_decref(args);
        out->status = out->status == TDM_OK ? TDM_ERR_INVALID_ARG : out->status;
        return;
    }
    json_object_foreach(args, key, value)
    {
        if (!first) {
            chat_seg_literal(out, "\n");
        }
        first = 0;
        render_parameter(out, key, value);
    }
    chat_seg_keep_json(out, args); /* the segments point into its strings */
}

/* "\n\n<｜DSML｜tool_calls>\n" + invoke blocks joined by "\n" + "\n</｜DSML｜tool_calls>". */
static void render_tool_calls(chat_segs_t *out, const text_chat_message_t *m)
{
    chat_seg_literal(out, "\n\n");
    dsml_tag(out, "<", "tool_calls>\n");
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const text_chat_tool_call_t *call = &m->tool_calls[k];
        if (k > 0) {
            chat_seg_literal(out, "\n");
        }
        dsml_tag(out, "<", "invoke name=\"");
        chat_seg_text(out, call->name, call->name_bytes);
        chat_seg_literal(out, "\">\n");
        render_arguments(out, call);
        chat_seg_literal(out, "\n");
        dsml_tag(out, "</", "invoke>");
    }
    chat_seg_literal(out, "\n");
    dsml_tag(out, "</", "tool_calls>");
}

/* Position of `id` among the calls of `caller` (the last call with that non-empty id), else 0:
 * the key sort_tool_results_by_call_order sorts a tool result by. */
static size_t call_order(const text_chat_message_t *caller, const text_chat_message_t *result)
{
    size_t key = 0;

    for (size_t k = 0; k < caller->n_tool_calls; k++) {
        const text_chat_tool_call_t *c = &caller->tool_calls[k];
        if (c->id_bytes > 0 && c->id_bytes == result->tool_call_id_bytes &&
            memcmp(c->id, result->tool_call_id, c->id_bytes) == 0) {
            key = k;
        }
    }
    return key;
}

static int has_call_ids(const text_chat_message_t *caller)
{
    for (size_t k = 0; k < caller->n_tool_calls; k++) {
        if (caller->tool_calls[k].id_bytes > 0) {
            return 1;
        }
    }
    return 0;
}

/* sort_tool_results_by_call_order: within each user message with several tool results, the
 * results (in the places results occupy) are stably sorted by the order of the calls of the
 * latest assistant message that made calls. */
static void sort_tool_results(dsv4_msg_t *msgs, size_t n, const text_chat_message_t **blocks)
{
    const text_chat_message_t *caller = NULL;

    for (size_t i = 0; i < n; i++) {
        const text_chat_message_t **b = blocks + msgs[i].first_block;
        if (msgs[i].role == TEXT_CHAT_ASSISTANT && msgs[i].src->n_tool_calls > 0) {
            caller = msgs[i].src;
            continue;
        }
        if (msgs[i].role != TEXT_CHAT_USER || caller == NULL || !has_call_ids(caller)) {
            continue;
        }
        /* Insertion sort over the tool-result blocks only (stable; few blocks). */
        for (size_t j = 1; j < msgs[i].n_blocks; j++) {
            const text_chat_message_t *moving = b[j];
            size_t key, hole = j;
            if (moving->role != TEXT_CHAT_TOOL) {
                continue;
            }
            key = call_order(caller, moving);
            for (size_t p = j; p-- > 0;) {
                if (b[p]->role != TEXT_CHAT_TOOL) {
                    continue;
                }
                if (call_order(caller, b[p]) <= key) {
                    break;
                }
                b[hole] = b[p];
                hole = p;
            }
            b[hole] = moving;
        }
    }
}

void chat_render_dsv4(const text_chat_params_t *params, const text_chat_message_t *src,
                      size_t n_src, chat_segs_t *out)
{
    dsv4_msg_t *msgs = calloc(n_src + 1, sizeof(*msgs));
    const text_chat_message_t **blocks = calloc(n_src + 1, sizeof(*blocks));
    int thinking = (params->flags & TEXT_CHAT_THINKING) != 0;
    tdm_buf_t schemas = {0};
    size_t n = 0, n_blocks = 0, n_tools = 0, last_user = SIZE_MAX;
    tdm_status_t status;
    int drop_thinking;

    if (msgs == NULL || blocks == NULL) {
        out->status = TDM_ERR_NO_MEMORY;
        goto done;
    }
    status = tool_schemas(params->tools_json, params->tools_json_bytes, &schemas, &n_tools);
    if (status != TDM_OK) {
        out->status = status;
        goto done;
    }
    /* The tools ride on the first message when it is a system message, else on an empty system
     * message put first (SGLang's DSV4 chat path; the release's own tests do the former). */
    if (n_tools > 0 && (n_src == 0 || src[0].role != TEXT_CHAT_SYSTEM)) {
        msgs[n++] = (dsv4_msg_t){TEXT_CHAT_SYSTEM, NULL, 0, 0, 1};
    }
    /* merge_tool_messages: a user message or tool result joins a preceding merged user one. */
    for (size_t i = 0; i < n_src; i++) {
        const text_chat_message_t *m = &src[i];
        if (m->role == TEXT_CHAT_USER || m->role == TEXT_CHAT_TOOL) {
            if (n == 0 || msgs[n - 1].role != TEXT_CHAT_USER) {
                msgs[n++] = (dsv4_msg_t){TEXT_CHAT_USER, NULL, n_blocks, 0, 0};
            }
            blocks[n_blocks++] = m;
            msgs[n - 1].n_blocks++;
        } else {
            msgs[n++] = (dsv4_msg_t){m->role, m, 0, 0,
                                     n_tools > 0 && i == 0 && m->role == TEXT_CHAT_SYSTEM};
        }
    }
    sort_tool_results(msgs, n, blocks);
    /* With tools anywhere, encode_messages turns drop_thinking off: all reasoning stays. */
    drop_thinking = n_tools == 0;
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == TEXT_CHAT_USER) {
            last_user = i;
        }
    }
    if ((params->flags & TEXT_CHAT_NO_BOS) == 0) {
        chat_seg_marker(out, TEXT_TOKENIZER_DS_BOS);
    }
    for (size_t i = 0; i < n; i++) {
        const dsv4_msg_t *m = &msgs[i];
        int is_last = i + 1 == n;
        if (i == 0 && thinking && (params->flags & TEXT_CHAT_REASONING_MAX) != 0) {
            chat_seg_literal(out, REASONING_MAX);
        }
        if (m->role == TEXT_CHAT_SYSTEM) {
            if (m->src != NULL) {
                chat_seg_text(out, m->src->content, m->src->content_bytes);
            }
            if (m->has_tools) {
                render_tools(&schemas, out);
            }
        } else if (m->role == TEXT_CHAT_USER) {
            chat_seg_marker(out, TEXT_TOKENIZER_DS_USER);
            for (size_t k = 0; k < m->n_blocks; k++) {
                const text_chat_message_t *b = blocks[m->first_block + k];
                if (k > 0) {
                    chat_seg_literal(out, "\n\n");
                }
                if (b->role == TEXT_CHAT_TOOL) {
                    chat_seg_literal(out, "<tool_result>");
                }
                chat_seg_text(out, b->content, b->content_bytes);
                if (b->role == TEXT_CHAT_TOOL) {
                    chat_seg_literal(out, "</tool_result>");
                }
            }
        } else {
            /* Reasoning is kept after the last user message, or everywhere with tools. */
            if (thinking && (!drop_thinking || last_user == SIZE_MAX || i > last_user)) {
                chat_seg_text(out, m->src->reasoning, m->src->reasoning_bytes);
                chat_seg_marker(out, TEXT_TOKENIZER_DS_END_THINK);
            }
            chat_seg_text(out, m->src->content, m->src->content_bytes);
            if (m->src->n_tool_calls > 0) {
                render_tool_calls(out, m->src);
            }
            chat_seg_marker(out, TEXT_TOKENIZER_DS_EOS);
        }
        /* Into the assistant's turn: after a user message that the assistant follows, or that
         * ends the conversation (when a generation prompt is wanted). */
        if (m->role != TEXT_CHAT_USER ||
            (is_last ? (params->flags & TEXT_CHAT_ADD_GENERATION_PROMPT) == 0
                     : msgs[i + 1].role != TEXT_CHAT_ASSISTANT)) {
            continue;
        }
        chat_seg_marker(out, TEXT_TOKENIZER_DS_ASSISTANT);
        chat_seg_marker(out, thinking && (!drop_thinking || i >= last_user)
                                 ? TEXT_TOKENIZER_DS_THINK
                                 : TEXT_TOKENIZER_DS_END_THINK);
    }
done:
    tdm_buf_fini(&schemas);
    free(msgs);
    free(blocks);
}
