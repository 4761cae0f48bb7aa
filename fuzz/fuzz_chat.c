/* fuzz_chat.c - libFuzzer harness: DeepSeek chat rendering (text_chat_render, both formats, every
 * flag, tools JSON, tool calls and results, reasoning) and its tokenization (text_chat_encode with
 * the synthetic tokenizer of the tiny model).
 *
 * Input (fuzz/corpus/chat is made from tests/fixtures/chat_dsv4 by fuzz/make-corpus):
 *   byte 0: bit 0 the format (0 DSV4, 1 DSV3.1), bits 1-4 the text_chat_flags_t bits;
 *   then pieces split at NUL bytes: the first is tools_json (empty: none), each later one a
 *   message: its first byte % 4 the role, the rest fields split at 0x01 bytes: content,
 *   reasoning, tool_call_id (absent fields: none), then one tool call per further field,
 *   "id 0x02 name 0x02 arguments".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "text/tokenizer.h"

#define FUZZ_CHAT_MAX_MESSAGES 64
#define FUZZ_CHAT_MAX_CALLS    8     /* tool calls per message */
#define FUZZ_CHAT_FLAG_BITS    0x0fu /* text_chat_flags_t bits the input may set */
#define FUZZ_CHAT_VOCAB        1024u /* the tiny preset's vocabulary */
#define FUZZ_MESSAGE_SEP       '\0'
#define FUZZ_FIELD_SEP         '\x01'
#define FUZZ_CALL_SEP          '\x02'

/* The synthetic tokenizer (built once; immutable, thread-safe). */
static text_tokenizer_t *fuzz_tok;

/* Everything one input decodes to (pointers into the input). */
typedef struct {
    text_chat_params_t params;
    text_chat_message_t msgs[FUZZ_CHAT_MAX_MESSAGES];
    text_chat_tool_call_t calls[FUZZ_CHAT_MAX_MESSAGES][FUZZ_CHAT_MAX_CALLS];
    size_t n_msgs;
} fuzz_chat_t;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char *json = NULL;
    size_t n_json = 0;
    char err[256] = "";

    (void)argc;
    (void)argv;
    fuzz_quiet();
    if (text_tokenizer_synthetic_hf_text(FUZZ_CHAT_VOCAB, &json, &n_json, err, sizeof(err)) !=
            TDM_OK ||
        text_tokenizer_load_hf_buffer(json, n_json, "synthetic", &fuzz_tok, err, sizeof(err)) !=
            TDM_OK) {
        fprintf(stderr, "fuzz_chat: %s\n", err);
        abort();
    }
    free(json);
    return 0;
}

/* A cursor over [at, end); done once the last piece was taken. */
typedef struct {
    const char *at;
    const char *end;
    int done;
} cursor_t;

/* The next piece of the cursor up to `sep` (excluded). 0 when none is left. */
static int next_piece(cursor_t *c, char sep, const char **piece_out, size_t *n_out)
{
    const char *stop;

    if (c->done) {
        return 0;
    }
    stop = memchr(c->at, sep, (size_t)(c->end - c->at));
    *piece_out = c->at;
    if (stop == NULL) {
        *n_out = (size_t)(c->end - c->at);
        c->done = 1;
    } else {
        *n_out = (size_t)(stop - c->at);
        c->at = stop + 1;
    }
    return 1;
}

/* One tool call "id 0x02 name 0x02 arguments" (missing parts: empty). */
static void parse_call(const char *text, size_t n, text_chat_tool_call_t *call)
{
    cursor_t c = {text, text + n, 0};

    memset(call, 0, sizeof(*call));
    next_piece(&c, FUZZ_CALL_SEP, &call->id, &call->id_bytes);
    if (!next_piece(&c, FUZZ_CALL_SEP, &call->name, &call->name_bytes)) {
        call->name = "";
    }
    if (!next_piece(&c, FUZZ_CALL_SEP, &call->arguments, &call->arguments_bytes)) {
        call->arguments = "";
    }
}

/* One message piece (at least one byte: the role). */
static void parse_message(fuzz_chat_t *chat, const char *text, size_t n)
{
    size_t i = chat->n_msgs;
    text_chat_message_t *m = &chat->msgs[i];
    cursor_t c = {text + 1, text + n, 0};
    const char *field;
    size_t n_field;

    memset(m, 0, sizeof(*m));
    m->role = (text_chat_role_t)((unsigned char)text[0] % 4u);
    if (next_piece(&c, FUZZ_FIELD_SEP, &field, &n_field)) {
        m->content = field;
        m->content_bytes = n_field;
    }
    if (next_piece(&c, FUZZ_FIELD_SEP, &field, &n_field)) {
        m->reasoning = field;
        m->reasoning_bytes = n_field;
    }
    if (next_piece(&c, FUZZ_FIELD_SEP, &field, &n_field)) {
        m->tool_call_id = field;
        m->tool_call_id_bytes = n_field;
    }
    while (m->n_tool_calls < FUZZ_CHAT_MAX_CALLS &&
           next_piece(&c, FUZZ_FIELD_SEP, &field, &n_field)) {
        parse_call(field, n_field, &chat->calls[i][m->n_tool_calls]);
        m->n_tool_calls++;
    }
    if (m->n_tool_calls > 0) {
        m->tool_calls = chat->calls[i];
    }
    chat->n_msgs++;
}

static void parse_input(const uint8_t *data, size_t size, fuzz_chat_t *chat)
{
    cursor_t c = {(const char *)data + 1, (const char *)data + size, 0};
    const char *piece;
    size_t n_piece;

    text_chat_params_default(&chat->params);
    chat->params.format = (data[0] & 1u) != 0 ? TEXT_CHAT_FORMAT_DSV31 : TEXT_CHAT_FORMAT_DSV4;
    chat->params.flags = ((uint32_t)data[0] >> 1) & FUZZ_CHAT_FLAG_BITS;
    chat->n_msgs = 0;
    if (next_piece(&c, FUZZ_MESSAGE_SEP, &piece, &n_piece) && n_piece > 0) {
        chat->params.tools_json = piece;
        chat->params.tools_json_bytes = n_piece;
    }
    while (chat->n_msgs < FUZZ_CHAT_MAX_MESSAGES &&
           next_piece(&c, FUZZ_MESSAGE_SEP, &piece, &n_piece)) {
        if (n_piece > 0) {
            parse_message(chat, piece, n_piece);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fuzz_chat_t chat; /* large; fully rewritten by every input */
    char *text = NULL;
    size_t n_text = 0, n_ids = 0;
    int32_t *ids = NULL;

    if (size < 1) {
        return 0;
    }
    parse_input(data, size, &chat);
    if (text_chat_render(&chat.params, chat.msgs, chat.n_msgs, &text, &n_text) == TDM_OK) {
        free(text);
    }
    if (text_chat_encode(fuzz_tok, &chat.params, chat.msgs, chat.n_msgs, &ids, &n_ids) == TDM_OK) {
        text_tokens_free(ids);
    }
    return 0;
}
