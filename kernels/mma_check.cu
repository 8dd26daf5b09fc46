/* mma_check.cu — the tensor-core product of mma.cuh alone, for the test
 * of its fragment layout (tests/test_cuda_ops.c): one warp loads A, B and
 * C into registers element by element with the PTX ISA's formulas for
 * mma.m16n8k16 (written out here, apart from mma.cuh's comment and the
 * attention kernels' loops), multiplies, and stores D the same way; or
 * B through ldmatrix.x2.trans from a row-major copy in shared memory.  On a
 * GPU it checks the instruction; under the emulation, the emulated
 * warp-wide product against the hardware's documented layout. */
#include "common.cuh"
#include "mma.cuh"

__global__ void mma_check_kernel(float *d, const float *a, const float *b, const float *c,
                                 int ldmatrix_b)
{
    __shared__ __align__(16) uint16_t bs[16][8]; /* B as bf16, row-major, for ldmatrix */
    const int lane = threadIdx.x, group = lane >> 2, tig = lane % 4;
    float av[8], bv[4], acc[4];
    for (int i = 0; i < 8; i++) { /* A: row-major 16 x 16 */
        const int row = i < 2 || (i >= 4 && i < 6) ? group : group + 8;
        const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
        av[i] = a[row * 16 + col];
    }
    for (int i = 0; i < 4; i++) { /* B: 16 x 8, element (k, n) at b[k * 8 + n] */
        const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = group;
        bv[i] = b[row * 8 + col];
    }
    for (int i = 0; i < 4; i++) { /* C and D: row-major 16 x 8 */
        const int row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
        acc[i] = c[row * 8 + col];
    }
    const uint32_t ar[4] = {mma_pack(av[0], av[1]), mma_pack(av[2], av[3]), mma_pack(av[4], av[5]),
                            mma_pack(av[6], av[7])};
    uint32_t br[2] = {mma_pack(bv[0], bv[1]), mma_pack(bv[2], bv[3])};
    if (ldmatrix_b) { /* B's fragment from shared memory by ldmatrix .trans instead */
        for (int i = lane; i < 16 * 8; i += 32)
            bs[i / 8][i % 8] = (uint16_t)(mma_pack(b[i], 0.0f) & 0xffffu);
        __syncthreads();
        mma_ldmatrix_x2_trans(br, bs[lane % 16]);
    }
    mma_bf16_16816(acc, ar, br);
    for (int i = 0; i < 4; i++) {
        const int row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
        d[row * 8 + col] = acc[i];
    }
}

extern "C" void backend_cuda_mma_check(float *d, const float *a, const float *b, const float *c,
                                       int ldmatrix_b)
{
    mma_check_kernel<<<1, 32, 0, cuda_stream()>>>(d, a, b, c, ldmatrix_b);
    CUDA_CHECK_LAUNCH();
}
