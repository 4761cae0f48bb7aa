#include "common/status.h"

#include <stddef.h>

typedef struct {
    tdm_status_t status;
    const char *name;
    const char *message;
} status_entry_t;

static const status_entry_t status_table[] = {
    {TDM_OK, "TDM_OK", "ok"},
    {TDM_IN_PROGRESS, "TDM_IN_PROGRESS", "in progress"},
    {TDM_ERR_INVALID_ARG, "TDM_ERR_INVALID_ARG", "invalid argument"},
    {TDM_ERR_NO_MEMORY, "TDM_ERR_NO_MEMORY", "out of memory"},
    {TDM_ERR_NO_PAGES, "TDM_ERR_NO_PAGES", "kv pool exhausted"},
    {TDM_ERR_IO, "TDM_ERR_IO", "i/o error"},
    {TDM_ERR_FORMAT, "TDM_ERR_FORMAT", "malformed input"},
    {TDM_ERR_MISMATCH, "TDM_ERR_MISMATCH", "input does not match what was expected"},
    {TDM_ERR_NOT_FOUND, "TDM_ERR_NOT_FOUND", "not found"},
    {TDM_ERR_PEER_LOST, "TDM_ERR_PEER_LOST", "peer lost"},
    {TDM_ERR_UNSUPPORTED, "TDM_ERR_UNSUPPORTED", "unsupported"},
    {TDM_ERR_TIMEOUT, "TDM_ERR_TIMEOUT", "timed out"},
    {TDM_ERR_INTERNAL, "TDM_ERR_INTERNAL", "internal error"},
    {TDM_ERR_BUSY, "TDM_ERR_BUSY", "busy"},
};

static const status_entry_t *find_entry(tdm_status_t status)
{
    for (unsigned i = 0; i < sizeof(status_table) / sizeof(status_table[0]); i++) {
        if (status_table[i].status == status) {
            return &status_table[i];
        }
    }
    return NULL;
}

const char *tdm_status_name(tdm_status_t status)
{
    const status_entry_t *entry = find_entry(status);
    return entry != NULL ? entry->name : "TDM_ERR_UNKNOWN";
}

const char *tdm_status_message(tdm_status_t status)
{
    const status_entry_t *entry = find_entry(status);
    return entry != NULL ? entry->message : "unknown status";
}
