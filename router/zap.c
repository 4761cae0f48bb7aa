/* zap.c - ZAP handler of the control plane's CURVE authentication (zap.h). */
#include "router/zap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"

#define ZAP_ENDPOINT  "inproc://zeromq.zap.01"
#define ZAP_POLL_MS   100
#define ZAP_FRAMES    7 /* version, request id, domain, address, identity, mechanism, key */
#define ZAP_FRAME_MAX 256
#define KEY_BYTES     32

struct router_zap {
    void *sock;
    pthread_t thread;
    atomic_int stop;
    uint8_t (*keys)[KEY_BYTES];
    size_t n_keys;
};

/* 1 when the 32-byte key is on the list (every entry compared). */
static int allowed(const router_zap_t *z, const uint8_t *key)
{
    unsigned diff_all = 1;

    for (size_t i = 0; i < z->n_keys; i++) {
        unsigned diff = 0;
        for (size_t b = 0; b < KEY_BYTES; b++) {
            diff |= (unsigned)(z->keys[i][b] ^ key[b]);
        }
        diff_all &= diff != 0;
    }
    return diff_all == 0;
}

/* Answer one request (frames read already). */
static void reply(void *sock, const char *request_id, size_t n_request_id, int ok)
{
    zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(sock, request_id, n_request_id, ZMQ_SNDMORE);
    zmq_send(sock, ok ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(sock, ok ? "OK" : "worker key not allowed", ok ? 2 : 22, ZMQ_SNDMORE);
    zmq_send(sock, "", 0, ZMQ_SNDMORE); /* user id */
    zmq_send(sock, "", 0, 0);           /* metadata */
}

static void serve_one(router_zap_t *z)
{
    char frames[ZAP_FRAMES][ZAP_FRAME_MAX];
    int sizes[ZAP_FRAMES] = {0};
    int n = 0;
    int more = 1;
    size_t more_bytes = sizeof(more);
    int ok;

    while (more) {
        char scratch[ZAP_FRAME_MAX];
        int got = zmq_recv(z->sock, n < ZAP_FRAMES ? frames[n] : scratch, ZAP_FRAME_MAX, 0);
        if (got < 0) {
            return;
        }
        if (n < ZAP_FRAMES) {
            sizes[n] = got > ZAP_FRAME_MAX ? ZAP_FRAME_MAX : got;
        }
        n++;
        if (zmq_getsockopt(z->sock, ZMQ_RCVMORE, &more, &more_bytes) != 0) {
            more = 0;
        }
    }
    if (n < 2) {
        return; /* not a ZAP request; a REP socket must still answer something */
    }
    ok = n == ZAP_FRAMES && sizes[0] == 3 && memcmp(frames[0], "1.0", 3) == 0 && sizes[5] == 5 &&
         memcmp(frames[5], "CURVE", 5) == 0 && sizes[6] == KEY_BYTES &&
         allowed(z, (const uint8_t *)frames[6]);
    if (!ok) {
        char z85[TDM_CURVE_Z85_CHARS + 1] = "";
        if (n == ZAP_FRAMES && sizes[6] == KEY_BYTES) {
            zmq_z85_encode(z85, (const uint8_t *)frames[6], KEY_BYTES);
        }
        tdm_log(TDM_LOG_WARN, "zap", "control connection refused: address=%.*s public_key=%s",
                n > 3 ? sizes[3] : 0, n > 3 ? frames[3] : "", z85);
    }
    reply(z->sock, frames[1], (size_t)sizes[1], ok);
}

static void *zap_main(void *arg)
{
    router_zap_t *z = arg;

    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t item = {z->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, ZAP_POLL_MS) > 0 && (item.revents & ZMQ_POLLIN) != 0) {
            serve_one(z);
        }
    }
    return NULL;
}

tdm_status_t router_zap_start(void *zctx, const char (*keys)[TDM_CURVE_Z85_CHARS + 1],
                              size_t n_keys, router_zap_t **zap_out)
{
    router_zap_t *z;
    int zero = 0;
    tdm_status_t status;

    if (zctx == NULL || keys == NULL || n_keys == 0 || zap_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    z = calloc(1, sizeof(*z));
    if (z == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    z->keys = calloc(n_keys, sizeof(*z->keys));
    if (z->keys == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free;
    }
    for (size_t i = 0; i < n_keys; i++) {
        if (!tdm_curve_key_ok(keys[i]) || zmq_z85_decode(z->keys[i], keys[i]) == NULL) {
            status = TDM_ERR_INVALID_ARG;
            goto err_free_keys;
        }
    }
    z->n_keys = n_keys;
    z->sock = zmq_socket(zctx, ZMQ_REP);
    if (z->sock == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto err_free_keys;
    }
    zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
        tdm_log(TDM_LOG_ERROR, "zap", "cannot bind %s: %s", ZAP_ENDPOINT, zmq_strerror(errno));
        status = TDM_ERR_IO;
        goto err_close;
    }
    atomic_init(&z->stop, 0);
    if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
        status = TDM_ERR_NO_MEMORY;
        goto err_close;
    }
    *zap_out = z;
    return TDM_OK;

err_close:
    zmq_close(z->sock);
err_free_keys:
    free(z->keys);
err_free:
    free(z);
    return status;
}

void router_zap_stop(router_zap_t *zap)
{
    if (zap == NULL) {
        return;
    }
    atomic_store(&zap->stop, 1);
    pthread_join(zap->thread, NULL);
    zmq_close(zap->sock);
    memset(zap->keys, 0, zap->n_keys * sizeof(*zap->keys));
    free(zap->keys);
    free(zap);
}
