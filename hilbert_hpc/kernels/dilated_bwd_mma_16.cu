// Tensor-core dilated-attention backward for 16-bit inputs (bfloat16 or float16) on compute capability 8.0
// and newer: mma.sync m16n8k16 with FP32 accumulation, FlashAttention-2 order (a block owns a tile of keys
// and loops over the query tiles that see them). Arguments and semantics: DILATED_BWD_PARAMS (common.cuh),
// docs/semantics.md section 10; rows aligned to 8 elements (16 bytes), mq and mk arbitrary.
//
// Grid: x = segments * heads problems (DILATED_FWD_PROBLEM_OFFSETS), y = key blocks of BK keys. Block: BK / 16
// warps, each owning 16 keys; BQ queries a tile (BwdQueries16: 64 for D <= 64, 32 above).
// Shared memory (bytes), rows padded to D + 8 (dS^T rows to BQ + 8) elements:
//   K, V tiles           2 * BK * 2 (D + 8)
//   Q, dO, two stages    4 * BQ * 2 (D + 8)
//   dS^T (16-bit)        BK * 2 (BQ + 8)
//   L, delta, two stages 16 * BQ
//   total = 4 (D + 8) (BK + 2 BQ) + 2 BK (BQ + 8) + 16 BQ
//   (BK = 64: D 32: 40960, 64: 65536, 96: 58880, 128: 75264; BK = 128: 60416, 93184, 90624, 115200)
//
// Per query tile (Q, dO, L, delta staged by cp.async and registers one tile ahead), each warp with its 16 keys:
//   S^T = K Q^T (A: K rows, ldmatrix; B: Q rows, ldmatrix) -> P^T = exp2(scale log2e S^T - L log2e), 0 for
//   invisible pairs (masks only on boundary tiles) and for rows with L = -inf or past mq (L staged as +inf);
//   dV += P^T dO (P^T repacked in place to 16-bit A fragments; B: dO rows, ldmatrix.trans);
//   dP^T = V dO^T; dS^T = P^T (dP^T - delta); dK += dS^T Q (B: Q rows, ldmatrix.trans);
//   dS^T to shared memory (16-bit), then the block computes dQ(tile) = dS K (units of 16 queries x 32
//   columns spread over the warps; A: dS^T rows, ldmatrix.trans; B: K rows, ldmatrix.trans) and adds
//   scale dQ to the float32 dq (red.global.add.v2.f32 on compute capability 9.0+, two atomicAdd below).
// At the end dK is scaled and dK, dV are added to dk, dv (read-add-write: a key row belongs to one block).
// Measured on an H100 (tests/scripts/bwd_mma16_check.py, 2026-11-25; N = 262,144, patterns (2048,1) (4096,2)
// (8192,4), bf16): BK = 128 beats BK = 64 for every D (D = 64, H = 12: 191 vs 126 useful TFLOP/s, causal 168
// vs 117; D = 128, H = 8: 198 vs 129): half the dQ atomics and Q / dO tile loads per key.
// Fragments (lane = 4 g + t) as in dilated_fwd_mma_16.cu: accumulators c[2 h + e] = (row g + 8 h, column
// 2 t + e) of each 16 x 8 block.

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "mask.cuh"
#include "backward.cuh"

// queries of one tile of the backward: registers (S^T and dP^T: BQ / 2 each) and shared memory for D > 64
template <int D>
struct BwdQueries16 {
    static constexpr int value = D <= 64 ? 64 : 32;
};

// rows [r0, r0 + ROWS) of a D-wide 16-bit matrix (row j at src + off + j * row_stride elements; rows at or
// past rend are zero-filled) into shared rows of D + 8 elements at byte address dst; one 16-byte cp.async
// per 8 columns, no commit
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void stage_rows(unsigned dst, const T* __restrict__ src, long long off,
                                           long long row_stride, int r0, int rend) {
    constexpr int KC = D / 8, S = 2 * (D + 8);
#pragma unroll 4
    for (int p = threadIdx.x; p < ROWS * KC; p += THREADS) {
        const int r = p / KC, c = p % KC, j = r0 + r;
        const T* from = src + off + (long long)max(0, min(j, rend - 1)) * row_stride + 8 * c;
        cp_async_16(dst + r * S + 16 * c, from, j < rend ? 16 : 0);
    }
}

template <typename T, int D, int BK>
__global__ void __launch_bounds__(32 * BK / 16)
dilated_bwd_mma_16(DILATED_BWD_PARAMS(T))
{
    allow_next_launch();                     // backward.cuh: programmatic dependent launch
    using H = Half16<T>;
    using M = Mma16<T>;
    constexpr int NW = BK / 16, THREADS = 32 * NW;
    constexpr int BQ = BwdQueries16<D>::value;
    constexpr int S = 2 * (D + 8);           // bytes per padded row of K, V, Q, dO
    constexpr int SS = 2 * (BQ + 8);         // bytes per padded row of dS^T
    constexpr int KD = D / 16;               // k-steps over the head dimension
    constexpr int NQ = BQ / 8;               // 8-query blocks of a score tile
    constexpr int KQ = BQ / 16;              // k-steps over the queries of a tile
    constexpr int ND = D / 8;                // 8-column blocks of dK, dV
    constexpr int QTILE = BQ * S;            // bytes of one Q or dO tile
    constexpr int OFF_Q = 2 * BK * S;        // stage s: Q at OFF_Q + 2 s QTILE, dO at OFF_Q + (2 s + 1) QTILE
    constexpr int OFF_DS = OFF_Q + 4 * QTILE;
    constexpr int OFF_L = OFF_DS + BK * SS;  // stage s: L at float 2 s BQ, delta at float (2 s + 1) BQ
    static_assert(D % 32 == 0 && (BK == 64 || BK == 128), "D: a multiple of 32; BK: 64 or 128");

    extern __shared__ __align__(16) unsigned char smem16[];
    const unsigned sK = (unsigned)__cvta_generic_to_shared(smem16);
    const unsigned sV = sK + BK * S;
    const unsigned sdS = sK + OFF_DS;
    float* const sL = reinterpret_cast<float*>(smem16 + OFF_L);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mi = lane >> 3, r8 = lane & 7; // ldmatrix: this lane addresses row r8 of matrix mi
    const int k0 = blockIdx.y * BK;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int q_begin = first_visible_query(causal, k0, causal_shift);
    if (q_begin >= mq) return;               // no query sees these keys (uniform)

    stage_rows<T, D, BK, THREADS>(sK, k, koff, k_row, k0, mk);
    stage_rows<T, D, BK, THREADS>(sV, v, voff, v_row, k0, mk);
    stage_rows<T, D, BQ, THREADS>(sK + OFF_Q, q, qoff, q_row, q_begin, mq);
    stage_rows<T, D, BQ, THREADS>(sK + OFF_Q + QTILE, dout, qoff, q_row, q_begin, mq);
    cp_async_commit();
    float next_l = 0.0f, next_d = 0.0f;      // L and delta of row threadIdx.x of the next tile
    if (threadIdx.x < BQ) {
        query_stats(lse, delta, loff, l_row, q_begin + threadIdx.x, mq, next_l, next_d);
        sL[threadIdx.x] = next_l;
        sL[BQ + threadIdx.x] = next_d;
    }

    // per-lane byte offsets of the ldmatrix rows
    const unsigned a_lane = (16 * warp + r8 + 8 * (mi & 1)) * S + 16 * (mi >> 1);  // A: this warp's K / V rows
    const unsigned b_lane = r8 * S + 16 * mi;                 // B (n = row): + 8 b S (row block) + 32 ks
    const unsigned t_lane = (8 * (mi & 1) + r8) * S + 16 * (mi >> 1);  // B (k = row), trans: + 16 kk S + 16 n
    const unsigned ds_lane = (8 * (mi >> 1) + r8) * SS + 16 * (mi & 1); // A = dS from dS^T, trans
    const int key0 = k0 + 16 * warp + g;     // this thread's keys: key0, key0 + 8
    const float mul = scale * LOG2E;

    float gk[ND][4], gv[ND][4];              // dK, dV of this warp's 16 keys
#pragma unroll
    for (int n = 0; n < ND; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) gk[n][e] = gv[n][e] = 0.0f;

    for (int q0 = q_begin, it = 0; q0 < mq; q0 += BQ, ++it) {
        const int cur = it & 1;
        const bool more = q0 + BQ < mq;
        cp_async_wait_all();
        __syncthreads();                     // tile q0 landed; every warp is done with tile q0 - BQ and dS^T
        if (more) {                          // the next tile into the other stage (read last in tile q0 - BQ)
            const unsigned st = sK + OFF_Q + 2 * (cur ^ 1) * QTILE;
            stage_rows<T, D, BQ, THREADS>(st, q, qoff, q_row, q0 + BQ, mq);
            stage_rows<T, D, BQ, THREADS>(st + QTILE, dout, qoff, q_row, q0 + BQ, mq);
            cp_async_commit();
            if (threadIdx.x < BQ) query_stats(lse, delta, loff, l_row, q0 + BQ + threadIdx.x, mq, next_l, next_d);
        }
        const unsigned sQ = sK + OFF_Q + 2 * cur * QTILE, sO = sQ + QTILE;
        const float* const lt = sL + 2 * cur * BQ;
        const float* const dt = lt + BQ;
        const bool masked = tile_needs_mask<BK>(k0, q0, mk, causal, causal_shift);

        // S^T = K Q^T (16 keys of this warp x BQ queries): s[b][2 h + e] = (key key0 + 8 h, query q0 + 8 b + 2 t + e)
        float s[NQ][4];
#pragma unroll
        for (int b = 0; b < NQ; ++b) s[b][0] = s[b][1] = s[b][2] = s[b][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KD; ks += 2) {
            unsigned a0[4], a1[4];
            ldsm_x4(sK + a_lane + 32 * ks, a0[0], a0[1], a0[2], a0[3]);
            ldsm_x4(sK + a_lane + 32 * ks + 32, a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
            for (int b = 0; b < NQ; ++b) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sQ + 8 * b * S + b_lane + 32 * ks, b0, b1, b2, b3);
                M::mma(s[b], a0, b0, b1);
                M::mma(s[b], a1, b2, b3);
            }
        }

        // P^T = exp2(mul S^T - L log2 e); 0 for keys past mk and, if causal, past i + causal_shift
#pragma unroll
        for (int b = 0; b < NQ; ++b) {
            const float2 l2 = *reinterpret_cast<const float2*>(lt + 8 * b + 2 * t);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                s[b][2 * h] = exp2f(fmaf(s[b][2 * h], mul, -l2.x));
                s[b][2 * h + 1] = exp2f(fmaf(s[b][2 * h + 1], mul, -l2.y));
                if (masked) {
                    const int j = key0 + 8 * h, i = q0 + 8 * b + 2 * t;
                    mask_query_pair(s[b][2 * h], s[b][2 * h + 1], i, j, mk, causal, causal_shift);
                }
            }
        }

        // dV += P^T dO: k-step kk = queries 16 kk .. 16 kk + 15 = score blocks 2 kk, 2 kk + 1 packed in pairs
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            const unsigned pa[4] = {H::pack(s[2 * kk][0], s[2 * kk][1]), H::pack(s[2 * kk][2], s[2 * kk][3]),
                                    H::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    H::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_trans(sO + 16 * kk * S + t_lane + 16 * n, b0, b1, b2, b3);
                M::mma(gv[n], pa, b0, b1);
                M::mma(gv[n + 1], pa, b2, b3);
            }
        }

        // dP^T = V dO^T, then dS^T = P^T (dP^T - delta), in place of P^T
        {
            float dp[NQ][4];
#pragma unroll
            for (int b = 0; b < NQ; ++b) dp[b][0] = dp[b][1] = dp[b][2] = dp[b][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KD; ks += 2) {
                unsigned a0[4], a1[4];
                ldsm_x4(sV + a_lane + 32 * ks, a0[0], a0[1], a0[2], a0[3]);
                ldsm_x4(sV + a_lane + 32 * ks + 32, a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
                for (int b = 0; b < NQ; ++b) {
                    unsigned b0, b1, b2, b3;
                    ldsm_x4(sO + 8 * b * S + b_lane + 32 * ks, b0, b1, b2, b3);
                    M::mma(dp[b], a0, b0, b1);
                    M::mma(dp[b], a1, b2, b3);
                }
            }
#pragma unroll
            for (int b = 0; b < NQ; ++b) {
                const float2 d2 = *reinterpret_cast<const float2*>(dt + 8 * b + 2 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    s[b][2 * h] *= dp[b][2 * h] - d2.x;
                    s[b][2 * h + 1] *= dp[b][2 * h + 1] - d2.y;
                }
            }
        }

        // dK += dS^T Q, and dS^T (16-bit) into shared memory: row key - k0, column query - q0
        const unsigned ds_row = sdS + (16 * warp + g) * SS + 4 * t;
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            const unsigned da[4] = {H::pack(s[2 * kk][0], s[2 * kk][1]), H::pack(s[2 * kk][2], s[2 * kk][3]),
                                    H::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    H::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            st_shared_b32(ds_row + 32 * kk, da[0]);
            st_shared_b32(ds_row + 8 * SS + 32 * kk, da[1]);
            st_shared_b32(ds_row + 32 * kk + 16, da[2]);
            st_shared_b32(ds_row + 8 * SS + 32 * kk + 16, da[3]);
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_trans(sQ + 16 * kk * S + t_lane + 16 * n, b0, b1, b2, b3);
                M::mma(gk[n], da, b0, b1);
                M::mma(gk[n + 1], da, b2, b3);
            }
        }
        __syncthreads();                     // dS^T of every warp is in shared memory

        // dQ(tile) += scale dS K: units of 16 queries (rg) x 32 columns (cc), spread over the warps
        for (int u = warp; u < KQ * (D / 32); u += NW) {
            const int rg = u % KQ, cc = u / KQ;
            float c[4][4];
#pragma unroll
            for (int n = 0; n < 4; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                unsigned a[4];
                ldsm_x4_trans(sdS + 16 * kk * SS + ds_lane + 32 * rg, a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int n = 0; n < 4; n += 2) {
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_trans(sK + 16 * kk * S + t_lane + 16 * (4 * cc + n), b0, b1, b2, b3);
                    M::mma(c[n], a, b0, b1);
                    M::mma(c[n + 1], a, b2, b3);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = q0 + 16 * rg + g + 8 * h;
                if (i >= mq) continue;
                float* row = dq + qoff + i * q_row + 32 * cc + 2 * t;
#pragma unroll
                for (int n = 0; n < 4; ++n) add_pair(row + 8 * n, scale * c[n][2 * h], scale * c[n][2 * h + 1]);
            }
        }
        if (more && threadIdx.x < BQ) {      // L and delta of the next tile (stage cur ^ 1 read last in q0 - BQ)
            sL[2 * (cur ^ 1) * BQ + threadIdx.x] = next_l;
            sL[(2 * (cur ^ 1) + 1) * BQ + threadIdx.x] = next_d;
        }
    }

    add_key_gradients<ND>(dk, dv, koff, voff, k_row, v_row, key0, mk, t, scale, gk, gv);
}
