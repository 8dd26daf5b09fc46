/* test_cp.c — attention across a context-parallel group (cp_attention.h)
 * against one rank's attention over the whole sequence: cp 2 and cp 4 (of
 * 4 ranks), GQA and MHA, with and without packed documents.  Every rank
 * compares its rows of out, lse and dqkv (all of q, k and v: the key and
 * value gradients come back from the other ranks) with the whole run's,
 * and the bytes it sent with the scheme's formula. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "doc_positions.h"
#include "mpi_test.h"
#include "comm/comm.h"
#include "context_par/cp_attention.h"

enum { WORLD = 4, B = 2, L = 5 };

static uint64_t rng = 88172645463325252ull;
static float urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *rnd(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * urand();
    return x;
}

/* Worst |got - want| / (1 + |want|) over n; -inf equal to -inf. */
static double worst(const float *got, const float *want, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) || isinf(got[i])) {
            w = got[i] == want[i] ? w : INFINITY;
            continue;
        }
        double e = fabs((double)got[i] - want[i]) / (1 + fabs((double)want[i]));
        w = e > w || isnan(e) ? e : w;
    }
    return w;
}

static void check_cp(Comm *cp, int H, int KVH, int documents)
{
    const Backend *be = backend_cpu();
    const int P = cp->size, r = cp->rank, hs = 8, T = 2 * P * L;
    const size_t W = (size_t)(H + 2 * KVH) * hs, O = (size_t)H * hs;
    const size_t nq = (size_t)B * T * W, no = (size_t)B * T * O, nl = (size_t)B * H * T;
    rng = 88172645463325252ull + (uint64_t)(H * 10 + KVH); /* the same on every rank */
    float *qkv = rnd(nq, 2), *dout = rnd(no, 1);
    int32_t *pos = NULL;
    if (documents) /* documents of 3, 11, 1, 7 tokens, cycled */
        pos = doc_positions(B, T, (const int[]){3, 11, 1, 7}, 4);
    /* the whole sequence on one rank */
    float *out = calloc(no, 4), *lse = calloc(nl, 4), *dqkv = calloc(nq, 4);
    AttnArgs whole = attn_args(B, T, H, KVH, hs);
    whole.pos = pos;
    be->attention_forward(out, lse, qkv, qkv, &whole);
    be->attention_backward(dqkv, dqkv, dout, qkv, qkv, out, lse, &whole);

    /* this rank's chunks r and 2P-1-r, each [B, L] */
    const size_t lq = 2 * (size_t)B * L * W, lo = 2 * (size_t)B * L * O, ll = 2 * (size_t)B * H * L;
    float *q = malloc(lq * 4), *d = malloc(lo * 4), *o = calloc(lo, 4), *l = calloc(ll, 4);
    float *dq = calloc(lq, 4), *want_o = malloc(lo * 4), *want_l = malloc(ll * 4);
    float *want_d = malloc(lq * 4);
    uint16_t *o16 = malloc(lo * sizeof *o16); /* out's bf16 bits (AttnArgs.out16) */
    int32_t *lpos = documents ? malloc(2 * (size_t)B * L * sizeof *lpos) : NULL;
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < L; t++) {
                const size_t g = (size_t)b * T + (size_t)cp_chunk(P, r, c) * L + t;
                const size_t m = ((size_t)c * B + b) * L + t;
                memcpy(q + m * W, qkv + g * W, W * 4);
                memcpy(want_d + m * W, dqkv + g * W, W * 4);
                memcpy(d + m * O, dout + g * O, O * 4);
                memcpy(want_o + m * O, out + g * O, O * 4);
                if (lpos)
                    lpos[m] = pos[g];
                for (int h = 0; h < H; h++)
                    want_l[(((size_t)c * B + b) * H + h) * L + t] =
                        lse[((size_t)b * H + h) * T + cp_chunk(P, r, c) * L + t];
            }
    CpAttention a;
    cp_attention_init(&a, be, cp, B, L, H, KVH, hs);
    const uint64_t sent0 = cp->bytes_sent;
    cp_attention_forward(&a, o, o16, l, q, lpos);
    cp_attention_backward(&a, dq, d, q, o, l, lpos);
    const uint64_t sent = cp->bytes_sent - sent0, expect = 2 * (uint64_t)(P - 1) * lq * 4;
    cp_attention_free(&a);

    CHECK(worst(o, want_o, lo) <= 1e-5, "cp %d rank %d H %d KVH %d documents %d: out (worst %.3g)",
          P, r, H, KVH, documents, worst(o, want_o, lo));
    size_t bad16 = 0;
    while (bad16 < lo && o16[bad16] == bf16_bits(o[bad16]))
        bad16++;
    CHECK(bad16 == lo,
          "cp %d rank %d H %d KVH %d documents %d: out16 = bf16 bits of out (element %zu)", P, r, H,
          KVH, documents, bad16);
    CHECK(worst(l, want_l, ll) <= 1e-5, "cp %d rank %d H %d KVH %d documents %d: lse (worst %.3g)",
          P, r, H, KVH, documents, worst(l, want_l, ll));
    CHECK(worst(dq, want_d, lq) <= 1e-4,
          "cp %d rank %d H %d KVH %d documents %d: dqkv, keys and values included (worst %.3g)", P,
          r, H, KVH, documents, worst(dq, want_d, lq));
    CHECK(sent == expect, "cp %d rank %d: %llu bytes sent, the formula 2 (cp-1) n 4 says %llu", P,
          r, (unsigned long long)sent, (unsigned long long)expect);
    free(qkv), free(dout), free(pos), free(out), free(lse), free(dqkv), free(q), free(d), free(o);
    free(l), free(dq), free(want_o), free(want_l), free(want_d), free(lpos), free(o16);
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("cp", WORLD);
    comm_init(&argc, &argv);
    alarm(120); /* a hung collective fails the test instead of stalling it */
    omp_set_num_threads(1);
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "cp: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    for (int P = 2; P <= WORLD; P *= 2) {
        Comm cp = comm_split(&world, world.rank / P, world.rank);
        for (int documents = 0; documents < 2; documents++) {
            check_cp(&cp, 4, 2, documents);
            check_cp(&cp, 3, 3, documents);
        }
        comm_free(&cp);
    }
    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = check_summary("cp");
    comm_finalize();
    return rc || failed;
}
