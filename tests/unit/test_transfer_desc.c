/* test_transfer_desc.c - the pool descriptor wire form (transfer/desc.h) and the host-local
 * process identity it carries (transfer/proc.h). No UCX: descriptors are bytes here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/hash.h"
#include "transfer/desc.h"
#include "transfer/proc.h"

static const uint8_t ADDRESS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const uint8_t RKEY[] = {0xa, 0xb, 0xc, 0xd, 0xe};

static xfer_desc_t sample(void)
{
    xfer_desc_t desc;

    memset(&desc, 0, sizeof(desc));
    strcpy(desc.name, "decode-3");
    desc.incarnation_id = 0x1122334455667788ULL;
    desc.mem_type = XFER_MEM_HOST;
    desc.base_addr = 0x7f0000001000ULL;
    desc.page_size_bytes = 22848;
    desc.n_pages = 4096;
    desc.pool_bytes = 22848ULL * 4096;
    desc.pool_id = 7;
    desc.owner.host_id = 11;
    desc.owner.pid_ns = 12;
    desc.owner.start_ticks = 13;
    desc.owner.pid = 14;
    desc.worker_address = ADDRESS;
    desc.worker_address_bytes = sizeof(ADDRESS);
    desc.rkey = RKEY;
    desc.rkey_bytes = sizeof(RKEY);
    return desc;
}

static size_t encode(const xfer_desc_t *desc, uint8_t *buf, size_t cap)
{
    size_t n = 0;

    assert_int_equal(xfer_desc_encode(desc, buf, cap, &n), TDM_OK);
    assert_int_equal(n, xfer_desc_encoded_bytes(desc));
    return n;
}

static void test_descriptor_round_trips(void **state)
{
    xfer_desc_t desc = sample();
    xfer_desc_t back;
    uint8_t buf[512];
    size_t n;

    (void)state;
    n = encode(&desc, buf, sizeof(buf));
    assert_int_equal(n, XFER_DESC_HEADER_BYTES + sizeof(ADDRESS) + sizeof(RKEY) + 8);
    assert_memory_equal(buf, "TDXD", 4);
    assert_int_equal(xfer_desc_parse(buf, n, &back), TDM_OK);
    assert_string_equal(back.name, "decode-3");
    assert_true(back.incarnation_id == desc.incarnation_id);
    assert_true(back.base_addr == desc.base_addr);
    assert_true(back.pool_bytes == desc.pool_bytes);
    assert_int_equal(back.page_size_bytes, 22848);
    assert_int_equal(back.n_pages, 4096);
    assert_int_equal(back.pool_id, 7);
    assert_int_equal(back.mem_type, XFER_MEM_HOST);
    assert_memory_equal(&back.owner, &desc.owner, sizeof(desc.owner));
    assert_int_equal(back.worker_address_bytes, sizeof(ADDRESS));
    assert_memory_equal(back.worker_address, ADDRESS, sizeof(ADDRESS));
    assert_ptr_equal(back.worker_address, buf + XFER_DESC_HEADER_BYTES); /* borrowed */
    assert_int_equal(back.rkey_bytes, sizeof(RKEY));
    assert_memory_equal(back.rkey, RKEY, sizeof(RKEY));
}

static void test_descriptor_encode_rejects_bad_fields_and_writes_nothing(void **state)
{
    uint8_t buf[512];
    uint8_t untouched[512];
    size_t n = 123;
    xfer_desc_t desc;

    (void)state;
    memset(buf, 0x5a, sizeof(buf));
    memcpy(untouched, buf, sizeof(buf));

    desc = sample();
    desc.name[0] = '\0';
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    memset(desc.name, 'x', sizeof(desc.name)); /* no NUL */
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    desc.incarnation_id = 0;
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    desc.pool_bytes += 1;
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    desc.mem_type = (xfer_mem_type_t)9;
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    desc.rkey_bytes = XFER_DESC_MAX_BLOB_BYTES + 1;
    assert_int_equal(xfer_desc_encode(&desc, buf, sizeof(buf), &n), TDM_ERR_INVALID_ARG);
    desc = sample();
    assert_int_equal(xfer_desc_encode(&desc, buf, xfer_desc_encoded_bytes(&desc) - 1, &n),
                     TDM_ERR_INVALID_ARG);
    assert_memory_equal(buf, untouched, sizeof(buf));
    assert_int_equal(n, 123);
}

static void test_descriptor_parse_errors_leave_output_untouched(void **state)
{
    xfer_desc_t desc = sample();
    xfer_desc_t out;
    xfer_desc_t zero;
    uint8_t buf[512];
    uint8_t bad[512];
    size_t n;

    (void)state;
    n = encode(&desc, buf, sizeof(buf));
    memset(&out, 0, sizeof(out));
    memset(&zero, 0, sizeof(zero));

    assert_int_equal(xfer_desc_parse(NULL, n, &out), TDM_ERR_FORMAT);
    assert_int_equal(xfer_desc_parse(buf, 20, &out), TDM_ERR_FORMAT);    /* truncated */
    assert_int_equal(xfer_desc_parse(buf, n - 1, &out), TDM_ERR_FORMAT); /* length */
    memcpy(bad, buf, n);
    bad[0] = 'X';
    assert_int_equal(xfer_desc_parse(bad, n, &out), TDM_ERR_FORMAT); /* magic */
    memcpy(bad, buf, n);
    bad[4] = 2;
    assert_int_equal(xfer_desc_parse(bad, n, &out), TDM_ERR_UNSUPPORTED); /* version */
    for (size_t i = 8; i < n; i += 7) {
        memcpy(bad, buf, n);
        bad[i] ^= 0x10;
        if (i == 44 || i == 46) {
            continue; /* a length byte: that is a length error, checked above */
        }
        assert_int_equal(xfer_desc_parse(bad, n, &out), TDM_ERR_MISMATCH); /* any bit flip */
    }
    assert_memory_equal(&out, &zero, sizeof(out));
}

static void test_descriptor_parse_checks_fields_under_a_valid_checksum(void **state)
{
    xfer_desc_t desc = sample();
    xfer_desc_t out;
    uint8_t buf[512];
    size_t n;
    size_t good;

    (void)state;
    /* An encoder that skipped validation: build bytes whose checksum is right but whose
     * geometry is not, by encoding a valid descriptor then patching and re-summing. */
    n = encode(&desc, buf, sizeof(buf));
    good = n;
    buf[36] = buf[37] = buf[38] = buf[39] = 0; /* n_pages = 0 */
    {
        uint64_t sum = tdm_hash_xxh3_64(buf, good - 8);

        for (int i = 0; i < 8; i++) {
            buf[good - 8 + i] = (uint8_t)(sum >> (8 * i));
        }
    }
    assert_int_equal(xfer_desc_parse(buf, good, &out), TDM_ERR_FORMAT);
}

static void test_proc_identity_of_self_and_of_a_dead_child(void **state)
{
    xfer_proc_id_t self;
    xfer_proc_id_t child_id;
    xfer_proc_id_t other_host;
    int fds[2];
    pid_t pid;

    (void)state;
    xfer_proc_id_self(&self);
    assert_true(self.pid == (uint32_t)getpid());
    assert_true(self.start_ticks != 0);
    assert_true(self.host_id != 0);
    assert_true(xfer_proc_id_comparable(&self, &self));
    assert_int_equal(xfer_proc_check(&self), TDM_OK);

    other_host = self;
    other_host.host_id ^= 1;
    assert_false(xfer_proc_id_comparable(&self, &other_host));

    /* A child reports its identity, exits, and is reaped: then it is gone. */
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        xfer_proc_id_t mine;

        xfer_proc_id_self(&mine);
        _exit(write(fds[1], &mine, sizeof(mine)) == (ssize_t)sizeof(mine) ? 0 : 1);
    }
    assert_int_equal(read(fds[0], &child_id, sizeof(child_id)), sizeof(child_id));
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    close(fds[0]);
    close(fds[1]);
    assert_true(xfer_proc_id_comparable(&self, &child_id));
    assert_int_equal(xfer_proc_check(&child_id), TDM_ERR_PEER_LOST);

    /* Our own pid with another start time is a reused pid: gone too. */
    child_id = self;
    child_id.start_ticks += 1;
    assert_int_equal(xfer_proc_check(&child_id), TDM_ERR_PEER_LOST);
    child_id.start_ticks = 0;
    assert_int_equal(xfer_proc_check(&child_id), TDM_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor_round_trips),
        cmocka_unit_test(test_descriptor_encode_rejects_bad_fields_and_writes_nothing),
        cmocka_unit_test(test_descriptor_parse_errors_leave_output_untouched),
        cmocka_unit_test(test_descriptor_parse_checks_fields_under_a_valid_checksum),
        cmocka_unit_test(test_proc_identity_of_self_and_of_a_dead_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
