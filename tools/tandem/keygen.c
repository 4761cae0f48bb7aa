/* keygen.c - `tandem keygen`: the keys of a secured cluster (docs/DEPLOY.md "Security").
 *
 *   tandem keygen --curve OUT/NAME   CurveZMQ key pair: OUT/NAME.key (public and secret key,
 *                                    mode 0600) and OUT/NAME.pub (public key only); the router's
 *                                    .pub goes to every worker (--curve-router-key), each
 *                                    worker's public key onto the router's --curve-workers list
 *   tandem keygen --api-key [NAME]   one API key line for --api-keys-file on stdout:
 *                                    "tdm-<43 base64url characters> name=NAME" (256 random bits)
 *
 * Keys come from libzmq's zmq_curve_keypair (libsodium) and OpenSSL's RAND_bytes.
 */
#include "keygen.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "common/curve.h"

#define KEYGEN_PATH_BYTES 4096
#define API_KEY_RANDOM    32

static int usage(FILE *out)
{
    fprintf(out, "usage: tandem keygen --curve OUT/NAME   (writes OUT/NAME.key and OUT/NAME.pub)\n"
                 "       tandem keygen --api-key [NAME]   (prints one --api-keys-file line)\n");
    return out == stdout ? 0 : 2;
}

static int curve_pair(const char *base)
{
    tdm_curve_keypair_t keys;
    char path[KEYGEN_PATH_BYTES];
    int rc = 0;

    memset(&keys, 0, sizeof(keys));
    if (zmq_curve_keypair(keys.public_z85, keys.secret_z85) != 0) {
        fprintf(stderr, "tandem keygen: libzmq has no CURVE support (built without libsodium)\n");
        return 1;
    }
    snprintf(path, sizeof(path), "%s.key", base);
    if (tdm_curve_keyfile_write(path, &keys, 1) != TDM_OK) {
        fprintf(stderr, "tandem keygen: cannot write %s\n", path);
        rc = 1;
    }
    snprintf(path, sizeof(path), "%s.pub", base);
    if (rc == 0 && tdm_curve_keyfile_write(path, &keys, 0) != TDM_OK) {
        fprintf(stderr, "tandem keygen: cannot write %s\n", path);
        rc = 1;
    }
    if (rc == 0) {
        printf("%s\n", keys.public_z85);
    }
    OPENSSL_cleanse(&keys, sizeof(keys));
    return rc;
}

static int api_key(const char *name)
{
    static const char B64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char random[API_KEY_RANDOM + 1] = {0};
    char key[64];
    size_t n = 0;

    if (RAND_bytes(random, API_KEY_RANDOM) != 1) {
        fprintf(stderr, "tandem keygen: no random bytes\n");
        return 1;
    }
    /* 6 bits per character over 256 bits: 43 characters. */
    for (size_t bit = 0; bit < API_KEY_RANDOM * 8; bit += 6) {
        size_t byte = bit / 8;
        unsigned v = ((unsigned)random[byte] << 8 | random[byte + 1]) >> (10 - bit % 8);
        key[n++] = B64URL[v & 63];
    }
    key[n] = '\0';
    printf("tdm-%s%s%s\n", key, name != NULL ? " name=" : "", name != NULL ? name : "");
    OPENSSL_cleanse(random, sizeof(random));
    OPENSSL_cleanse(key, sizeof(key));
    return 0;
}

int tandem_keygen_main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        return usage(stdout);
    }
    if (argc == 3 && strcmp(argv[1], "--curve") == 0 && argv[2][0] != '\0') {
        return curve_pair(argv[2]);
    }
    if ((argc == 2 || argc == 3) && strcmp(argv[1], "--api-key") == 0) {
        return api_key(argc == 3 ? argv[2] : NULL);
    }
    return usage(stderr);
}
