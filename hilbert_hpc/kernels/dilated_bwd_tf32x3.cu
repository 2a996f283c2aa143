// Tensor-core dilated-attention backward for float32 inputs on compute capability 8.0 and newer: split-TF32
// mma.sync m16n8k8 (every operand x = hi + lo in TF32, a product hi*hi + hi*lo + lo*hi, FP32 accumulation, as
// dilated_fwd_tf32x3.cu), FlashAttention-2 order as dilated_bwd_mma_16.cu (a block owns a tile of keys and
// loops over the query tiles that see them). Arguments and semantics: DILATED_BWD_PARAMS (common.cuh),
// docs/semantics.md section 10; rows aligned to 4 elements (16 bytes), mq and mk arbitrary.
//
// Grid: x = segments * heads problems (DILATED_FWD_PROBLEM_OFFSETS), y = key blocks of BK keys. Block: BK / 16
// warps, each owning 16 keys; query tiles of BQ = 32 rows. Shared memory (bytes), float32 rows padded to D + 4
// (dS^T rows to BQ + 4) elements, so that every fragment load below hits 32 distinct banks:
//   K, V tiles           2 * BK * 4 (D + 4)
//   Q, dO, two stages    4 * BQ * 4 (D + 4)
//   dS^T                 BK * 4 (BQ + 4)
//   L, delta, two stages 16 * BQ
//   total = 8 (D + 4) (BK + 2 BQ) + 4 BK (BQ + 4) + 16 BQ
//   (BK = 64: D 32: 46592, 64: 79360, 96: 112128, 128: 144896; BK = 128: 74240, 123392, 172544, 221696)
//
// Per query tile (Q, dO, L, delta staged by cp.async and registers one tile ahead), each warp with its 16 keys:
//   S^T = K Q^T -> P^T = exp2(scale log2e S^T - L log2e), 0 for invisible pairs (masks only on boundary tiles)
//   and for rows with L = -inf or past mq (L staged as +inf); dV += P^T dO (P^T split in place into A
//   fragments); dP^T = V dO^T; dS^T = P^T (dP^T - delta); dK += dS^T Q; dS^T (float32) to shared memory, then
//   the block computes dQ(tile) = dS K in units of 16 queries x 8 CN columns spread over the warps and adds
//   scale dQ to the float32 dq (red.global.add.v2.f32 on compute capability 9.0+, two atomicAdd below).
// At the end dK is scaled and dK, dV are added to dk, dv (read-add-write: a key row belongs to one block).
//
// Fragments of m16n8k8 (lane = 4 g + t): A a0 = (g, k t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4);
// B b0 = (k t, n g), b1 = (t + 4, g); C c[2 h + e] = (g + 8 h, 2 t + e). Where the k dimension runs over
// queries or keys (P^T dO, dS^T Q, dS K) it is numbered k' = t <-> 2 t, k' = t + 4 <-> 2 t + 1 within each
// 8-block (as the forward's P V): the accumulators of S^T serve as A fragments in place, and the B rows 2 t,
// 2 t + 1 of a row stride = 4 (mod 32) floats hit distinct banks. The products of TF32X3_BWD_GROUP k-steps go
// into a zeroed accumulator that is then added in FP32: the tensor cores' truncating adds never build up a
// bias over the head dimension or the query loop (dilated_fwd_tf32x3.cu).

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "mask.cuh"
#include "backward.cuh"

#define TF32X3_BWD_BQ 32
#define TF32X3_BWD_GROUP 2

// rows [r0, r0 + ROWS) of a D-wide float32 matrix (row j at src + off + j * row_stride; rows at or past rend
// zero-filled) into shared rows of D + 4 floats at dst; one 16-byte cp.async per 4 columns, no commit
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void stage_rows32(float* dst, const float* __restrict__ src, long long off,
                                             long long row_stride, int r0, int rend) {
    constexpr int KC = D / 4, S = D + 4;
#pragma unroll 4
    for (int p = threadIdx.x; p < ROWS * KC; p += THREADS) {
        const int r = p / KC, c = p % KC, j = r0 + r;
        const float* from = src + off + (long long)max(0, min(j, rend - 1)) * row_stride + 4 * c;
        cp_async_16((unsigned)__cvta_generic_to_shared(dst + r * S + 4 * c), from, j < rend ? 16 : 0);
    }
}

// one float of shared memory, in program order with the mma.sync around it (asm volatile: the compiler hoists
// no B fragments of later products, which would cost registers that dK and dV hold)
__device__ __forceinline__ float lds32(const float* p) {
    float x;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"((unsigned)__cvta_generic_to_shared(p)));
    return x;
}

// C (16 keys x 8 NB queries) = A B^T over D dimensions: A rows a (this warp's 16 keys, row stride D + 4),
// B rows b (the tile's queries, row stride D + 4); c[n][2 h + e] = (key g + 8 h, query 8 n + 2 t + e)
template <int D, int NB>
__device__ __forceinline__ void keys_by_queries(float (&c)[NB][4], const float* a, const float* b) {
    constexpr int S = D + 4, GROUP = TF32X3_BWD_GROUP;
#pragma unroll
    for (int n = 0; n < NB; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 8; ks += GROUP) {
        unsigned ahi[GROUP][4], alo[GROUP][4];
#pragma unroll
        for (int u = 0; u < GROUP; ++u) {
            const int c0 = 8 * (ks + u);
            split_tf32(a[c0], ahi[u][0], alo[u][0]);
            split_tf32(a[8 * S + c0], ahi[u][1], alo[u][1]);
            split_tf32(a[c0 + 4], ahi[u][2], alo[u][2]);
            split_tf32(a[8 * S + c0 + 4], ahi[u][3], alo[u][3]);
        }
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const float* br = b + 8 * n * S + 8 * ks;
            float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int u = 0; u < GROUP; ++u) mma_3xtf32(f, ahi[u], alo[u], lds32(br + 8 * u), lds32(br + 8 * u + 4));
            c[n][0] += f[0]; c[n][1] += f[1]; c[n][2] += f[2]; c[n][3] += f[3];
        }
    }
}

// acc (16 keys x D) += X B: X (16 keys x 8 NB queries) in accumulator layout (keys_by_queries), B rows the
// tile's queries (row stride D + 4) starting at b = row 2 t, column g; a zeroed accumulator per 8 queries
template <int D, int NB>
__device__ __forceinline__ void add_keys_by_dims(float (&acc)[D / 8][4], const float (&x)[NB][4], const float* b) {
    constexpr int S = D + 4;
#pragma unroll
    for (int kb = 0; kb < NB; ++kb) {
        unsigned ahi[4], alo[4];
        split_tf32(x[kb][0], ahi[0], alo[0]);   // key g,     query 2t
        split_tf32(x[kb][2], ahi[1], alo[1]);   // key g + 8, query 2t
        split_tf32(x[kb][1], ahi[2], alo[2]);   // key g,     query 2t + 1
        split_tf32(x[kb][3], ahi[3], alo[3]);   // key g + 8, query 2t + 1
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const float* br = b + 8 * kb * S + 8 * n;
            float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_3xtf32(f, ahi, alo, lds32(br), lds32(br + S));
            acc[n][0] += f[0]; acc[n][1] += f[1]; acc[n][2] += f[2]; acc[n][3] += f[3];
        }
    }
}

template <int D, int BK>
__global__ void __launch_bounds__(2 * BK)
dilated_bwd_tf32x3(DILATED_BWD_PARAMS(float))
{
    allow_next_launch();                     // backward.cuh: programmatic dependent launch
    constexpr int NW = BK / 16, THREADS = 32 * NW;
    constexpr int BQ = TF32X3_BWD_BQ;
    constexpr int S = D + 4;                 // floats per padded row of K, V, Q, dO
    constexpr int SS = BQ + 4;               // floats per padded row of dS^T
    constexpr int NQ = BQ / 8;               // 8-query blocks of a score tile
    constexpr int KQ = BQ / 16;              // 16-query row groups of dQ
    constexpr int ND = D / 8;                // 8-column blocks of dK, dV, dQ
    constexpr int CN = (ND * KQ >= 2 * NW) ? ND * KQ / NW : 1;   // 8-column blocks of one dQ unit
    constexpr int UNITS = KQ * ND / CN;      // dQ units of a tile (16 queries x 8 CN columns)
    constexpr int QTILE = BQ * S;            // floats of one Q or dO tile
    static_assert(D % 32 == 0 && (BK == 64 || BK == 128), "D: a multiple of 32; BK: 64 or 128");
    static_assert(ND % CN == 0 && ND % TF32X3_BWD_GROUP == 0, "tile shapes");

    extern __shared__ __align__(16) float smem32[];
    float* const sK = smem32;                // [BK][S]
    float* const sV = sK + BK * S;           // [BK][S]
    float* const sQ0 = sV + BK * S;          // stage s: Q at sQ0 + 2 s QTILE, dO at sQ0 + (2 s + 1) QTILE
    float* const sdS = sQ0 + 4 * QTILE;      // [BK][SS]: dS^T, row key - k0, column query - q0
    float* const sL = sdS + BK * SS;         // stage s: L at 2 s BQ, delta at (2 s + 1) BQ

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.y * BK;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int q_begin = first_visible_query(causal, k0, causal_shift);
    if (q_begin >= mq) return;               // no query sees these keys (uniform)

    stage_rows32<D, BK, THREADS>(sK, k, koff, k_row, k0, mk);
    stage_rows32<D, BK, THREADS>(sV, v, voff, v_row, k0, mk);
    stage_rows32<D, BQ, THREADS>(sQ0, q, qoff, q_row, q_begin, mq);
    stage_rows32<D, BQ, THREADS>(sQ0 + QTILE, dout, qoff, q_row, q_begin, mq);
    cp_async_commit();
    float next_l = 0.0f, next_d = 0.0f;      // L and delta of row threadIdx.x of the next tile
    if (threadIdx.x < BQ) {
        query_stats(lse, delta, loff, l_row, q_begin + threadIdx.x, mq, next_l, next_d);
        sL[threadIdx.x] = next_l;
        sL[BQ + threadIdx.x] = next_d;
    }

    const int key0 = k0 + 16 * warp + g;     // this thread's keys: key0, key0 + 8
    const float mul = scale * LOG2E;
    const float* const kw = sK + (16 * warp + g) * S + t;   // A fragments of this warp's K rows
    const float* const vw = sV + (16 * warp + g) * S + t;   // and V rows

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
            float* const st = sQ0 + 2 * (cur ^ 1) * QTILE;
            stage_rows32<D, BQ, THREADS>(st, q, qoff, q_row, q0 + BQ, mq);
            stage_rows32<D, BQ, THREADS>(st + QTILE, dout, qoff, q_row, q0 + BQ, mq);
            cp_async_commit();
            if (threadIdx.x < BQ) query_stats(lse, delta, loff, l_row, q0 + BQ + threadIdx.x, mq, next_l, next_d);
        }
        const float* const sQ = sQ0 + 2 * cur * QTILE;
        const float* const sO = sQ + QTILE;
        const float* const lt = sL + 2 * cur * BQ;
        const float* const dt = lt + BQ;
        const bool masked = tile_needs_mask<BK>(k0, q0, mk, causal, causal_shift);

        // S^T = K Q^T: s[b][2 h + e] = (key key0 + 8 h, query q0 + 8 b + 2 t + e)
        float s[NQ][4];
        keys_by_queries<D, NQ>(s, kw, sQ + g * S + t);

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

        // dV += P^T dO
        add_keys_by_dims<D, NQ>(gv, s, sO + 2 * t * S + g);

        // dP^T = V dO^T, then dS^T = P^T (dP^T - delta), in place of P^T
        {
            float dp[NQ][4];
            keys_by_queries<D, NQ>(dp, vw, sO + g * S + t);
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

        // dK += dS^T Q, and dS^T into shared memory
        add_keys_by_dims<D, NQ>(gk, s, sQ + 2 * t * S + g);
        {
            float* const ds_row = sdS + (16 * warp + g) * SS + 2 * t;
#pragma unroll
            for (int b = 0; b < NQ; ++b) {
                *reinterpret_cast<float2*>(ds_row + 8 * b) = make_float2(s[b][0], s[b][1]);
                *reinterpret_cast<float2*>(ds_row + 8 * SS + 8 * b) = make_float2(s[b][2], s[b][3]);
            }
        }
        __syncthreads();                     // dS^T of every warp is in shared memory

        // dQ(tile) += scale dS K: units of 16 queries (rg) x 8 CN columns (cc), spread over the warps.
        // A = dS: (query, key) = dS^T(key, query); k' numbering over keys as above
        for (int u = warp; u < UNITS; u += NW) {
            const int rg = u % KQ, cc = u / KQ;
            const float* const da = sdS + 2 * t * SS + 16 * rg + g;
            const float* const kb = sK + 2 * t * S + 8 * CN * cc + g;
            float c[CN][4];
#pragma unroll
            for (int n = 0; n < CN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll 1
            for (int kk = 0; kk < BK / 8; ++kk) {
                const float* ar = da + 8 * kk * SS;
                unsigned ahi[4], alo[4];
                split_tf32(ar[0], ahi[0], alo[0]);         // query g,     key 2t
                split_tf32(ar[8], ahi[1], alo[1]);         // query g + 8, key 2t
                split_tf32(ar[SS], ahi[2], alo[2]);        // query g,     key 2t + 1
                split_tf32(ar[SS + 8], ahi[3], alo[3]);    // query g + 8, key 2t + 1
#pragma unroll
                for (int n = 0; n < CN; ++n) {
                    const float* br = kb + 8 * kk * S + 8 * n;
                    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_3xtf32(f, ahi, alo, lds32(br), lds32(br + S));
                    c[n][0] += f[0]; c[n][1] += f[1]; c[n][2] += f[2]; c[n][3] += f[3];
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = q0 + 16 * rg + g + 8 * h;
                if (i >= mq) continue;
                float* row = dq + qoff + i * q_row + 8 * CN * cc + 2 * t;
#pragma unroll
                for (int n = 0; n < CN; ++n) add_pair(row + 8 * n, scale * c[n][2 * h], scale * c[n][2 * h + 1]);
            }
        }
        if (more && threadIdx.x < BQ) {      // L and delta of the next tile (stage cur ^ 1 read last in q0 - BQ)
            sL[2 * (cur ^ 1) * BQ + threadIdx.x] = next_l;
            sL[(2 * (cur ^ 1) + 1) * BQ + threadIdx.x] = next_d;
        }
    }

    add_key_gradients<ND>(dk, dv, koff, voff, k_row, v_row, key0, mk, t, scale, gk, gv);
}
