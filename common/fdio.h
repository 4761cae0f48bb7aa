/* fdio.h - whole-buffer reads and writes on a file descriptor (a pipe or a socket), and a child
 * process that runs this executable again and talks to its parent over a socket.
 *
 * Used by the two-process harnesses (tandem-bench-transfer's receiver, the transfer tests'
 * child): the parent sends and receives fixed-size records with tdm_fd_write_all and
 * tdm_fd_read_all. Owns no memory; the descriptors are the caller's.
 */
#ifndef TANDEM_COMMON_FDIO_H
#define TANDEM_COMMON_FDIO_H

#include <stddef.h>
#include <sys/types.h>

#include "common/status.h"

/* The descriptor the child of tdm_spawn_self finds its socket on. */
#define TDM_SPAWN_CHILD_FD 3

/*
 * tdm_fd_write_all - write all n_bytes of buf to fd, retrying short writes and EINTR.
 *
 * Returns TDM_OK, or TDM_ERR_IO when a write fails or writes nothing (errno says why; part of
 * buf may have gone). Blocks while fd does. Logs nothing: the caller knows what the bytes were.
 */
tdm_status_t tdm_fd_write_all(int fd, const void *buf, size_t n_bytes);

/*
 * tdm_fd_read_all - read exactly n_bytes from fd into buf, retrying short reads and EINTR.
 *
 * Returns TDM_OK, or TDM_ERR_IO when a read fails or fd ends first (buf then holds what came).
 * Blocks while fd does. Logs nothing.
 */
tdm_status_t tdm_fd_read_all(int fd, void *buf, size_t n_bytes);

/*
 * tdm_spawn_self - start this executable (/proc/self/exe) again with argv (argv[0] first, NULL
 * last), connected to the caller by a socket pair.
 *
 * The child keeps stdin, stdout and stderr, finds its end of the socket as TDM_SPAWN_CHILD_FD and
 * no other descriptor; it exits 126 when it cannot place the socket and 127 when exec fails. The
 * parent gets the child's pid in *pid_out and its own end of the socket (close-on-exec) in
 * *sock_out; it reaps the child and closes the socket.
 *
 * Returns TDM_OK, or TDM_ERR_IO when the socket pair or the fork fails (logged with errno's
 * text; nothing is left open and the outputs are untouched).
 */
tdm_status_t tdm_spawn_self(char *const argv[], pid_t *pid_out, int *sock_out);

#endif
