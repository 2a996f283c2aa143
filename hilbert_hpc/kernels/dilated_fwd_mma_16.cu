// Tensor-core dilated-attention forward for 16-bit inputs (bfloat16 or float16) on compute capability
// 8.0 and newer (A100, A10/L40S, RTX 30/40, Hopper when forced, Blackwell): mma.sync m16n8k16 with FP32
// accumulation, FP32 online softmax and the in-place log-sum-exp merge into the 16-bit output.
//
// Same problem geometry and merge contract as dilated_fwd_wgmma_16.cu (problems numbered (segment,
// head-in-group), rows addressed by element offsets, query i sees key j when j < mk and, if causal,
// j <= i + causal_shift; rows with no visible key are left untouched; q, k, v, out 16-bit T with rows
// aligned to 8 elements; lse float32, natural-log units). Q is used as given (not pre-scaled).
//
// Block: 4 warps x 16 queries = 64 queries; key tiles of BK, two stages: cp.async (16 bytes a thread)
// brings the next K/V tile while the current one is computed. Shared rows are padded to D + 8 elements,
// so the 8 row addresses of every ldmatrix fall in distinct bank quads. Fragments (lane = 4 g + t):
//   Q (A, row-major 16 x 16 per k-step): ldmatrix.x4 of (rows 0-7 | 8-15) x (columns 0-7 | 8-15), kept in
//     registers for the whole key loop;
//   K (B, "col": key = n, dimension = k): ldmatrix.x4 of key rows 8b..8b+7 over two k-steps (four 8-column
//     chunks): b0 = (k 2t, 2t+1; n g), b1 = (k 2t+8, 2t+9; n g);
//   S accumulators s[b][2h + e] = (query g + 8h, key 8b + 2t + e);
//   P (A of P V): k-step kk = keys 16kk..16kk+15 = score blocks 2kk and 2kk+1, packed in pairs in place;
//   V (B of P V, k = key, n = dimension): ldmatrix.x4.trans of key rows 16kk..16kk+15 over two 8-column
//     chunks of d;
//   O accumulators o[n][2h + e] = (query g + 8h, column 8n + 2t + e): the layout merge_rows16 takes.
// Only tiles at the causal or length boundary are masked.

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "mask.cuh"
#include "attention.cuh"

#define MMA16_WARPS 4
#define MMA16_THREADS (32 * MMA16_WARPS)
#define MMA16_BQ (16 * MMA16_WARPS)

// rows [r0, r0 + ROWS) of a D-wide 16-bit matrix (row j at src + off + j * row_stride elements; rows at or
// past rend are zero-filled) into shared rows of D + 8 elements at byte address dst; one 16-byte cp.async
// per 8 columns, no commit
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_rows_padded(unsigned dst, const T* __restrict__ src, long long off,
                                                 long long row_stride, int r0, int rend) {
    constexpr int KC = D / 8, S = 2 * (D + 8);
#pragma unroll 4
    for (int p = threadIdx.x; p < ROWS * KC; p += MMA16_THREADS) {
        const int r = p / KC, c = p % KC, j = r0 + r;
        const T* from = src + off + (long long)max(0, min(j, rend - 1)) * row_stride + 8 * c;
        cp_async_16(dst + r * S + 16 * c, from, j < rend ? 16 : 0);
    }
}

// blocks per SM the register budget is cut for (three: up to 170 registers, no spills with 64-key tiles;
// three such blocks share an SM on compute capability 8.0 and 9.0, two on 8.6/8.9, where shared memory
// per SM is 100 KiB)
template <int D>
struct MinBlocks16 {
    static constexpr int value = D <= 64 ? 3 : 2;
};

template <typename T, int D, int BK>
__global__ void __launch_bounds__(MMA16_THREADS, MinBlocks16<D>::value)
dilated_fwd_mma_16(DILATED_FWD16_PARAMS(T))
{
    using H = Half16<T>;
    using M = Mma16<T>;
    constexpr int S = 2 * (D + 8);           // bytes per padded shared row
    constexpr int TILE = BK * S;             // bytes of one K or V tile
    constexpr int KQ = D / 16;               // k-steps of Q K^T
    constexpr int NB = BK / 8;               // 8-key score blocks per tile
    constexpr int KP = BK / 16;              // k-steps of P V
    constexpr int ND = D / 8;                // 8-column output blocks
    static_assert(D % 32 == 0 && BK % 16 == 0, "two k-steps / two column blocks per ldmatrix.x4");

    extern __shared__ __align__(16) unsigned char smem16[];
    const unsigned sQ = (unsigned)__cvta_generic_to_shared(smem16);
    const unsigned sKV = sQ + MMA16_BQ * S;  // stage s: K at sKV + 2 s TILE, V at sKV + (2 s + 1) TILE

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mi = lane >> 3, r8 = lane & 7; // ldmatrix: this lane addresses row r8 of matrix mi
    const int qblock = blockIdx.y * MMA16_BQ;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int kend = visible_key_end(mk, causal, qblock + MMA16_BQ, causal_shift);
    if (kend <= 0) return;                   // no key visible to this block (uniform)
    const int open_end = unmasked_key_end(kend, causal, qblock, causal_shift);

    load_rows_padded<T, D, MMA16_BQ>(sQ, q, qoff, q_row, qblock, mq);
    load_rows_padded<T, D, BK>(sKV, k, koff, k_row, 0, kend);
    load_rows_padded<T, D, BK>(sKV + TILE, v, voff, v_row, 0, kend);
    cp_async_commit();

    // per-lane byte offsets of the ldmatrix rows
    const unsigned q_lane = sQ + (16 * warp + r8 + 8 * (mi & 1)) * S + 16 * (mi >> 1);
    const unsigned k_lane = r8 * S + 16 * mi;                  // + 8 b S (key block) + 32 ks (k-step pair)
    const unsigned v_lane = (8 * (mi & 1) + r8) * S + 16 * (mi >> 1);   // + 16 kk S + 16 n (column pair)

    const int row0 = qblock + 16 * warp + g; // this thread's rows: row0, row0 + 8
    const float mul = scale * LOG2E;         // scores -> log2 units
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    unsigned qa[KQ][4];

    for (int kt = 0, it = 0; kt < kend; kt += BK, ++it) {
        const int cur = it & 1;
        cp_async_wait_all();
        __syncthreads();                     // tile kt (and Q) landed for all; all are done with tile kt - BK
        if (it == 0) {
#pragma unroll
            for (int ks = 0; ks < KQ; ++ks) ldsm_x4(q_lane + 32 * ks, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
        }
        if (kt + BK < kend) {                // the next tile into the other stage (read last in tile kt - BK)
            const unsigned st = sKV + 2 * (cur ^ 1) * TILE;
            load_rows_padded<T, D, BK>(st, k, koff, k_row, kt + BK, kend);
            load_rows_padded<T, D, BK>(st + TILE, v, voff, v_row, kt + BK, kend);
            cp_async_commit();
        }
        const unsigned sK = sKV + 2 * cur * TILE, sV = sK + TILE;

        // S = Q K^T (16 queries of this warp x BK keys)
        float s[NB][4];
#pragma unroll
        for (int b = 0; b < NB; ++b) s[b][0] = s[b][1] = s[b][2] = s[b][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KQ; ks += 2)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sK + 8 * b * S + k_lane + 32 * ks, b0, b1, b2, b3);
                M::mma(s[b], qa[ks], b0, b1);
                M::mma(s[b], qa[ks + 1], b2, b3);
            }

        // online softmax over the tile (log2 units); a row's statistics live in its 4 lanes (t = 0..3)
        online_softmax_tile<NB, D / 2>(reinterpret_cast<float(&)[4 * NB]>(s), reinterpret_cast<float(&)[D / 2]>(o),
                                       m, l, kt + BK > open_end, kt, kend, causal, causal_shift, row0, t, mul);

        // O += P V: P of k-step kk = score blocks 2kk, 2kk + 1 packed in place
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) {
            const unsigned pa[4] = {H::pack(s[2 * kk][0], s[2 * kk][1]), H::pack(s[2 * kk][2], s[2 * kk][3]),
                                    H::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    H::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                unsigned v0, v1, v2, v3;
                ldsm_x4_trans(sV + 16 * kk * S + v_lane + 16 * n, v0, v1, v2, v3);
                M::mma(o[n], pa, v0, v1);
                M::mma(o[n + 1], pa, v2, v3);
            }
        }
    }

    // merge into the running output (16-bit, rounded once) and log-sum-exp (natural-log units)
    merge_rows16<T, D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l,
                       reinterpret_cast<const float(&)[D / 2]>(o));
}
