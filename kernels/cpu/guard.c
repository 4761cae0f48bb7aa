/* guard.c - the guard kernel table (kernels/guard.h): the CPU kernels over one mprotect'ed
 * region that is readable only while an op runs. */
#include "kernels/guard.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD_ALIGN 64
/* Function members of kern_ops_t that kern_guard_create wraps (SET below, attention_sel,
 * attention_rows) or
 * passes through (host_unregister, ahead_wait, ahead_free: they touch no backend memory): a
 * member added to the table must be wrapped here too. */
#define GUARD_N_MEMBERS 47
_Static_assert(sizeof(kern_ops_t) == 2 * sizeof(void *) + GUARD_N_MEMBERS * sizeof(void (*)(void)),
               "kern_ops_t changed: wrap the new member in kernels/cpu/guard.c");

/* One block of the region: [off, off + len), in use or free. Sorted by off, covering it all. */
typedef struct {
    size_t off;
    size_t len;
    int used;
} guard_block_t;

static struct {
    int live;
    unsigned char *base; /* the mmap'd region */
    size_t bytes;
    int depth; /* nested op calls: the region is open while depth > 0 */
    guard_block_t *blocks;
    size_t n_blocks;
    size_t cap_blocks;
    size_t used_bytes;
    kern_ops_t cpu;   /* the wrapped table */
    kern_ops_t table; /* what kern_guard_create hands out */
    int report;       /* kern_guard_report: print and go on instead of faulting */
    size_t n_reports;
    struct sigaction old_segv;
} g;

/* The sanitizer runtime's symbolized stack printer when linked in (weak: NULL otherwise). */
extern void __sanitizer_print_stack_trace(void) __attribute__((weak));

static void print_stack(void)
{
    if (__sanitizer_print_stack_trace != NULL) {
        __sanitizer_print_stack_trace();
    }
}

static void guard_protect(int prot)
{
    if (mprotect(g.base, g.bytes, prot) != 0) {
        perror("guard: mprotect");
        abort();
    }
}

static void guard_open(void)
{
    if (g.depth++ == 0) {
        guard_protect(PROT_READ | PROT_WRITE);
    }
}

static void guard_close(void)
{
    if (--g.depth == 0) {
        guard_protect(PROT_NONE);
    }
}

int kern_guard_contains(const void *p, size_t n_bytes)
{
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)g.base;
    return g.live && p != NULL && a >= lo && a - lo <= g.bytes && n_bytes <= g.bytes - (a - lo);
}

size_t kern_guard_used(void)
{
    return g.used_bytes;
}

/* Insert a block at index i (grows the host-side list). 0 on success. */
static int block_insert(size_t i, guard_block_t b)
{
    if (g.n_blocks == g.cap_blocks) {
        size_t cap = g.cap_blocks * 2;
        guard_block_t *grown = realloc(g.blocks, cap * sizeof(*grown));
        if (grown == NULL) {
            return -1;
        }
        g.blocks = grown;
        g.cap_blocks = cap;
    }
    memmove(&g.blocks[i + 1], &g.blocks[i], (g.n_blocks - i) * sizeof(*g.blocks));
    g.blocks[i] = b;
    g.n_blocks++;
    return 0;
}

static void block_remove(size_t i)
{
    memmove(&g.blocks[i], &g.blocks[i + 1], (g.n_blocks - i - 1) * sizeof(*g.blocks));
    g.n_blocks--;
}

/* First fit; the remainder of the chosen free block stays free after it. */
static tdm_status_t guard_mem_alloc(kern_ctx_t *ctx, size_t n_bytes, void **ptr_out)
{
    size_t len = (n_bytes + GUARD_ALIGN - 1) / GUARD_ALIGN * GUARD_ALIGN;

    (void)ctx;
    if (ptr_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (len < n_bytes) {
        return TDM_ERR_NO_MEMORY;
    }
    if (len == 0) {
        len = GUARD_ALIGN; /* a distinct, freeable pointer */
    }
    for (size_t i = 0; i < g.n_blocks; i++) {
        guard_block_t *b = &g.blocks[i];
        if (b->used || b->len < len) {
            continue;
        }
        if (b->len > len) {
            guard_block_t rest = {b->off + len, b->len - len, 0};
            if (block_insert(i + 1, rest) != 0) {
                return TDM_ERR_NO_MEMORY;
            }
            b = &g.blocks[i];
            b->len = len;
        }
        b->used = 1;
        g.used_bytes += len;
        *ptr_out = g.base + b->off;
        return TDM_OK;
    }
    return TDM_ERR_NO_MEMORY;
}

static void guard_mem_free(kern_ctx_t *ctx, void *ptr)
{
    size_t off;

    (void)ctx;
    if (ptr == NULL) {
        return;
    }
    if (!kern_guard_contains(ptr, 1)) {
        fprintf(stderr, "guard: mem_free of %p, not guard memory\n", ptr);
        abort();
    }
    off = (size_t)((unsigned char *)ptr - g.base);
    for (size_t i = 0; i < g.n_blocks; i++) {
        if (g.blocks[i].off != off || !g.blocks[i].used) {
            continue;
        }
        g.blocks[i].used = 0;
        g.used_bytes -= g.blocks[i].len;
        if (i + 1 < g.n_blocks && !g.blocks[i + 1].used) {
            g.blocks[i].len += g.blocks[i + 1].len;
            block_remove(i + 1);
        }
        if (i > 0 && !g.blocks[i - 1].used) {
            g.blocks[i - 1].len += g.blocks[i].len;
            block_remove(i);
        }
        return;
    }
    fprintf(stderr, "guard: mem_free of %p, not an allocation's start\n", ptr);
    abort();
}

/* A copy's backend side must be guard memory and its host side must not: a wrong `kind` in
 * engine code would otherwise pass on the CPU and break on a device. */
static void check_side(const void *p, size_t n, int backend, const char *what)
{
    if (n > 0 && kern_guard_contains(p, n) != backend) {
        fprintf(stderr, "guard: mem_copy %s %p (+%zu) is %s memory\n", what, p, n,
                backend ? "host, not guard" : "guard, not host");
        abort();
    }
}

static tdm_status_t guard_mem_copy(kern_ctx_t *ctx, void *dst, const void *src, size_t n_bytes,
                                   kern_copy_kind_t kind)
{
    tdm_status_t st;

    if (n_bytes > 0 && dst != NULL && src != NULL) {
        check_side(dst, n_bytes, kind != KERN_COPY_D2H, "dst");
        check_side(src, n_bytes, kind != KERN_COPY_H2D, "src");
    }
    guard_open();
    st = g.cpu.mem_copy(ctx, dst, src, n_bytes, kind);
    guard_close();
    return st;
}

static tdm_status_t guard_host_register(kern_ctx_t *ctx, const void *host, size_t n_bytes,
                                        const void **dev_out)
{
    if (host != NULL && kern_guard_contains(host, n_bytes == 0 ? 1 : n_bytes)) {
        fprintf(stderr, "guard: host_register of guard memory %p\n", host);
        abort();
    }
    return g.cpu.host_register(ctx, host, n_bytes, dev_out);
}

/* Every pointer an op reads or writes must be backend memory (on CUDA a host pointer there is
 * a device fault, on the CPU it would pass unnoticed): abort naming the op and the argument. */
/* After a violation was printed: abort, or in report mode count it and print where. */
static void guard_violation(void)
{
    if (!g.report) {
        abort();
    }
    g.n_reports++;
    print_stack();
}

static void guard_args(const char *op, const void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ptrs[i] != NULL && !kern_guard_contains(ptrs[i], 1)) {
            fprintf(stderr, "guard: %s: pointer argument %zu (%p) is host memory\n", op, i,
                    ptrs[i]);
            guard_violation();
        }
    }
}

/* Report mode's SIGSEGV handler: a fault inside the region is a host access of backend memory;
 * print where, open the region so that the access completes, and let the next op close it
 * again (so each stretch of host code between two ops reports its first access). Any other
 * fault goes to the previous handler. Test-only: not async-signal-safe. */
static void guard_segv(int sig, siginfo_t *info, void *uc)
{
    if (info != NULL && kern_guard_contains(info->si_addr, 1)) {
        fprintf(stderr, "guard: host access of backend memory at %p (offset %zu)\n",
                info->si_addr, (size_t)((unsigned char *)info->si_addr - g.base));
        g.n_reports++;
        print_stack();
        if (mprotect(g.base, g.bytes, PROT_READ | PROT_WRITE) == 0) {
            return;
        }
    }
    sigaction(SIGSEGV, &g.old_segv, NULL);
    if (g.old_segv.sa_flags & SA_SIGINFO) {
        g.old_segv.sa_sigaction(sig, info, uc);
    } else if (g.old_segv.sa_handler != SIG_DFL && g.old_segv.sa_handler != SIG_IGN) {
        g.old_segv.sa_handler(sig);
    } else {
        raise(sig);
    }
}

size_t kern_guard_report(int on)
{
    if (on && !g.report && g.live) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = guard_segv;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGSEGV, &sa, &g.old_segv);
        g.report = 1;
    } else if (!on && g.report) {
        sigaction(SIGSEGV, &g.old_segv, NULL);
        g.report = 0;
    }
    return g.n_reports;
}

#define GUARD_UNPAREN(...) __VA_ARGS__

/* GUARD_OP(member, (params), (args), (pointers)): guard_<member> checks that the pointers are
 * backend memory, opens the region, calls the CPU member with the same arguments and closes the
 * region again. */
#define GUARD_OP(member, params, args, ptrs)                                                       \
    static tdm_status_t guard_##member params                                                      \
    {                                                                                              \
        const void *const guard_ptrs[] = {GUARD_UNPAREN ptrs};                                     \
        tdm_status_t st;                                                                           \
        guard_args(#member, guard_ptrs, sizeof(guard_ptrs) / sizeof(guard_ptrs[0]));               \
        guard_open();                                                                              \
        st = g.cpu.member args;                                                                    \
        guard_close();                                                                             \
        return st;                                                                                 \
    }

/* Shared parameter lists of the quantizers and dequantizers. */
#define QUANT_P                                                                                    \
    (kern_ctx_t * ctx, const float *x, int64_t n_rows, int64_t dim, uint8_t *codes_out,            \
     uint8_t *scales_out)
#define QUANT_A (ctx, x, n_rows, dim, codes_out, scales_out)
#define DEQUANT_P                                                                                  \
    (kern_ctx_t * ctx, const uint8_t *codes, const uint8_t *scales, int64_t n_rows, int64_t dim,   \
     float *y_out)
#define DEQUANT_A (ctx, codes, scales, n_rows, dim, y_out)

GUARD_OP(quant_act8, QUANT_P, QUANT_A, (x, codes_out, scales_out))
GUARD_OP(quant_ckv, QUANT_P, QUANT_A, (x, codes_out, scales_out))
GUARD_OP(quant_mx4, QUANT_P, QUANT_A, (x, codes_out, scales_out))
GUARD_OP(dequant_act8, DEQUANT_P, DEQUANT_A, (codes, scales, y_out))
GUARD_OP(dequant_ckv, DEQUANT_P, DEQUANT_A, (codes, scales, y_out))
GUARD_OP(dequant_mx4, DEQUANT_P, DEQUANT_A, (codes, scales, y_out))
GUARD_OP(qdq_act8, (kern_ctx_t * ctx, const float *x, int64_t n_rows, int64_t dim, float *y_out),
         (ctx, x, n_rows, dim, y_out), (x, y_out))
GUARD_OP(gemm,
         (kern_ctx_t * ctx, const kern_mat_t *w, const float *x, int64_t ldx, int64_t n_rows,
          uint32_t flags, float *y_out, int64_t ldy),
         (ctx, w, x, ldx, n_rows, flags, y_out, ldy),
         (x, y_out, w != NULL ? w->data : NULL, w != NULL ? w->scales : NULL))
GUARD_OP(rmsnorm,
         (kern_ctx_t * ctx, const float *x, int64_t ldx, int64_t n_rows, int64_t dim,
          const float *gamma, float eps, float *y_out, int64_t ldy),
         (ctx, x, ldx, n_rows, dim, gamma, eps, y_out, ldy), (x, gamma, y_out))
GUARD_OP(rope,
         (kern_ctx_t * ctx, float *x, int64_t n_rows, int64_t n_heads, int64_t dim, int d_r,
          const int64_t *pos, const float *freqs, kern_rope_dir_t dir),
         (ctx, x, n_rows, n_heads, dim, d_r, pos, freqs, dir), (x, pos, freqs))
GUARD_OP(mhc_coeffs,
         (kern_ctx_t * ctx, const kern_mhc_params_t *params, const float *x, int64_t n_rows,
          int64_t H, const float *mix_raw, float *pre_out, float *post_out, float *M_out),
         (ctx, params, x, n_rows, H, mix_raw, pre_out, post_out, M_out),
         (x, mix_raw, pre_out, post_out, M_out, params != NULL ? params->base : NULL,
          params != NULL ? params->scale : NULL))
GUARD_OP(mhc_collapse,
         (kern_ctx_t * ctx, const float *pre, const float *X, int64_t n_rows, int m, int64_t H,
          float *y_out),
         (ctx, pre, X, n_rows, m, H, y_out), (pre, X, y_out))
GUARD_OP(mhc_update,
         (kern_ctx_t * ctx, const float *post, const float *F, const float *M, int64_t n_rows,
          int m, int64_t H, float *X),
         (ctx, post, F, M, n_rows, m, H, X), (post, F, M, X))
GUARD_OP(engram_gate,
         (kern_ctx_t * ctx, float *X, const float *kv, const float *qw, const float *kw,
          int64_t n_rows, int m, int64_t H, float eps),
         (ctx, X, kv, qw, kw, n_rows, m, H, eps), (X, kv, qw, kw))
GUARD_OP(moe_route,
         (kern_ctx_t * ctx, const float *logits, const float *bias, int64_t n_rows, int64_t E,
          int K, float rho, int32_t *ids_out, float *weights_out),
         (ctx, logits, bias, n_rows, E, K, rho, ids_out, weights_out),
         (logits, bias, ids_out, weights_out, ctx != NULL ? ctx->status_word : NULL))
GUARD_OP(swiglu,
         (kern_ctx_t * ctx, const float *gu, const float *w, int64_t n_rows, int64_t I,
          float lambda, float *h_out),
         (ctx, gu, w, n_rows, I, lambda, h_out), (gu, w, h_out))
/* The routed experts: besides the arrays, the pointer table and every expert's matrices must be
 * backend memory (the table is required here, as on CUDA, which reads only it). */
static tdm_status_t guard_moe_ffn(kern_ctx_t *ctx, const kern_moe_experts_t *ex, const float *xq,
                                  int64_t n_tokens, int64_t H, int64_t I, const int64_t *offsets,
                                  const int64_t *rows, const float *wts, int64_t n_pairs,
                                  float lambda, float *scratch, int64_t scratch_rows, float *acc,
                                  int64_t *active_out)
{
    const void *const ptrs[] = {xq, offsets, rows, wts, scratch, acc, active_out};
    tdm_status_t st;

    guard_args("moe_ffn", ptrs, sizeof(ptrs) / sizeof(ptrs[0]));
    if (ex != NULL) {
        size_t table_bytes =
            ex->n_experts > 0 ? (size_t)KERN_MOE_TABLE_LEN(ex->n_experts) * sizeof(void *) : 1;
        if (ex->table == NULL || !kern_guard_contains(ex->table, table_bytes)) {
            fprintf(stderr, "guard: moe_ffn: the expert pointer table (%p) is not backend memory\n",
                    (const void *)ex->table);
            guard_violation();
        }
        for (int64_t e = 0; e < ex->n_experts && ex->w1 != NULL && ex->w3 != NULL && ex->w2 != NULL;
             e++) {
            const void *const mats[] = {ex->w1[e].data,   ex->w1[e].scales, ex->w3[e].data,
                                        ex->w3[e].scales, ex->w2[e].data,   ex->w2[e].scales};
            guard_args("moe_ffn (expert matrices)", mats, sizeof(mats) / sizeof(mats[0]));
        }
    }
    guard_open();
    st = g.cpu.moe_ffn(ctx, ex, xq, n_tokens, H, I, offsets, rows, wts, n_pairs, lambda, scratch,
                       scratch_rows, acc, active_out);
    guard_close();
    return st;
}
GUARD_OP(attention,
         (kern_ctx_t * ctx, const float *q, const float *keys_a, int64_t n_a, const float *keys_b,
          int64_t n_b, const float *sink, int64_t n_heads, int64_t d, float scale, float *scratch,
          float *o_out),
         (ctx, q, keys_a, n_a, keys_b, n_b, sink, n_heads, d, scale, scratch, o_out),
         (q, keys_a, keys_b, sink, scratch, o_out))
GUARD_OP(attention_sel,
         (kern_ctx_t * ctx, const float *q, const float *keys_a, int64_t n_a, const float *rows,
          const int32_t *sel, int64_t n_b, const float *sink, int64_t n_heads, int64_t d,
          float scale, float *scratch, float *o_out),
         (ctx, q, keys_a, n_a, rows, sel, n_b, sink, n_heads, d, scale, scratch, o_out),
         (q, keys_a, rows, sel, sink, scratch, o_out))
/* attention_rows: the descriptors are backend memory, so their pointers are checked with the
 * region open (as the op reads them). */
static tdm_status_t guard_attention_rows(kern_ctx_t *ctx, const kern_attn_row_t *rows,
                                         int64_t n_rows, const float *sink, int64_t n_heads,
                                         int64_t d, float scale, float *scratch)
{
    const void *const ptrs[] = {rows, sink, scratch};
    tdm_status_t st;

    guard_args("attention_rows", ptrs, sizeof(ptrs) / sizeof(ptrs[0]));
    guard_open();
    for (int64_t i = 0; rows != NULL && i < n_rows; i++) {
        const void *const row_ptrs[] = {rows[i].q, rows[i].keys_a, rows[i].keys_b, rows[i].o};
        guard_args("attention_rows (a row's query, keys or output)", row_ptrs,
                   sizeof(row_ptrs) / sizeof(row_ptrs[0]));
    }
    st = g.cpu.attention_rows(ctx, rows, n_rows, sink, n_heads, d, scale, scratch);
    guard_close();
    return st;
}
GUARD_OP(compress_pool,
         (kern_ctx_t * ctx, const float *a, const float *b, int r, int64_t d, float *v_out),
         (ctx, a, b, r, d, v_out), (a, b, v_out))
GUARD_OP(index_scores,
         (kern_ctx_t * ctx, const float *q, const float *w, int64_t n_heads, int64_t d_I,
          const float *keys, int64_t n_keys, float *scores_out),
         (ctx, q, w, n_heads, d_I, keys, n_keys, scores_out), (q, w, keys, scores_out))
GUARD_OP(topk,
         (kern_ctx_t * ctx, const float *vals, int64_t n, int64_t k, int32_t *scratch,
          int32_t *idx_out, int64_t *n_out),
         (ctx, vals, n, k, scratch, idx_out, n_out),
         (vals, scratch, idx_out, n_out, ctx != NULL ? ctx->status_word : NULL))
GUARD_OP(mem_set, (kern_ctx_t * ctx, void *dst, int byte, size_t n_bytes),
         (ctx, dst, byte, n_bytes), (dst))
GUARD_OP(sync, (kern_ctx_t * ctx), (ctx), (NULL))
GUARD_OP(embed,
         (kern_ctx_t * ctx, const uint16_t *table, int64_t n_vocab, const int32_t *ids, int64_t n,
          int64_t H, int m, float *x_out, float *pre_out),
         (ctx, table, n_vocab, ids, n, H, m, x_out, pre_out), (table, ids, x_out, pre_out))
GUARD_OP(stream_mean,
         (kern_ctx_t * ctx, const float *x, int64_t n_rows, int m, int64_t H, float *y_out,
          int64_t ldy),
         (ctx, x, n_rows, m, H, y_out, ldy), (x, y_out))
GUARD_OP(bf16_round, (kern_ctx_t * ctx, const float *x, int64_t n, float *y_out),
         (ctx, x, n, y_out), (x, y_out))
GUARD_OP(add_bf16, (kern_ctx_t * ctx, const float *a, const float *b, int64_t n, float *y_out),
         (ctx, a, b, n, y_out), (a, b, y_out))
GUARD_OP(add, (kern_ctx_t * ctx, const float *a, const float *b, int64_t n, float *y_out),
         (ctx, a, b, n, y_out), (a, b, y_out))
GUARD_OP(scale2, (kern_ctx_t * ctx, float *x, int64_t n, float s0, float s1), (ctx, x, n, s0, s1),
         (x))
GUARD_OP(rows_gather,
         (kern_ctx_t * ctx, const float *x, int64_t ldx, const int64_t *idx, int64_t n_idx,
          int64_t n_cols, float *y_out, int64_t ldy),
         (ctx, x, ldx, idx, n_idx, n_cols, y_out, ldy), (x, idx, y_out))
GUARD_OP(rows_scatter_add,
         (kern_ctx_t * ctx, const float *y, int64_t ldy, const int64_t *idx, int64_t n_idx,
          int64_t n_cols, float *acc, int64_t ld_acc),
         (ctx, y, ldy, idx, n_idx, n_cols, acc, ld_acc), (y, idx, acc))
GUARD_OP(cand_blocks,
         (kern_ctx_t * ctx, const float *scores, int64_t n, int64_t block, float *beta_out),
         (ctx, scores, n, block, beta_out), (scores, beta_out))
GUARD_OP(cand_mask,
         (kern_ctx_t * ctx, float *scores, int64_t n, int64_t block, const int32_t *pool,
          int64_t n_pool),
         (ctx, scores, n, block, pool, n_pool), (scores, pool))
GUARD_OP(argmax,
         (kern_ctx_t * ctx, const float *logits, int64_t ld, int64_t n_rows, int64_t n_vocab,
          int32_t *ids_out),
         (ctx, logits, ld, n_rows, n_vocab, ids_out), (logits, ids_out))
GUARD_OP(expert_rows,
         (kern_ctx_t * ctx, const int32_t *experts, const float *wts, int64_t N, int K, int64_t E,
          int64_t *offsets_out, int64_t *rows_out, float *wts_out),
         (ctx, experts, wts, N, K, E, offsets_out, rows_out, wts_out),
         (experts, wts, offsets_out, rows_out, wts_out))
GUARD_OP(dequant_rows,
         (kern_ctx_t * ctx, kern_rows_format_t format, const uint8_t *const *codes,
          const uint8_t *const *scales, int64_t n_rows, int64_t dim, float *y_out),
         (ctx, format, codes, scales, n_rows, dim, y_out), (codes, scales, y_out))

GUARD_OP(rows_ahead,
         (kern_ctx_t * ctx, kern_rows_format_t format, const uint8_t *const *codes,
          const uint8_t *const *scales, int64_t n_rows, int64_t dim, float *y_out,
          kern_ahead_t *ticket),
         (ctx, format, codes, scales, n_rows, dim, y_out, ticket), (codes, scales, y_out))

GUARD_OP(page_mark, (kern_ctx_t * ctx, void *page, uint32_t slot_end), (ctx, page, slot_end),
         (page, ctx != NULL ? ctx->status_word : NULL))

tdm_status_t kern_guard_create(size_t pool_bytes, const kern_ops_t **ops_out)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t bytes;
    void *base;

    if (ops_out == NULL || pool_bytes == 0 || page <= 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (g.live) {
        return TDM_ERR_BUSY;
    }
    bytes = (pool_bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    base = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(&g, 0, sizeof(g));
    g.cap_blocks = 256;
    g.blocks = malloc(g.cap_blocks * sizeof(*g.blocks));
    if (g.blocks == NULL) {
        munmap(base, bytes);
        return TDM_ERR_NO_MEMORY;
    }
    g.blocks[0] = (guard_block_t){0, bytes, 0};
    g.n_blocks = 1;
    g.base = base;
    g.bytes = bytes;
    g.live = 1;
    g.cpu = *kern_ops_cpu();
    g.table = g.cpu;
    g.table.name = "guard";
    g.table.host_memory = 0;
#define SET(member) g.table.member = guard_##member
    SET(quant_act8);
    SET(quant_ckv);
    SET(quant_mx4);
    SET(dequant_act8);
    SET(dequant_ckv);
    SET(dequant_mx4);
    SET(qdq_act8);
    SET(gemm);
    SET(rmsnorm);
    SET(rope);
    SET(mhc_coeffs);
    SET(mhc_collapse);
    SET(mhc_update);
    SET(engram_gate);
    SET(moe_route);
    SET(swiglu);
    SET(attention);
    SET(compress_pool);
    SET(index_scores);
    SET(topk);
    SET(mem_alloc);
    SET(mem_free);
    SET(mem_copy);
    SET(mem_set);
    SET(sync);
    SET(host_register);
    SET(embed);
    SET(stream_mean);
    SET(bf16_round);
    SET(add_bf16);
    SET(add);
    SET(scale2);
    SET(moe_ffn);
    SET(page_mark);
    SET(rows_gather);
    SET(rows_scatter_add);
    SET(cand_blocks);
    SET(cand_mask);
    SET(argmax);
    SET(expert_rows);
    SET(dequant_rows);
    SET(rows_ahead);
#undef SET
    g.table.attention_sel = g.cpu.attention_sel != NULL ? guard_attention_sel : NULL;
    g.table.attention_rows = g.cpu.attention_rows != NULL ? guard_attention_rows : NULL;
    *ops_out = &g.table;
    return TDM_OK;
}

size_t kern_guard_destroy(void)
{
    size_t left = g.used_bytes;

    if (!g.live) {
        return 0;
    }
    kern_guard_report(0);
    munmap(g.base, g.bytes);
    free(g.blocks);
    memset(&g, 0, sizeof(g));
    return left;
}
