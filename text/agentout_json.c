/* agentout_json.c - text_agentout_json_valid: the RFC 8259 grammar of one JSON value, used for
 * string="false" parameter values (text/agentout.h). Syntax only: numbers of any size, no
 * decoding, nesting at most AGENT_JSON_MAX_DEPTH deep. */
#include <stdint.h>
#include <string.h>

#include "text/agentout.h"

/* Deepest JSON nesting text_agentout_json_valid accepts. */
#define AGENT_JSON_MAX_DEPTH 64

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether s[pos, n) starts with lit (all of it). */
static int starts_with(const char *s, size_t n, size_t pos, const char *lit, size_t n_lit)
{
    return pos + n_lit <= n && memcmp(s + pos, lit, n_lit) == 0;
}

static size_t json_skip_ws(const char *s, size_t n, size_t pos)
{
    while (pos < n && is_ws(s[pos])) {
        pos++;
    }
    return pos;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Each returns the offset after the value, or SIZE_MAX when it is not one. */
static size_t json_value(const char *s, size_t n, size_t pos, int depth);

static size_t json_string(const char *s, size_t n, size_t pos)
{
    pos++; /* the opening quote */
    while (pos < n) {
        unsigned char c = (unsigned char)s[pos];
        if (c == '"') {
            return pos + 1;
        }
        if (c < 0x20) {
            return SIZE_MAX;
        }
        if (c == '\\') {
            if (pos + 1 >= n) {
                return SIZE_MAX;
            }
            c = (unsigned char)s[pos + 1];
            if (c == 'u') {
                for (size_t k = 2; k < 6; k++) {
                    if (pos + k >= n || !is_hex(s[pos + k])) {
                        return SIZE_MAX;
                    }
                }
                pos += 6;
                continue;
            }
            if (strchr("\"\\/bfnrt", (int)c) == NULL || c == '\0') {
                return SIZE_MAX;
            }
            pos += 2;
            continue;
        }
        pos++;
    }
    return SIZE_MAX;
}

static size_t json_digits(const char *s, size_t n, size_t pos)
{
    size_t start = pos;

    while (pos < n && is_digit(s[pos])) {
        pos++;
    }
    return pos > start ? pos : SIZE_MAX;
}

static size_t json_number(const char *s, size_t n, size_t pos)
{
    if (s[pos] == '-') {
        pos++;
    }
    if (pos < n && s[pos] == '0') {
        pos++;
    } else if ((pos = json_digits(s, n, pos)) == SIZE_MAX) {
        return SIZE_MAX;
    }
    if (pos < n && s[pos] == '.' && (pos = json_digits(s, n, pos + 1)) == SIZE_MAX) {
        return SIZE_MAX;
    }
    if (pos < n && (s[pos] == 'e' || s[pos] == 'E')) {
        pos++;
        if (pos < n && (s[pos] == '+' || s[pos] == '-')) {
            pos++;
        }
        pos = json_digits(s, n, pos);
    }
    return pos;
}

/* Object or array: open/close bytes, members separated by commas. */
static size_t json_container(const char *s, size_t n, size_t pos, int depth, char close)
{
    int first = 1;

    if (depth >= AGENT_JSON_MAX_DEPTH) {
        return SIZE_MAX;
    }
    pos = json_skip_ws(s, n, pos + 1);
    if (pos < n && s[pos] == close) {
        return pos + 1;
    }
    for (;;) {
        if (!first) {
            pos = json_skip_ws(s, n, pos);
            if (pos < n && s[pos] == close) {
                return pos + 1;
            }
            if (pos >= n || s[pos] != ',') {
                return SIZE_MAX;
            }
            pos = json_skip_ws(s, n, pos + 1);
        }
        first = 0;
        if (close == '}') {
            if (pos >= n || s[pos] != '"' || (pos = json_string(s, n, pos)) == SIZE_MAX) {
                return SIZE_MAX;
            }
            pos = json_skip_ws(s, n, pos);
            if (pos >= n || s[pos] != ':') {
                return SIZE_MAX;
            }
            pos = json_skip_ws(s, n, pos + 1);
        }
        pos = json_value(s, n, pos, depth + 1);
        if (pos == SIZE_MAX) {
            return SIZE_MAX;
        }
    }
}

static size_t json_value(const char *s, size_t n, size_t pos, int depth)
{
    if (pos >= n) {
        return SIZE_MAX;
    }
    switch (s[pos]) {
    case '"':
        return json_string(s, n, pos);
    case '{':
        return json_container(s, n, pos, depth, '}');
    case '[':
        return json_container(s, n, pos, depth, ']');
    case 't':
        return starts_with(s, n, pos, "true", 4) ? pos + 4 : SIZE_MAX;
    case 'f':
        return starts_with(s, n, pos, "false", 5) ? pos + 5 : SIZE_MAX;
    case 'n':
        return starts_with(s, n, pos, "null", 4) ? pos + 4 : SIZE_MAX;
    default:
        return s[pos] == '-' || is_digit(s[pos]) ? json_number(s, n, pos) : SIZE_MAX;
    }
}

int text_agentout_json_valid(const char *text, size_t n_text)
{
    size_t pos;

    if (text == NULL) {
        return 0;
    }
    pos = json_value(text, n_text, json_skip_ws(text, n_text, 0), 0);
    return pos != SIZE_MAX && json_skip_ws(text, n_text, pos) == n_text;
}
