/* peers.c - the other routers and the replicas sent to them (peers.h). */
#include "router/peers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "router/ring.h"

#define PEERS_HWM 10000

typedef struct {
    char id[ROUTER_RING_ID_BYTES + 1];
    char endpoint[256];
    void *sock;
} peer_t;

struct router_peers {
    char self[ROUTER_RING_ID_BYTES + 1];
    router_ring_t *ring;
    peer_t peers[ROUTER_RING_MAX_MEMBERS];
    size_t n_peers;
    uint64_t send_failures;
};

static tdm_status_t open_peer(void *zctx, const char *self, const tdm_curve_keypair_t *curve,
                              peer_t *p, char *err, size_t n_err)
{
    char routing_id[ROUTER_RING_ID_BYTES + sizeof(ROUTER_PEERS_ID_PREFIX)];
    int one = 1;
    int zero = 0;
    int hwm = PEERS_HWM;
    int64_t max_bytes = PROTO_MAX_MESSAGE_BYTES;

    p->sock = zmq_socket(zctx, ZMQ_DEALER);
    if (p->sock == NULL) {
        snprintf(err, n_err, "peer %s: socket: %s", p->id, zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    snprintf(routing_id, sizeof(routing_id), "%s%s", ROUTER_PEERS_ID_PREFIX, self);
    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, routing_id, strlen(routing_id));
    zmq_setsockopt(p->sock, ZMQ_IMMEDIATE, &one, sizeof(one));
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(p->sock, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes));
    if (curve != NULL && (zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, curve->public_z85,
                                         TDM_CURVE_Z85_CHARS + 1) != 0 ||
                          zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, curve->public_z85,
                                         TDM_CURVE_Z85_CHARS + 1) != 0 ||
                          zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, curve->secret_z85,
                                         TDM_CURVE_Z85_CHARS + 1) != 0)) {
        snprintf(err, n_err, "peer %s: CURVE: %s", p->id, zmq_strerror(errno));
        return TDM_ERR_IO;
    }
    if (zmq_connect(p->sock, p->endpoint) != 0) {
        snprintf(err, n_err, "peer %s: connect %s: %s", p->id, p->endpoint, zmq_strerror(errno));
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

/* Parse one "ID=ENDPOINT" entry [text, text + n) into p. */
static tdm_status_t parse_entry(const char *text, size_t n, peer_t *p, char *err, size_t n_err)
{
    const char *eq = memchr(text, '=', n);
    size_t n_id = eq != NULL ? (size_t)(eq - text) : 0;
    size_t n_ep = eq != NULL ? n - n_id - 1 : 0;

    if (eq == NULL || n_id == 0 || n_id > ROUTER_RING_ID_BYTES || n_ep == 0 ||
        n_ep >= sizeof(p->endpoint)) {
        snprintf(err, n_err, "--peers entry '%.*s' is not ID=ENDPOINT", (int)(n < 200 ? n : 200),
                 text);
        return TDM_ERR_INVALID_ARG;
    }
    memcpy(p->id, text, n_id);
    p->id[n_id] = '\0';
    memcpy(p->endpoint, eq + 1, n_ep);
    p->endpoint[n_ep] = '\0';
    return TDM_OK;
}

tdm_status_t router_peers_create(void *zctx, const char *self_id, const char *spec,
                                 const tdm_curve_keypair_t *curve, router_peers_t **peers_out,
                                 char *err, size_t err_bytes)
{
    router_peers_t *ps;
    tdm_status_t status;
    const char *at = spec != NULL ? spec : "";

    if (zctx == NULL || self_id == NULL || peers_out == NULL) {
        snprintf(err, err_bytes, "no context or router id");
        return TDM_ERR_INVALID_ARG;
    }
    if (strlen(at) >= ROUTER_PEERS_SPEC_BYTES) {
        snprintf(err, err_bytes, "--peers is longer than %d bytes", ROUTER_PEERS_SPEC_BYTES);
        return TDM_ERR_INVALID_ARG;
    }
    ps = calloc(1, sizeof(*ps));
    if (ps == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    snprintf(ps->self, sizeof(ps->self), "%s", self_id);
    status = router_ring_create(&ps->ring);
    if (status == TDM_OK) {
        status = router_ring_add(ps->ring, self_id);
        if (status == TDM_ERR_INVALID_ARG) {
            snprintf(err, err_bytes, "router id '%s' is not 1..%d printable bytes", self_id,
                     ROUTER_RING_ID_BYTES);
        }
    }
    while (status == TDM_OK && *at != '\0') {
        const char *comma = strchr(at, ',');
        size_t n = comma != NULL ? (size_t)(comma - at) : strlen(at);
        peer_t *p = &ps->peers[ps->n_peers];

        if (n > 0) {
            if (ps->n_peers + 1 >= ROUTER_RING_MAX_MEMBERS) {
                snprintf(err, err_bytes, "more than %d routers", ROUTER_RING_MAX_MEMBERS);
                status = TDM_ERR_INVALID_ARG;
                break;
            }
            status = parse_entry(at, n, p, err, err_bytes);
            if (status == TDM_OK && strcmp(p->id, self_id) != 0) {
                status = router_ring_add(ps->ring, p->id);
                if (status == TDM_ERR_INVALID_ARG) {
                    snprintf(err, err_bytes, "--peers id '%s' is bad or repeated", p->id);
                }
                if (status == TDM_OK) {
                    ps->n_peers++;
                    status = open_peer(zctx, self_id, curve, p, err, err_bytes);
                }
            }
        }
        at += n + (comma != NULL);
    }
    if (status != TDM_OK) {
        router_peers_destroy(ps);
        return status;
    }
    for (size_t i = 0; i < ps->n_peers; i++) {
        tdm_log(TDM_LOG_INFO, "peers", "peer router: id=%s endpoint=%s", ps->peers[i].id,
                ps->peers[i].endpoint);
    }
    *peers_out = ps;
    return TDM_OK;
}

void router_peers_destroy(router_peers_t *peers)
{
    if (peers == NULL) {
        return;
    }
    for (size_t i = 0; i < peers->n_peers; i++) {
        if (peers->peers[i].sock != NULL) {
            zmq_close(peers->peers[i].sock);
        }
    }
    router_ring_destroy(peers->ring);
    free(peers);
}

size_t router_peers_count(const router_peers_t *peers)
{
    return peers->n_peers;
}

const char *router_peers_owner(const router_peers_t *peers, const char *session_id,
                               int *is_self_out)
{
    const char *owner[1] = {peers->self};

    router_ring_owners(peers->ring, router_ring_key(session_id), owner, 1);
    if (is_self_out != NULL) {
        *is_self_out = strcmp(owner[0], peers->self) == 0;
    }
    return owner[0];
}

static peer_t *peer_named(router_peers_t *peers, const char *id)
{
    for (size_t i = 0; i < peers->n_peers; i++) {
        if (strcmp(peers->peers[i].id, id) == 0) {
            return &peers->peers[i];
        }
    }
    return NULL;
}

size_t router_peers_replicate(router_peers_t *peers, const Tandem__SessionReplica *replica)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    const char *owners[2];
    size_t n_owners;
    size_t n_sent = 0;
    uint8_t *buf = NULL;
    size_t n_bytes = 0;

    if (peers->n_peers == 0) {
        return 0;
    }
    n_owners = router_ring_owners(peers->ring, router_ring_key(replica->session_id), owners, 2);
    env.protocol_version = PROTO_VERSION;
    env.body_case = TANDEM__ENVELOPE__BODY_SESSION_REPLICA;
    env.session_replica = (Tandem__SessionReplica *)replica;
    if (proto_pack(&env, &buf, &n_bytes) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "peers", "replica not packed: session=%s", replica->session_id);
        return 0;
    }
    for (size_t i = 0; i < n_owners; i++) {
        peer_t *p = peer_named(peers, owners[i]);
        if (p == NULL) {
            continue; /* this router */
        }
        if (zmq_send(p->sock, buf, n_bytes, ZMQ_DONTWAIT) < 0) {
            peers->send_failures++;
            tdm_log(TDM_LOG_DEBUG, "peers", "replica not sent: peer=%s session=%s error=\"%s\"",
                    p->id, replica->session_id, zmq_strerror(errno));
        } else {
            n_sent++;
        }
    }
    free(buf);
    return n_sent;
}

uint64_t router_peers_send_failures(const router_peers_t *peers)
{
    return peers->send_failures;
}

void router_peers_drain(router_peers_t *peers)
{
    char junk[256];

    for (size_t i = 0; i < peers->n_peers; i++) {
        while (zmq_recv(peers->peers[i].sock, junk, sizeof(junk), ZMQ_DONTWAIT) >= 0) {
        }
    }
}
