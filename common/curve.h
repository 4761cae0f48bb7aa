/* curve.h - CurveZMQ key files of the control plane: read, check and write them.
 *
 * Owns nothing but the parsing. A key file is czmq's certificate text (ZPL), so zcert files
 * work too:
 *     curve
 *         public-key = "<40 Z85 characters>"
 *         secret-key = "<40 Z85 characters>"     (only in the secret file)
 * `tandem keygen` writes NAME.key (both keys, mode 0600) and NAME.pub (the public key only). An
 * allow-list file holds public keys, one per line: a bare 40-character Z85 key or a
 * `public-key = "..."` line; blank lines and other lines starting with '#' are skipped. The
 * keys stay in Z85 text, as zmq_setsockopt(ZMQ_CURVE_*KEY) takes them. Knows nothing of ZeroMQ
 * sockets (no libzmq here); docs/DEPLOY.md "Security" says who holds which file.
 */
#ifndef TANDEM_COMMON_CURVE_H
#define TANDEM_COMMON_CURVE_H

#include <stddef.h>

#include "common/status.h"

/* Characters of a Z85-encoded 32-byte Curve25519 key (no NUL). */
#define TDM_CURVE_Z85_CHARS 40

/* A key pair in Z85 text (plain data; secret_z85 is "" when the file holds only a public key). */
typedef struct {
    char public_z85[TDM_CURVE_Z85_CHARS + 1];
    char secret_z85[TDM_CURVE_Z85_CHARS + 1];
} tdm_curve_keypair_t;

/*
 * tdm_curve_key_ok - 1 when `text` is exactly TDM_CURVE_Z85_CHARS Z85 characters, else 0.
 */
int tdm_curve_key_ok(const char *text);

/*
 * tdm_curve_keyfile_load - read the key file at `path` into *keys_out (public key required,
 * secret optional). Returns TDM_OK, TDM_ERR_NOT_FOUND / TDM_ERR_IO (unreadable),
 * TDM_ERR_FORMAT (no public key, or a key that is not 40 Z85 characters; the reason goes to err,
 * err_bytes may be 0) or TDM_ERR_NO_MEMORY. *keys_out is written only on success.
 */
tdm_status_t tdm_curve_keyfile_load(const char *path, tdm_curve_keypair_t *keys_out, char *err,
                                    size_t err_bytes);

/*
 * tdm_curve_allowlist_load - the public keys of the allow-list file at `path`: *keys_out is a
 * malloc'ed array of *n_out keys (caller frees with free()); an empty list is TDM_ERR_FORMAT.
 * Errors as tdm_curve_keyfile_load (the bad line's number goes to err).
 */
tdm_status_t tdm_curve_allowlist_load(const char *path, char (**keys_out)[TDM_CURVE_Z85_CHARS + 1],
                                      size_t *n_out, char *err, size_t err_bytes);

/*
 * tdm_curve_keyfile_write - write `keys` as a key file at `path` (replaced if it exists):
 * with_secret 1 writes both keys with mode 0600, 0 the public key only (mode 0644). Returns
 * TDM_OK, TDM_ERR_INVALID_ARG (a key is malformed, or with_secret without a secret) or
 * TDM_ERR_IO (logged with strerror).
 */
tdm_status_t tdm_curve_keyfile_write(const char *path, const tdm_curve_keypair_t *keys,
                                     int with_secret);

#endif
