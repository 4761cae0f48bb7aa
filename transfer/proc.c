#include "transfer/proc.h"

#include "common/hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAT_BYTES                 1024
#define STARTTIME_FIELD_AFTER_COMM 20 /* field 22 of /proc/<pid>/stat; state is field 3 */

/* Read /proc/<pid>/stat: the state letter and the start time. Returns 0, or an errno. */
static int read_stat(uint32_t pid, char *state_out, uint64_t *start_ticks_out)
{
    char path[64];
    char text[STAT_BYTES];
    FILE *f;
    size_t n;
    const char *p;
    unsigned field = 1;

    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return errno;
    }
    n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    p = strrchr(text, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL || p[1] != ' ') {
        return EINVAL;
    }
    p += 2;
    *state_out = *p;
    while (*p != '\0' && field < STARTTIME_FIELD_AFTER_COMM) {
        if (*p == ' ') {
            field++;
        }
        p++;
    }
    if (field != STARTTIME_FIELD_AFTER_COMM) {
        return EINVAL;
    }
    *start_ticks_out = strtoull(p, NULL, 10);
    return 0;
}

void xfer_proc_id_self(xfer_proc_id_t *id_out)
{
    xfer_proc_id_t id;
    char boot_id[64];
    struct stat st;
    FILE *f;
    char state = '?';

    memset(&id, 0, sizeof(id));
    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        size_t n = fread(boot_id, 1, sizeof(boot_id), f);

        fclose(f);
        if (n > 0) {
            id.host_id = tdm_hash_xxh3_64(boot_id, n);
        }
    }
    if (stat("/proc/self/ns/pid", &st) == 0) {
        id.pid_ns = (uint64_t)st.st_ino;
    }
    id.pid = (uint32_t)getpid();
    if (read_stat(id.pid, &state, &id.start_ticks) != 0) {
        id.start_ticks = 0;
    }
    *id_out = id;
}

int xfer_proc_id_comparable(const xfer_proc_id_t *self, const xfer_proc_id_t *other)
{
    return self->host_id != 0 && self->pid_ns != 0 && other->pid != 0 && other->start_ticks != 0 &&
           self->host_id == other->host_id && self->pid_ns == other->pid_ns;
}

tdm_status_t xfer_proc_check(const xfer_proc_id_t *id)
{
    char state = '?';
    uint64_t start_ticks = 0;
    int err;

    if (id->pid == 0 || id->start_ticks == 0) {
        return TDM_ERR_UNSUPPORTED;
    }
    err = read_stat(id->pid, &state, &start_ticks);
    if (err == ENOENT || err == ESRCH) {
        return TDM_ERR_PEER_LOST;
    }
    if (err != 0) {
        return TDM_ERR_UNSUPPORTED;
    }
    if (start_ticks != id->start_ticks || state == 'Z' || state == 'X') {
        return TDM_ERR_PEER_LOST;
    }
    return TDM_OK;
}
