#include "transfer/lane.h"

#include "common/log.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *tl_name; /* UCX transport name, or a prefix when `is_prefix` */
    int is_prefix;
    xfer_lane_class_t cls;
} tl_entry_t;

/* UCX 1.13 transport names (ucx_info -d); prefixes cover the verbs/mlx5 variants. */
static const tl_entry_t tl_table[] = {
    {"self", 0, XFER_LANE_SELF},
    {"tcp", 0, XFER_LANE_TCP},
    {"sysv", 0, XFER_LANE_SHM},
    {"posix", 0, XFER_LANE_SHM},
    {"cma", 0, XFER_LANE_SHM},
    {"knem", 0, XFER_LANE_SHM},
    {"xpmem", 0, XFER_LANE_SHM},
    {"rc_", 1, XFER_LANE_RC},
    {"dc_", 1, XFER_LANE_DC},
    {"ud_", 1, XFER_LANE_UD},
    {"cuda_ipc", 0, XFER_LANE_CUDA_IPC},
    {"cuda_copy", 0, XFER_LANE_CUDA_COPY},
    {"gdr_copy", 0, XFER_LANE_GDR_COPY},
};

static const char *const class_names[XFER_LANE_N_CLASSES] = {
    [XFER_LANE_UNKNOWN] = "unknown",
    [XFER_LANE_SELF] = "self",
    [XFER_LANE_TCP] = "tcp",
    [XFER_LANE_SHM] = "shm",
    [XFER_LANE_RC] = "rc",
    [XFER_LANE_DC] = "dc",
    [XFER_LANE_UD] = "ud",
    [XFER_LANE_CUDA_IPC] = "cuda_ipc",
    [XFER_LANE_CUDA_COPY] = "cuda_copy",
    [XFER_LANE_GDR_COPY] = "gdr_copy",
};

const char *xfer_lane_class_name(xfer_lane_class_t cls)
{
    if ((unsigned)cls >= XFER_LANE_N_CLASSES) {
        return "unknown";
    }
    return class_names[cls];
}

xfer_lane_class_t xfer_lane_class_of_transport(const char *tl_name, size_t n_chars)
{
    for (size_t i = 0; i < sizeof(tl_table) / sizeof(tl_table[0]); i++) {
        size_t len = strlen(tl_table[i].tl_name);

        if (tl_table[i].is_prefix) {
            if (n_chars > len && strncmp(tl_name, tl_table[i].tl_name, len) == 0) {
                return tl_table[i].cls;
            }
        } else if (n_chars == len && strncmp(tl_name, tl_table[i].tl_name, len) == 0) {
            return tl_table[i].cls;
        }
    }
    return XFER_LANE_UNKNOWN;
}

/* The class named by a "<transport>/<device>" token, or UNKNOWN. */
static xfer_lane_class_t token_class(const char *token, size_t n_chars)
{
    const char *slash = memchr(token, '/', n_chars);

    if (slash == NULL || slash == token) {
        return XFER_LANE_UNKNOWN;
    }
    return xfer_lane_class_of_transport(token, (size_t)(slash - token));
}

static void text_append(char *text, const char *word, size_t n_chars)
{
    size_t used = strlen(text);
    size_t room = XFER_LANE_TEXT_BYTES - 1 - used;

    if (used > 0 && room > 0) {
        text[used++] = ' ';
        room--;
    }
    if (n_chars > room) {
        n_chars = room;
    }
    memcpy(text + used, word, n_chars);
    text[used + n_chars] = '\0';
}

tdm_status_t xfer_lane_parse_info(const char *info, xfer_lane_t *lane_out)
{
    xfer_lane_t lane;
    const char *p = info;
    int after_length = 0; /* 0: before "length", 1: saw "length", 2: past its number */
    int collecting = 1;

    memset(&lane, 0, sizeof(lane));
    while (*p != '\0') {
        const char *word;
        size_t n_chars;
        xfer_lane_class_t cls;

        while (*p == ' ') {
            p++;
        }
        word = p;
        while (*p != '\0' && *p != ' ') {
            p++;
        }
        n_chars = (size_t)(p - word);
        if (n_chars == 0) {
            break;
        }
        cls = token_class(word, n_chars);
        if (cls != XFER_LANE_UNKNOWN) {
            if (lane.classes == 0) {
                lane.cls = cls;
            }
            lane.classes |= XFER_LANE_BIT(cls);
            if (collecting) {
                text_append(lane.text, word, n_chars);
                collecting = 0;
            }
        } else if (after_length == 0 && n_chars == 6 && strncmp(word, "length", 6) == 0) {
            after_length = 1;
        } else if (after_length == 1) {
            after_length = 2;
        } else if (after_length == 2 && collecting) {
            text_append(lane.text, word, n_chars);
            if (n_chars == 8 && strncmp(word, "software", 8) == 0) {
                lane.flags |= XFER_LANE_EMULATED;
            }
        }
    }
    if (lane.classes == 0) {
        lane.cls = XFER_LANE_UNKNOWN;
        lane.text[0] = '\0';
        text_append(lane.text, info, strlen(info));
        *lane_out = lane;
        return TDM_ERR_FORMAT;
    }
    *lane_out = lane;
    return TDM_OK;
}

tdm_status_t xfer_lane_rkey_md_map(const uint8_t *packed, size_t n_bytes, uint64_t *md_map_out)
{
    uint64_t md_map = 0;
    size_t at = 9; /* md map (8 bytes) and memory type (1 byte) */

    if (packed == NULL || n_bytes < at) {
        return TDM_ERR_FORMAT;
    }
    for (unsigned i = 0; i < 8; i++) {
        md_map |= (uint64_t)packed[i] << (8 * i);
    }
    for (unsigned md = 0; md < 64; md++) {
        if (((md_map >> md) & 1u) == 0) {
            continue;
        }
        if (at >= n_bytes) {
            return TDM_ERR_FORMAT;
        }
        at += 1 + (size_t)packed[at];
        if (at > n_bytes) {
            return TDM_ERR_FORMAT;
        }
    }
    if (at != n_bytes || md_map == 0) {
        return TDM_ERR_FORMAT;
    }
    *md_map_out = md_map;
    return TDM_OK;
}

/* ---- ucp_ep_print_info text ---- */

#define EP_MAX_LANES   32 /* UCX 1.13: UCP_MAX_LANES is 8; room for later versions */
#define EP_PROTO_BYTES 32

typedef struct {
    int present;
    int is_am;  /* the active-message lane (software-emulated RMA goes over it) */
    int dst_md; /* the peer's memory domain index, -1 if not printed */
    xfer_lane_class_t cls;
    char tl_dev[XFER_LANE_TEXT_BYTES]; /* "sysv/memory", "tcp/lo", "rc_mlx5/mlx5_0:1" */
} ep_lane_t;

typedef struct {
    int lane;
    char proto[EP_PROTO_BYTES]; /* protocol of the range holding the message size */
} ep_rma_t;

/* One whitespace-separated word of [*p, end): returns its start, sets *n_chars (0: none). */
static const char *next_word(const char **p, const char *end, size_t *n_chars)
{
    const char *word;

    while (*p < end && (**p == ' ' || **p == '\t' || **p == '#')) {
        (*p)++;
    }
    word = *p;
    while (*p < end && **p != ' ' && **p != '\t') {
        (*p)++;
    }
    *n_chars = (size_t)(*p - word);
    return word;
}

/* "<name>[<index>]:" at the start of a word: the index, or -1. */
static int bracket_index(const char *word, size_t n_chars, const char *name)
{
    size_t len = strlen(name);
    int index = 0;
    size_t i;

    if (n_chars < len + 3 || strncmp(word, name, len) != 0 || word[len] != '[') {
        return -1;
    }
    for (i = len + 1; i < n_chars && word[i] >= '0' && word[i] <= '9'; i++) {
        index = index * 10 + (word[i] - '0');
        if (index >= EP_MAX_LANES) {
            return -1;
        }
    }
    if (i == len + 1 || i + 2 != n_chars || word[i] != ']' || word[i + 1] != ':') {
        return -1;
    }
    return index;
}

/* A lane line after "lane[i]:": "0:sysv/memory.0 md[0] -> md[0]/sysv/sysdev[255] am ...". */
static void parse_lane_line(const char *p, const char *end, ep_lane_t *lane)
{
    size_t n_chars;
    const char *word = next_word(&p, end, &n_chars);
    const char *colon = memchr(word, ':', n_chars);
    const char *slash;
    size_t tl_chars;
    int after_arrow = 0;

    if (colon == NULL) {
        return;
    }
    tl_chars = n_chars - (size_t)(colon + 1 - word);
    word = colon + 1;
    /* strip the path index: "sysv/memory.0" -> "sysv/memory" */
    {
        size_t k = tl_chars;

        while (k > 0 && word[k - 1] >= '0' && word[k - 1] <= '9') {
            k--;
        }
        if (k > 0 && k < tl_chars && word[k - 1] == '.') {
            tl_chars = k - 1;
        }
    }
    slash = memchr(word, '/', tl_chars);
    if (slash == NULL || slash == word) {
        return;
    }
    lane->present = 1;
    lane->dst_md = -1;
    lane->cls = xfer_lane_class_of_transport(word, (size_t)(slash - word));
    if (tl_chars >= sizeof(lane->tl_dev)) {
        tl_chars = sizeof(lane->tl_dev) - 1;
    }
    memcpy(lane->tl_dev, word, tl_chars);
    lane->tl_dev[tl_chars] = '\0';
    for (;;) {
        word = next_word(&p, end, &n_chars);
        if (n_chars == 0) {
            break;
        }
        if (n_chars == 2 && strncmp(word, "->", 2) == 0) {
            after_arrow = 1;
        } else if (after_arrow == 1) {
            int md = 0;
            size_t i = 3;

            after_arrow = 2;
            if (n_chars > 4 && strncmp(word, "md[", 3) == 0) {
                while (i < n_chars && word[i] >= '0' && word[i] <= '9' && md < 4096) {
                    md = md * 10 + (word[i] - '0');
                    i++;
                }
                if (i > 3 && i < n_chars && word[i] == ']') {
                    lane->dst_md = md;
                }
            }
        } else if (n_chars == 2 && strncmp(word, "am", 2) == 0) {
            lane->is_am = 1;
        }
    }
}

/* A threshold value: decimal bytes, or "(inf)". Returns 0 on anything else. */
static int threshold_value(const char *p, size_t n_chars, uint64_t *value_out)
{
    uint64_t v = 0;

    if (n_chars == 5 && strncmp(p, "(inf)", 5) == 0) {
        *value_out = UINT64_MAX;
        return 1;
    }
    if (n_chars == 0 || n_chars > 19) {
        return 0;
    }
    for (size_t i = 0; i < n_chars; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return 0;
        }
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *value_out = v;
    return 1;
}

/* The protocol of "0..<short>..4294967296..<bcopy>..(inf)" whose [lo, hi) holds msg_bytes.
 * Returns 1 and fills proto, or 0 when the text does not parse or no range holds it. */
static int threshold_proto(const char *p, const char *end, size_t msg_bytes, char *proto,
                           size_t proto_bytes)
{
    size_t n_chars;
    const char *word = next_word(&p, end, &n_chars);
    const char *q = word;
    const char *stop = word + n_chars;
    uint64_t lo;

    /* pieces separated by "..": value, <name>, value, <name>, ..., value */
    {
        const char *dots = q;

        while (dots + 1 < stop && !(dots[0] == '.' && dots[1] == '.')) {
            dots++;
        }
        if (dots + 1 >= stop || !threshold_value(q, (size_t)(dots - q), &lo)) {
            return 0;
        }
        q = dots + 2;
    }
    while (q < stop) {
        const char *name = q;
        const char *close = memchr(q, '>', (size_t)(stop - q));
        const char *dots;
        uint64_t hi;

        if (*name != '<' || close == NULL || close + 3 > stop || close[1] != '.' ||
            close[2] != '.') {
            return 0;
        }
        q = close + 3;
        dots = q;
        while (dots + 1 < stop && !(dots[0] == '.' && dots[1] == '.')) {
            dots++;
        }
        if (dots + 1 >= stop) {
            dots = stop;
        }
        if (!threshold_value(q, (size_t)(dots - q), &hi)) {
            return 0;
        }
        if ((uint64_t)msg_bytes >= lo && ((uint64_t)msg_bytes < hi || hi == UINT64_MAX)) {
            size_t len = (size_t)(close - name - 1);

            if (len >= proto_bytes) {
                len = proto_bytes - 1;
            }
            memcpy(proto, name + 1, len);
            proto[len] = '\0';
            return 1;
        }
        lo = hi;
        q = dots == stop ? stop : dots + 2;
    }
    return 0;
}

tdm_status_t xfer_lane_parse_ep_info(const char *info, int is_get, size_t msg_bytes,
                                     const uint64_t *rkey_md_map, xfer_lane_t *lane_out)
{
    ep_lane_t lanes[EP_MAX_LANES];
    ep_rma_t rma[EP_MAX_LANES];
    unsigned n_rma = 0;
    const char *line = info;
    const char *op_name = is_get ? "get" : "put";
    xfer_lane_t lane;
    int am_lane = -1;
    int chosen = -1;

    memset(lanes, 0, sizeof(lanes));
    memset(&lane, 0, sizeof(lane));
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        const char *p = line;
        const char *word;
        size_t n_chars;
        int index;

        if (end == NULL) {
            end = line + strlen(line);
        }
        word = next_word(&p, end, &n_chars);
        if ((index = bracket_index(word, n_chars, "lane")) >= 0) {
            memset(&lanes[index], 0, sizeof(lanes[index]));
            parse_lane_line(p, end, &lanes[index]);
        } else if ((index = bracket_index(word, n_chars, op_name)) >= 0 && n_rma < EP_MAX_LANES) {
            rma[n_rma].lane = index;
            if (!threshold_proto(p, end, msg_bytes, rma[n_rma].proto, sizeof(rma[n_rma].proto))) {
                snprintf(rma[n_rma].proto, sizeof(rma[n_rma].proto), "%s", op_name);
            }
            n_rma++;
        }
        line = *end == '\n' ? end + 1 : end;
    }
    for (int i = 0; i < EP_MAX_LANES; i++) {
        if (lanes[i].present && lanes[i].is_am && am_lane < 0) {
            am_lane = i;
        }
    }

    for (unsigned r = 0; r < n_rma; r++) {
        const ep_lane_t *l = &lanes[rma[r].lane];

        if (!l->present || l->cls == XFER_LANE_UNKNOWN) {
            continue;
        }
        if (rkey_md_map != NULL &&
            (l->dst_md < 0 || l->dst_md >= 64 || ((*rkey_md_map >> l->dst_md) & 1u) == 0)) {
            continue; /* the peer's rkey has no key for this lane's memory domain */
        }
        if (chosen < 0) {
            chosen = (int)r;
            lane.cls = l->cls;
            text_append(lane.text, rma[r].proto, strlen(rma[r].proto));
            text_append(lane.text, l->tl_dev, strlen(l->tl_dev));
        }
        lane.classes |= XFER_LANE_BIT(l->cls);
    }
    if (am_lane >= 0 && lanes[am_lane].cls != XFER_LANE_UNKNOWN &&
        (chosen < 0 || rkey_md_map == NULL)) {
        /* no RMA lane reaches the rkey (or we cannot tell): emulated over active messages */
        if (chosen < 0) {
            lane.cls = lanes[am_lane].cls;
            lane.flags |= XFER_LANE_EMULATED;
            text_append(lane.text, "software emulation", 18);
            text_append(lane.text, lanes[am_lane].tl_dev, strlen(lanes[am_lane].tl_dev));
        }
        lane.classes |= XFER_LANE_BIT(lanes[am_lane].cls);
    }
    if (lane.classes == 0) {
        memset(&lane, 0, sizeof(lane));
        text_append(lane.text, info, strlen(info));
        *lane_out = lane;
        return TDM_ERR_FORMAT;
    }
    *lane_out = lane;
    return TDM_OK;
}

tdm_status_t xfer_lane_mask_parse(const char *text, xfer_lane_mask_t *mask_out)
{
    xfer_lane_mask_t mask = 0;
    const char *p = text;

    if (text == NULL || text[0] == '\0' || strcmp(text, "any") == 0) {
        *mask_out = 0;
        return TDM_OK;
    }
    while (*p != '\0') {
        const char *word = p;
        size_t n_chars;
        int found = 0;

        while (*p != '\0' && *p != ',') {
            p++;
        }
        n_chars = (size_t)(p - word);
        for (unsigned cls = XFER_LANE_SELF; cls < XFER_LANE_N_CLASSES; cls++) {
            if (strlen(class_names[cls]) == n_chars &&
                strncmp(word, class_names[cls], n_chars) == 0) {
                mask |= XFER_LANE_BIT(cls);
                found = 1;
            }
        }
        if (!found) {
            tdm_log(TDM_LOG_ERROR, "xfer",
                    "bad transport requirement: word=\"%.*s\" allowed=self,tcp,shm,rc,dc,ud,"
                    "cuda_ipc,cuda_copy,gdr_copy,any",
                    (int)n_chars, word);
            return TDM_ERR_INVALID_ARG;
        }
        if (*p == ',') {
            p++;
        }
    }
    *mask_out = mask;
    return TDM_OK;
}

int xfer_lane_accepted(const xfer_lane_t *lane, xfer_lane_mask_t required)
{
    if (required == 0) {
        return 1;
    }
    if (lane->classes == 0) {
        return 0;
    }
    return (lane->classes & ~required) == 0;
}
