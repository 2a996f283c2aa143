// Tensor-core dilated-attention forward for FP32 inputs (sm_80+): split-TF32 ("3xTF32") products
// with FP32 accumulation, online softmax in FP32, and the in-place log-sum-exp merge.
//
// Same problem geometry and merge contract as dilated_fwd_fp32.cu (see there):
// problems numbered (segment, head-in-group), rows addressed by element offsets,
// query i sees key j when j < mk and, if causal, j <= i + causal_shift, and the
// result is merged into O/L by log-sum-exp.
//
// Accuracy: every FP32 operand x is split into x_hi = tf32(x) and x_lo = tf32(x - x_hi); a product
// is a_lo*b_hi + a_hi*b_lo + a_hi*b_hi (three mma.sync m16n8k8 TF32 ops, small terms first), which
// keeps about 21 bits of each product: FP32-level results on tensor cores. The tensor cores add with
// truncation, so the products of TF32X3_GROUP k-steps (16 dimensions of Q K^T, 16 keys of P V) go
// into a zeroed accumulator that is then added in FP32 (round to nearest): the bias of truncation
// never builds up over the head dimension or the key loop. (Accumulating straight into the running
// output gave 10x the error of the FMA kernels on 4,096-key segments; this gives about half of it.)
//
// Block: 4 warps x 16 queries = 64 queries; key tiles of 32, two buffers: cp.async brings the next
// K/V tile while the current one is computed. Shared memory holds Q (pre-scaled by scale*log2 e) and
// the K and V tiles as [row][D + 4] floats: the +4 pad makes every fragment load below hit 32
// distinct banks. Warp w owns queries 16w..16w+15; lane = 4*g + t holds, per 8-key block, the scores
// of rows g and g+8 at keys 2t and 2t+1 (the accumulator layout). For P V the scores are used in
// place as the A operand by numbering the keys of each 8-block k' = t <-> key 2t and
// k' = t+4 <-> key 2t+1, and reading V's rows in the same order: no shuffles, no shared P tile.
// Only tiles at the causal or length boundary are masked. Registers are capped for 4 blocks
// (16 warps) per SM where shared memory allows (D <= 64).
// Every row offset must be a multiple of 4 elements (float4 loads, 16-byte cp.async).

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "mask.cuh"
#include "attention.cuh"

#define MMA_WARPS 4
#define MMA_BQ (16 * MMA_WARPS)
#define MMA_BK 32
#ifndef TF32X3_GROUP
#define TF32X3_GROUP 2
#endif

// rows [0, rows) x D floats from global (row stride `stride`, offset `off`) into shared [row][D + 4]
template <int D>
__device__ __forceinline__ void load_tile(float* dst, const float* __restrict__ src, long long off, long long stride,
                                          int first, int rows, int limit, float mul) {
    constexpr int S = D + 4;
    for (int idx = threadIdx.x; idx < rows * (D / 4); idx += MMA_WARPS * 32) {
        const int r = idx / (D / 4), d4 = idx % (D / 4), j = first + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (j < limit) x = *reinterpret_cast<const float4*>(src + off + j * stride + 4 * d4);
        x.x *= mul; x.y *= mul; x.z *= mul; x.w *= mul;
        *reinterpret_cast<float4*>(dst + r * S + 4 * d4) = x;
    }
}

// the same copy without registers (cp.async, 16 bytes a thread, rows past `limit` zero-filled);
// completes at cp_async_wait
template <int D>
__device__ __forceinline__ void load_tile_async(float* dst, const float* __restrict__ src, long long off,
                                                long long stride, int first, int rows, int limit) {
    constexpr int S = D + 4;
    for (int idx = threadIdx.x; idx < rows * (D / 4); idx += MMA_WARPS * 32) {
        const int r = idx / (D / 4), d4 = idx % (D / 4), j = first + r;
        const float* from = src + off + (long long)min(j, limit - 1) * stride + 4 * d4;
        const unsigned to = (unsigned)__cvta_generic_to_shared(dst + r * S + 4 * d4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                     "r"(j < limit ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// blocks per SM the register budget is cut for: four (16 warps) where shared memory allows
template <int D>
struct MinBlocks {
    static constexpr int value = D <= 64 ? 4 : 2;
};

template <int D>
__global__ void __launch_bounds__(MMA_WARPS * 32, MinBlocks<D>::value)
dilated_fwd_tf32x3(DILATED_FWD_PARAMS)
{
    constexpr int S = D + 4;                             // padded row of every shared tile
    constexpr int NB = MMA_BK / 8;                       // 8-key blocks per key tile
    constexpr int ND = D / 8;                            // 8-column blocks of the output (and k-steps of Q K^T)
    constexpr int GROUP = TF32X3_GROUP;                  // 8-wide k-steps per fresh accumulator
    static_assert(ND % GROUP == 0 && NB % GROUP == 0, "GROUP must divide the k-steps");
    extern __shared__ float smem[];
    float* sQ = smem;                                    // [MMA_BQ][S]
    float* sKV = sQ + MMA_BQ * S;                        // 2 x (K [MMA_BK][S], V [MMA_BK][S])

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int qblock = blockIdx.y * MMA_BQ;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int kend = visible_key_end(mk, causal, qblock + MMA_BQ, causal_shift);
    if (kend > 0) {                                      // first K/V tile in flight while Q is stored
        load_tile_async<D>(sKV, k, koff, k_row, 0, MMA_BK, kend);
        load_tile_async<D>(sKV + MMA_BK * S, v, voff, v_row, 0, MMA_BK, kend);
    }
    load_tile<D>(sQ, q, qoff, q_row, qblock, MMA_BQ, mq, scale * LOG2E);   // scores in log2 units

    const int row0 = qblock + 16 * warp + g;             // this lane's two query rows: row0, row0 + 8
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const float* qw = sQ + (16 * warp + g) * S + t;
    // queries of this block see every key of a tile below this bound without a mask
    const int open_end = unmasked_key_end(kend, causal, qblock, causal_shift);

    for (int kt = 0, stage = 0; kt < kend; kt += MMA_BK, stage ^= 1) {
        const float* sK = sKV + stage * 2 * MMA_BK * S;
        const float* sV = sK + MMA_BK * S;
        if (kt + MMA_BK < kend) {                        // next tile into the other buffer (free since the
            float* nK = sKV + (1 - stage) * 2 * MMA_BK * S;                  // barrier that ended the last step)
            load_tile_async<D>(nK, k, koff, k_row, kt + MMA_BK, MMA_BK, kend);
            load_tile_async<D>(nK + MMA_BK * S, v, voff, v_row, kt + MMA_BK, MMA_BK, kend);
            cp_async_wait<2>();                          // this tile's two groups are done
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        // S = Q K^T for this warp's 16 queries x MMA_BK keys; GROUP k-steps per fresh accumulator
        float s[NB][4];
#pragma unroll
        for (int b = 0; b < NB; ++b) s[b][0] = s[b][1] = s[b][2] = s[b][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < ND; ks += GROUP) {
            unsigned ahi[GROUP][4], alo[GROUP][4];
#pragma unroll
            for (int u = 0; u < GROUP; ++u) {
                const int c0 = 8 * (ks + u);
                split_tf32(qw[c0], ahi[u][0], alo[u][0]);
                split_tf32(qw[8 * S + c0], ahi[u][1], alo[u][1]);
                split_tf32(qw[c0 + 4], ahi[u][2], alo[u][2]);
                split_tf32(qw[8 * S + c0 + 4], ahi[u][3], alo[u][3]);
            }
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const float* kr = sK + (8 * b + g) * S + 8 * ks + t;
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // fresh, then added in FP32 (see above)
#pragma unroll
                for (int u = 0; u < GROUP; ++u) mma_3xtf32(c, ahi[u], alo[u], kr[8 * u], kr[8 * u + 4]);
                s[b][0] += c[0]; s[b][1] += c[1]; s[b][2] += c[2]; s[b][3] += c[3];
            }
        }

        // online softmax over the tile (Q pre-scaled: mul = 1); a row's statistics live in its 4 lanes
        online_softmax_tile<NB, 4 * ND>(reinterpret_cast<float(&)[4 * NB]>(s), reinterpret_cast<float(&)[4 * ND]>(o),
                                        m, l, kt + MMA_BK > open_end, kt, kend, causal, causal_shift, row0, t, 1.0f);

        // O += P V: A = the scores of 8-key block b in place (k' = t <-> key 2t, k' = t + 4 <-> key 2t + 1);
        // GROUP 8-key blocks per fresh accumulator
#pragma unroll
        for (int b = 0; b < NB; b += GROUP) {
            unsigned ahi[GROUP][4], alo[GROUP][4];
#pragma unroll
            for (int u = 0; u < GROUP; ++u) {
                split_tf32(s[b + u][0], ahi[u][0], alo[u][0]);   // row g,     key 2t
                split_tf32(s[b + u][2], ahi[u][1], alo[u][1]);   // row g + 8, key 2t
                split_tf32(s[b + u][1], ahi[u][2], alo[u][2]);   // row g,     key 2t + 1
                split_tf32(s[b + u][3], ahi[u][3], alo[u][3]);   // row g + 8, key 2t + 1
            }
            const float* vr = sV + (8 * b + 2 * t) * S + g;
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int u = 0; u < GROUP; ++u)
                    mma_3xtf32(c, ahi[u], alo[u], vr[8 * u * S + 8 * n], vr[(8 * u + 1) * S + 8 * n]);
                o[n][0] += c[0]; o[n][1] += c[1]; o[n][2] += c[2]; o[n][3] += c[3];
            }
        }
        __syncthreads();                                 // this tile's buffers are free for the next load
    }

    // merge into the running output and log-sum-exp (natural-log units)
    merge_rows32<D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, reinterpret_cast<const float(&)[D / 2]>(o));
}
