#include "common/fdio.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FDIO_LOG "common"

/* Moves n_bytes between fd and p (reads into p, or writes from it) until all have gone. */
static tdm_status_t move_all(int fd, uint8_t *p, size_t n_bytes, int writing)
{
    while (n_bytes > 0) {
        ssize_t n = writing ? write(fd, p, n_bytes) : read(fd, p, n_bytes);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return TDM_ERR_IO;
        }
        p += n;
        n_bytes -= (size_t)n;
    }
    return TDM_OK;
}

tdm_status_t tdm_fd_write_all(int fd, const void *buf, size_t n_bytes)
{
    return move_all(fd, (uint8_t *)buf, n_bytes, 1); /* write() only reads buf */
}

tdm_status_t tdm_fd_read_all(int fd, void *buf, size_t n_bytes)
{
    return move_all(fd, buf, n_bytes, 0);
}

tdm_status_t tdm_spawn_self(char *const argv[], pid_t *pid_out, int *sock_out)
{
    int fds[2];
    pid_t pid;

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
        tdm_log(TDM_LOG_ERROR, FDIO_LOG, "socketpair failed: %s", strerror(errno));
        return TDM_ERR_IO;
    }
    pid = fork();
    if (pid < 0) {
        tdm_log(TDM_LOG_ERROR, FDIO_LOG, "fork failed: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return TDM_ERR_IO;
    }
    if (pid == 0) {
        /* The child keeps only stdio and its socket. */
        if (dup2(fds[1], TDM_SPAWN_CHILD_FD) != TDM_SPAWN_CHILD_FD) {
            _exit(126);
        }
        close_range(TDM_SPAWN_CHILD_FD + 1, ~0u, 0);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    *pid_out = pid;
    *sock_out = fds[0];
    return TDM_OK;
}
