/* zap.h - the control plane's ZeroMQ authentication handler (ZAP, ZeroMQ RFC 27) for CURVE.
 *
 * Owns a thread and a REP socket bound to inproc://zeromq.zap.01 in the control plane's ZeroMQ
 * context, and the allow-list of worker public keys (binary, decoded once). libzmq asks it about
 * every CURVE handshake on that context's sockets that set a ZAP domain: a client whose
 * long-term public key is on the list gets "200", any other "400", so an unknown worker never
 * completes the handshake and cannot send Register. Knows nothing of the protocol above ZeroMQ.
 */
#ifndef TANDEM_ROUTER_ZAP_H
#define TANDEM_ROUTER_ZAP_H

#include <stddef.h>

#include "common/curve.h"
#include "common/status.h"

/* The handler; opaque. */
typedef struct router_zap router_zap_t;

/*
 * router_zap_start - bind the ZAP endpoint in `zctx` (borrowed; must outlive the handler) and
 * serve it with the n_keys Z85 public keys of `keys` (copied). Call before any CURVE server
 * socket of zctx accepts connections. Returns TDM_OK, TDM_ERR_INVALID_ARG (no keys, or one is not
 * Z85), TDM_ERR_IO (the endpoint cannot be bound: another handler runs) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_zap_start(void *zctx, const char (*keys)[TDM_CURVE_Z85_CHARS + 1],
                              size_t n_keys, router_zap_t **zap_out);

/* router_zap_stop - stop the thread, close its socket and free. Accepts NULL. Call before
 * zmq_ctx_term of its context. */
void router_zap_stop(router_zap_t *zap);

#endif
