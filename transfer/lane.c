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
