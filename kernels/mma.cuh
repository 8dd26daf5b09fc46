/* mma.cuh — the warp-level tensor-core product the bf16 attention uses
 * (attention_tc.cu): mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
 * D = A B + C with A 16x16 and B 16x8 in bf16, C and D 16x8 in fp32.
 *
 * Every lane of the warp holds a fragment of each matrix, as the PTX ISA
 * ("Matrix Fragments for mma.m16n8k16 with floating point type") lays it
 * out; with g = lane / 4 and c = lane % 4:
 *   A: a[0] = A[g][2c, 2c+1]      a[1] = A[g+8][2c, 2c+1]
 *      a[2] = A[g][2c+8, 2c+9]    a[3] = A[g+8][2c+8, 2c+9]
 *   B: b[0] = B[2c, 2c+1][g]      b[1] = B[2c+8, 2c+9][g]
 *   C, D: d[0], d[1] = D[g][2c, 2c+1]    d[2], d[3] = D[g+8][2c, 2c+1]
 * Two bf16 share a 32-bit register, the lower index in the lower half.
 *
 * Under the CPU emulation (kernels/emu) the same call gathers the 32 lanes'
 * registers (emu_warp_gather, a barrier like a shuffle's) and each lane
 * computes its own four elements of D from them through the layout above:
 * a kernel whose fragments are wrong fails there as it would on the GPU.
 * The emulation sums the 16 exact products in order in fp32 onto C; the
 * hardware's order and internal precision of that sum are its own, so
 * results agree to fp32 rounding of a 16-term sum, not bit for bit. */
#ifndef TRD_KERNELS_MMA_CUH
#define TRD_KERNELS_MMA_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

/* Two values rounded to bf16 (nearest even) in one register, lo first. */
__device__ inline uint32_t mma_pack(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16;
}

/* The 32 bits at p (two bf16, 4-byte aligned) and the 16 bits of two
 * separate bf16 at lo and hi, as one register. */
__device__ inline uint32_t mma_ld2(const uint16_t *p)
{
#ifdef TRD_CUDA_EMULATED
    uint32_t r;
    memcpy(&r, p, 4);
    return r;
#else
    return *reinterpret_cast<const uint32_t *>(p);
#endif
}

/* 32 bits (two bf16) stored at p, 4-byte aligned. */
__device__ inline void mma_st2(uint16_t *p, uint32_t v)
{
#ifdef TRD_CUDA_EMULATED
    memcpy(p, &v, 4);
#else
    *reinterpret_cast<uint32_t *>(p) = v;
#endif
}

/* The two bf16 of a register as fp32: the lower, the upper. */
__device__ inline float mma_lo(uint32_t r) { return __uint_as_float(r << 16); }
__device__ inline float mma_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }

__device__ inline uint32_t mma_ld_pair(const uint16_t *lo, const uint16_t *hi)
{
    return (uint32_t)*lo | (uint32_t)*hi << 16;
}

/* ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16: two 8 x 8 bf16 matrices
 * of shared memory, transposed, as a B fragment.  Lanes 0-7 give the rows
 * of matrix 0 and lanes 8-15 those of matrix 1 (row = 8 bf16 from `row`,
 * 16-byte aligned; the other lanes' addresses are not used); each lane
 * receives r[i] = (M_i[2c][g], M_i[2c+1][g]) of matrix i (g = lane / 4,
 * c = lane % 4): with M_0 = rows k .. k+7 and M_1 = rows k+8 .. k+15 of a
 * row-major tile X, the B fragment of X[k .. k+15][n .. n+7]. */
#ifdef TRD_CUDA_EMULATED

inline void mma_ldmatrix_x2_trans(uint32_t (&r)[2], const uint16_t *row)
{
    const uint16_t *rows[32];
    emu_warp_gather(&row, rows, sizeof row);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    for (int i = 0; i < 2; i++)
        r[i] = mma_ld_pair(rows[8 * i + 2 * c] + g, rows[8 * i + 2 * c + 1] + g);
}

#else

__device__ inline void mma_ldmatrix_x2_trans(uint32_t (&r)[2], const uint16_t *row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

#endif

#ifdef TRD_CUDA_EMULATED

struct MmaLane {
    uint32_t a[4], b[2];
};

/* Element (row, col) of A and (row, col) of B, from the warp's registers. */
inline float mma_emu_a(const MmaLane *w, int row, int col)
{
    uint32_t r = w[(row % 8) * 4 + (col % 8) / 2].a[(row >= 8) + 2 * (col >= 8)];
    return col % 2 ? mma_hi(r) : mma_lo(r);
}

inline float mma_emu_b(const MmaLane *w, int row, int col)
{
    uint32_t r = w[col * 4 + (row % 8) / 2].b[row >= 8];
    return row % 2 ? mma_hi(r) : mma_lo(r);
}

/* d += A B for this lane's four elements of the 16x8 accumulator. */
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    MmaLane mine, w[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    emu_warp_gather(&mine, w, sizeof mine);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * c + i % 2;
        float s = d[i];
        for (int k = 0; k < 16; k++)
            s += mma_emu_a(w, row, k) * mma_emu_b(w, k, col);
        d[i] = s;
    }
}

#else

__device__ inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif

/* cp.async: copies from global to shared memory that run while the warp
 * goes on, for a tile staged during the math of the one before (the
 * software pipeline of attention_tc.cu).  mma_cp16 copies the 16 bytes at
 * src (global, 16-byte aligned) to dst (shared, 16-byte aligned), zeros
 * when !in (src must still be a valid address); mma_cp4 the same for 4
 * bytes.  The copies a thread issued since its last mma_cp_commit form a
 * group; mma_cp_wait<N> waits until at most the N newest of its groups
 * are still on their way.  Another thread sees the data only after a
 * __syncthreads that follows the wait.  In the emulation the copy happens
 * at once and waiting is a no-op: a tile staged into a buffer still being
 * read (a missing __syncthreads) changes what the other threads of the
 * block read, since the emulation runs them one after another between
 * barriers. */
#ifdef TRD_CUDA_EMULATED

inline void mma_cp16(void *dst, const void *src, int in)
{
    if (in)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
}

inline void mma_cp4(void *dst, const void *src, int in)
{
    if (in)
        memcpy(dst, src, 4);
    else
        memset(dst, 0, 4);
}

inline void mma_cp_commit() {}

template <int N> inline void mma_cp_wait() {}

#else

__device__ inline void mma_cp16(void *dst, const void *src, int in)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
                 "r"(in ? 16 : 0)
                 : "memory");
}

__device__ inline void mma_cp4(void *dst, const void *src, int in)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src),
                 "r"(in ? 4 : 0)
                 : "memory");
}

__device__ inline void mma_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ inline void mma_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

#endif
