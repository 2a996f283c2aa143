// Hopper (sm_90a) tensor-core dilated-attention forward for 16-bit inputs (bfloat16 or float16):
// warpgroup MMA (wgmma m64nNk16, FP32 accumulation) with FP32 online softmax and the in-place
// log-sum-exp merge.
//
// Same problem geometry and merge contract as dilated_fwd_wgmma_tf32.cu (problems numbered (segment,
// head-in-group), rows addressed by element offsets, query i sees key j when j < mk and, if causal,
// j <= i + causal_shift; rows with no visible key are left untouched), except that q, k, v and out hold
// 16-bit values T (bf16_t or f16_t below: raw 16-bit storage, the bits of torch.bfloat16 / float16;
// rows aligned to 8 elements = 16 bytes). lse stays float32 in natural-log units. Scores, softmax,
// the running output and the log-sum-exp are FP32; the merge reads the old 16-bit output, combines in
// FP32 and rounds once to T (round to nearest even; merge_rows16 in attention.cuh, shared with the mma16 kernel).
//
// Block: WG warpgroups of 128 threads; warpgroup w owns queries 64w..64w+63 of the block's 64*WG.
// Key tiles of BK keys, double-buffered: all threads cp.async the next tile's K and V rows (16 bytes
// each, straight into the wgmma layout) while the current tile is computed. Per tile:
//   1. S = Q K^T: D/16 wgmma m64n{BK}k16 (one per k-step), A = Q and B = K from shared memory, both
//      K-major; Q is kept as given (not pre-scaled, so it is rounded only once, by the caller);
//   2. online softmax in FP32 on the accumulator registers: exp2 of (s * scale * log2 e - m);
//   3. P -> T pairs in registers (cvt.rn), O += P V: wgmma m64n{D}k16 (BK/16 k-steps), A = P from
//      registers, B = V from shared memory:
//        VMODE 0: V stays [key][d] (MN-major B, "N-major"), the instruction's imm-trans-b = 1;
//        VMODE 1: V is transposed once per tile into a K-major V^T buffer (ldmatrix + stmatrix.trans,
//                 one extra barrier), imm-trans-b = 0 (the layout the TF32 kernel uses).
// Only tiles at the causal or length boundary are masked; a warpgroup skips the tiles wholly past its
// own causal end (it still takes part in the block's loads and barriers).
//
// Shared-memory layouts, no swizzle. A core matrix is 8 rows x 16 bytes (8 elements), 128 contiguous
// bytes. Q (64*WG rows), K and V (BK rows) are all stored as [row / 8][chunk = col / 8][row % 8][8]
// (same cp.async code for each), so one 8-row group of a D-wide tile is 16 * D bytes.
// Matrix descriptor: start address >> 4 (bits 0-13), LBO >> 4 (bits 16-29), SBO >> 4 (bits 32-45),
// base offset 0, swizzle 0 (PTX ISA "Matrix Descriptor Format" and "Canonical Layouts", elements of
// T = 8 per 16 bytes):
//   K-major, no swizzle:  ((8,m),(T,2k)):((1T,SBO),(1,LBO)), i.e. LBO = bytes between the two core
//                         matrices adjacent in K, SBO = bytes between 8-row groups (M or N);
//   MN-major, no swizzle: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), i.e. SBO = bytes between core matrices
//                         adjacent in M/N (8 columns on), LBO = bytes between core matrices adjacent in K
//                         (8 K-rows on). (PTX ISA example "MN-major, no-swizzling, bf16": exact layout
//                         ((8,1,2),(8,2)):((1,8,64),(8,128)) -> LBO = 128 elements, SBO = 64 elements;
//                         CUTLASS make_gmma_desc<Major::MN> INTERLEAVE: SBO = stride<0,1>, LBO = stride<1,1>.)
//   Q (A of Q K^T, K-major): LBO = 128, SBO = 16 D; k-step ks (16 columns) starts 256 ks bytes in.
//   K (B of Q K^T, K-major, N = keys): LBO = 128, SBO = 16 D; k-step ks: + 256 ks bytes.
//   V (B of P V, VMODE 0, MN-major: K = keys, N = d): the same [key / 8][d / 8][key % 8][8] tile read the
//     other way: LBO = 16 D (next 8 keys), SBO = 128 (next 8 columns of d); k-step kk (16 keys): + 32 D kk bytes.
//   V^T (VMODE 1, K-major, N = d): [d / 8][key / 8][d % 8][8 keys]: LBO = 128, SBO = 16 BK; k-step kk: + 256 kk.
// Register fragments (per warp of the warpgroup, lane = 4 g + t, rows relative to the warp's 16 rows):
//   accumulator (m64nN f32): d[4i + 2h + e] = (row g + 8h, column 8i + 2t + e);
//   A from registers (m64nNk16, 16-bit): element r (0..7) of k-step kk = (row g + 8 ((r >> 1) & 1),
//   column 16 kk + 8 (r >> 2) + 2t + (r & 1)), register j = elements 2j (low half), 2j + 1 (high half).
// So element r of k-step kk is accumulator element 8 kk + r: the scores of keys 16kk..16kk+15 are the A
// fragment of k-step kk in place, register j = pack(s[8kk + 2j], s[8kk + 2j + 1]); no permutation.

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "wgmma.cuh"
#include "mask.cuh"
#include "attention.cuh"

// rows [r0, r0 + ROWS) of a D-wide 16-bit matrix (row j at src + off + j * row_stride elements; rows at or
// past rend are zero-filled) into shared memory at byte address dst in core-matrix order
// [row / 8][chunk = col / 8][row % 8][8]; one 16-byte cp.async per chunk, no commit. Eight consecutive
// threads write one 128-byte core matrix (no bank conflicts); a warp reads 64 contiguous bytes of 8 rows.
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_rows_async(unsigned dst, const T* __restrict__ src, long long off,
                                                long long row_stride, int r0, int rend) {
    constexpr int KC = D / 8;
#pragma unroll 4
    for (int p = threadIdx.x; p < ROWS * KC; p += THREADS) {
        const int r = (p / (8 * KC)) * 8 + (p & 7), c = (p >> 3) % KC, j = r0 + r;
        const T* from = src + off + (long long)max(0, min(j, rend - 1)) * row_stride + 8 * c;
        cp_async_16(dst + 16 * p, from, j < rend ? 16 : 0);
    }
}

// VMODE 1: the staged V tile ([key / 8][d / 8][key % 8][8], BK x D) transposed into V^T
// ([d / 8][key / 8][d % 8][8 keys]): per 8 x 8 core matrix, ldmatrix (lane l: row l / 4, columns
// 2 (l % 4), +1) then stmatrix .trans (element (r, c) to row c, column r). Four matrices per warp step.
template <int D, int BK, int THREADS>
__device__ __forceinline__ void transpose_v_tile(unsigned vt, unsigned vs) {
    constexpr int KC = D / 8, KB = BK / 8, MATS = KB * KC;
    static_assert(MATS % 4 == 0, "whole ldmatrix.x4 steps");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int m0 = 4 * warp; m0 < MATS; m0 += THREADS / 8) {
        const int m = m0 + (lane >> 3), row = lane & 7;      // lanes 8i..8i+7: rows of matrix m0 + i
        const int a = m / KC, c = m % KC;                    // key group a, d chunk c
        const unsigned from = vs + 128 * (a * KC + c) + 16 * row;
        const unsigned to = vt + 128 * (c * KB + a) + 16 * row;
        unsigned r0, r1, r2, r3;
        // ldsm_x4 of mma_sync.cuh, spelled out: through the helper the cubin differs
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(from) : "memory");
        stsm_x4_trans(to, r0, r1, r2, r3);
    }
}

// Shared memory of one block in bytes: Q (64 WG rows), 2 stages of (K, V) tiles, and for VMODE 1 one V^T tile.
template <int D, int BK, int WG, int VMODE>
struct Smem16 {
    static constexpr int Q = WG_QUERIES * WG * D * 2;
    static constexpr int TILE = BK * D * 2;
    static constexpr int bytes = Q + 4 * TILE + (VMODE == 1 ? TILE : 0);
};

// Blocks per SM the register budget is cut for: with key tiles of 64 and D <= 64 the block fits in 128
// registers a thread without spills (ptxas, tests/test_kernel16_sources.py), so 16 warps share an SM and one
// block's softmax and loads hide under another's wgmma; larger tiles need more registers (one block per SM).
template <typename T, int D, int BK, int WG, int VMODE>
__global__ void __launch_bounds__(WG_THREADS * WG, (BK <= 64 && D <= 64) ? 4 / WG : 1)
dilated_fwd_wgmma_16(DILATED_FWD16_PARAMS(T))
{
    using H = Half16<T>;
    using L = Smem16<D, BK, WG, VMODE>;
    constexpr int THREADS = WG_THREADS * WG;
    constexpr int BQ = WG_QUERIES * WG;
    constexpr int NS = BK / 2;               // score registers per thread
    constexpr int NO = D / 2;                // output registers per thread
    constexpr int KQ = D / 16;               // k-steps of Q K^T
    constexpr int KP = BK / 16;              // k-steps of P V
    static_assert(D % 16 == 0 && D <= 256 && BK % 16 == 0 && BK <= 256, "wgmma shapes");
    static_assert(VMODE == 0 || VMODE == 1, "VMODE");

    extern __shared__ __align__(128) unsigned char smem16[];
    const unsigned sQ = (unsigned)__cvta_generic_to_shared(smem16);
    const unsigned sKV = sQ + L::Q;          // stage s: K at sKV + 2 s TILE, V at sKV + (2 s + 1) TILE
    const unsigned sVt = sKV + 4 * L::TILE;  // VMODE 1

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int qblock = blockIdx.y * BQ;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int kend = visible_key_end(mk, causal, qblock + BQ, causal_shift);
    if (kend <= 0) return;                   // no key visible to this block (uniform)

    // this warpgroup's queries and keys: tiles at or past kend_wg are skipped, those below open_end unmasked
    const int qwg = qblock + WG_QUERIES * wg;
    // visible_key_end / unmasked_key_end of mask.cuh, spelled out: through the helpers the cubin differs
    int kend_wg = (qwg < mq) ? kend : 0;
    if (causal) kend_wg = min(kend_wg, max(0, qwg + WG_QUERIES + causal_shift));
    const int open_end = causal ? min(kend, max(0, qwg + causal_shift + 1)) : kend;

    load_rows_async<T, D, BQ, THREADS>(sQ, q, qoff, q_row, qblock, mq);
    load_rows_async<T, D, BK, THREADS>(sKV, k, koff, k_row, 0, kend);
    load_rows_async<T, D, BK, THREADS>(sKV + L::TILE, v, voff, v_row, 0, kend);
    cp_async_commit();

    const desc_t dQ = smem_desc(sQ + WG_QUERIES * D * 2 * wg, 128, 16 * D);
    const desc_t dK0 = smem_desc(sKV, 128, 16 * D);
    const desc_t dV0 = (VMODE == 0) ? smem_desc(sKV + L::TILE, 16 * D, 128) : smem_desc(sVt, 128, 16 * BK);
    constexpr desc_t STAGE16 = (desc_t)(2 * L::TILE / 16);     // one stage to the next, 16-byte units

    const int row0 = qwg + 16 * warp + g;    // this thread's rows: row0, row0 + 8
    const float mul = scale * LOG2E;         // scores -> log2 units
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.0f;

    for (int kt = 0, it = 0; kt < kend; kt += BK, ++it) {
        const int cur = it & 1;
        cp_async_wait_all();
        if (VMODE == 0) fence_async_shared();
        __syncthreads();                     // tile kt landed for all; every warpgroup is done with tile kt - BK
        if (VMODE == 1) {
            transpose_v_tile<D, BK, THREADS>(sVt, sKV + (2 * cur + 1) * L::TILE);
            fence_async_shared();
            __syncthreads();                 // V^T (and K, Q) visible to wgmma
        }
        if (kt + BK < kend) {                // the next tile into the other stage (read last in tile kt - BK)
            const unsigned st = sKV + 2 * (cur ^ 1) * L::TILE;
            load_rows_async<T, D, BK, THREADS>(st, k, koff, k_row, kt + BK, kend);
            load_rows_async<T, D, BK, THREADS>(st + L::TILE, v, voff, v_row, kt + BK, kend);
            cp_async_commit();
        }
        if (kt >= kend_wg) continue;         // uniform over the warpgroup: nothing visible to its queries

        // S = Q K^T (64 queries of this warpgroup x BK keys)
        const desc_t dK = dK0 + (desc_t)cur * STAGE16;
        float s[NS];
        pin(s);
        wgmma_fence();
        Wgmma16<T, BK>::template ss<0>(s, dQ, dK);
#pragma unroll
        for (int ks = 1; ks < KQ; ++ks) Wgmma16<T, BK>::template ss<1>(s, dQ + 16 * ks, dK + 16 * ks);
        wgmma_commit();
        wgmma_wait<0>();
        pin(s);

        // online softmax over the tile (log2 units); a row's statistics live in its 4 lanes (t = 0..3)
        online_softmax_tile<BK / 8, NO>(s, o, m, l, kt + BK > open_end, kt, kend, causal, causal_shift, row0, t, mul);

        // P as the A operand: k-step kk = accumulator elements 8 kk .. 8 kk + 7, in pairs
        unsigned p[KP][4];
#pragma unroll
        for (int kk = 0; kk < KP; ++kk)
#pragma unroll
            for (int j = 0; j < 4; ++j) p[kk][j] = H::pack(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);

        // O += P V
        const desc_t dV = (VMODE == 0) ? dV0 + (desc_t)cur * STAGE16 : dV0;
        constexpr desc_t VSTEP = (VMODE == 0) ? (desc_t)(2 * D) : (desc_t)16;   // 16 keys on, 16-byte units
        pin(o);
        pin_u(p);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) Wgmma16<T, D>::template rs<1, VMODE == 0 ? 1 : 0>(o, p[kk], dV + VSTEP * kk);
        wgmma_commit();
        wgmma_wait<0>();
        pin(o);
    }

    // merge into the running output (16-bit, rounded once) and log-sum-exp (natural-log units)
    merge_rows16<T, D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o);
}
