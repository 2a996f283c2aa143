// Hopper (sm_90a) tensor-core dilated-attention forward for FP32 inputs: warpgroup MMA (wgmma) on
// split-TF32 ("3xTF32") operands prepared once per tile in shared memory, FP32 softmax, and the
// in-place log-sum-exp merge.
//
// Same arguments, problem geometry and merge contract as dilated_fwd_tf32x3.cu and dilated_fwd_fp32.cu:
// problems numbered (segment, head-in-group), rows addressed by element offsets, query i sees key j
// when j < mk and, if causal, j <= i + causal_shift; the result is merged into O/L by log-sum-exp
// (natural-log units), rows with no visible key are left untouched. Rows must be aligned to 4
// elements (16-byte loads). Compiled for sm_90a only (wgmma exists on compute capability 9.0 alone).
//
// Block: WG warpgroups of 128 threads; warpgroup w owns queries 64w..64w+63 of the block's 64*WG.
// Key tiles of BK keys. Per tile:
//   1. cp.async has brought the raw K rows (into sKst, core-matrix order) and V rows (into sVst,
//      [key][D + 4]) while the previous tile was computed;
//   2. all threads split them once: K -> sKhi/sKlo (same order), V -> transposed, key-permuted
//      sVhi/sVlo (V^T, the K-major B operand of P V); then the next tile's cp.async starts;
//   3. S = Q K^T: wgmma m64n{BK}k8, A = Q (hi/lo, split once per block) and B = K from shared memory;
//   4. online softmax in FP32 on the accumulator registers (exp2; scale * log2 e is folded into Q);
//   5. O += P V: wgmma m64n{D/NSPLIT}k8 with A = P from registers (the score accumulator, split into
//      hi/lo in registers) and B = V^T from shared memory.
//
// Accuracy (as in tf32x3): x = hi + lo with hi = tf32(x), lo = tf32(x - hi); a product is
// lo*hi + hi*lo + hi*hi (three wgmma, small terms first). The tensor cores add with truncation, so
// every group of WGMMA_GROUP = 2 k-steps (16 dimensions of Q K^T, 16 keys of P V) is summed by six
// wgmma in a fresh accumulator (scale-d = 0 on its first one) that is then added to S or O in FP32
// (round to nearest). Two fresh accumulators alternate, so the FP32 add of one group overlaps the
// wgmma of the next.
//
// Shared-memory layouts: no swizzle; every wgmma operand is made of "core matrices" of 8 rows x
// 16 bytes (4 TF32), 128 contiguous bytes each. Matrix descriptor: start address, leading-dimension
// byte offset LBO = distance between the two core matrices adjacent in K (the two 16-byte halves of
// a k-step of 8), stride-dimension byte offset SBO = distance between 8-row groups (M or N).
//   Q (A, 64*WG rows x D) and K (B, BK rows x D): [row / 8][chunk = col / 4][row % 8][4];
//     LBO = 128, SBO = 32 * D; k-step ks starts 256 * ks bytes in.
//   V^T (B of P V, D rows x BK keys): [d / 8][chunk = key' / 4][d % 8][4], with 16 bytes of padding
//     after every 8-row group (SBO = 32 * BK + 16) so the transposing stores are free of bank
//     conflicts; LBO = 128; k-step b (keys 8b..8b+7) starts 256 * b bytes in.
// Register fragments (per warp of the warpgroup, lane = 4 g + t, rows relative to the warp's 16):
//   accumulator (m64nN f32): d[4i + 2h + e] = (row g + 8h, column 8i + 2t + e);
//   A from registers (m64nNk8 tf32): a0 = (row g, k t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4).
// So the scores of 8-key block b are A of k-step b in place when the keys of the block are numbered
// k' = t <-> key 2t and k' = t + 4 <-> key 2t + 1 (a = s[4b], s[4b + 2], s[4b + 1], s[4b + 3]);
// V^T stores key 8b + 2i + p at k' = 4p + i. Only tiles at the causal or length boundary are masked.

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "wgmma.cuh"
#include "mask.cuh"
#include "attention.cuh"
#include "tma.cuh"

// k-steps per fresh accumulator. Larger groups are not faster (H100, 2026-11-27, in turns against 2): 4: 1.00x
// at D = 64, 0.98x at D = 128 (relative error 5.0e-7 instead of 3.0e-7); 8: 1.03x at D = 64 (9.7e-7). The adds
// between groups are not what limits the kernel.
#define WGMMA_GROUP 2

template <int N>
__device__ __forceinline__ void add_to(float* acc, const float (&c)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += c[i];
}

// Shared memory of one block, in floats, in this order (every part a multiple of 16 bytes).
template <int D, int BK, int WG>
struct WgmmaSmem {
    static constexpr int BQ = WG_QUERIES * WG;
    static constexpr int Q = BQ * D;                       // sQhi, sQlo
    static constexpr int K = BK * D;                       // sKhi, sKlo, sKst (raw K, same order)
    static constexpr unsigned VT_SBO = 32 * BK + 16;       // bytes from one 8-row group of V^T to the next
    static constexpr int VT = (D / 8) * (int)VT_SBO / 4;   // sVhi, sVlo
    static constexpr int VS = BK * (D + 4);                // sVst: raw V rows, [key][D + 4]
    static constexpr int floats = 2 * Q + 3 * K + 2 * VT + VS;
};

// raw K and V rows [kt, kt + BK) (zero past kend) into the staging tiles, by THREADS threads (this one: tid); one
// cp.async group
template <int D, int BK, int THREADS>
__device__ __forceinline__ void load_kv_async(int tid, float* sKst, float* sVst, const float* __restrict__ k,
                                              const float* __restrict__ v, long long koff, long long k_row,
                                              long long voff, long long v_row, int kt, int kend) {
    constexpr int KC = D / 4;
    // K: 16-byte chunk p at [row / 8][chunk][row % 8] (8 lanes: one chunk of 8 rows, 128 bytes)
    for (int p = tid; p < BK * KC; p += THREADS) {
        const int r = (p / (8 * KC)) * 8 + (p & 7), c = (p >> 3) % KC, j = kt + r;
        const float* from = k + koff + (long long)min(j, kend - 1) * k_row + 4 * c;
        const unsigned to = (unsigned)__cvta_generic_to_shared(sKst + 4 * p);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(j < kend ? 16 : 0));
    }
    // V: row-major [key][D + 4]
    for (int w = tid; w < BK * KC; w += THREADS) {
        const int r = w / KC, c = w % KC, j = kt + r;
        const float* from = v + voff + (long long)min(j, kend - 1) * v_row + 4 * c;
        const unsigned to = (unsigned)__cvta_generic_to_shared(sVst + r * (D + 4) + 4 * c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(j < kend ? 16 : 0));
    }
    cp_async_commit();
}

// the staged tile, split once by THREADS threads (this one: tid): K -> sKhi/sKlo (same order), V -> V^T hi/lo with
// the key permutation
template <int D, int BK, int THREADS>
__device__ __forceinline__ void split_tile(int tid, float* smem_k_hi, float* smem_k_lo, float* smem_v_hi,
                                           float* smem_v_lo, const float* sKst, const float* sVst) {
    using L = WgmmaSmem<D, BK, 1>;
    constexpr int KC = D / 4;
    for (int p = tid; p < BK * KC; p += THREADS) {      // linear: no bank conflicts
        uint4 hi, lo;
        split4(reinterpret_cast<const float4*>(sKst)[p], hi, lo);
        reinterpret_cast<uint4*>(smem_k_hi)[p] = hi;
        reinterpret_cast<uint4*>(smem_k_lo)[p] = lo;
    }
    // work item (m, c): keys 8(m/2) + 2i + (m & 1), i = 0..3 (k' = 4(m & 1) + i of their 8-key block),
    // columns 4c..4c+3. Eight consecutive lanes take eight consecutive c: the reads ((key + c) mod 8
    // 16-byte bank groups, rows padded to D + 4) and the stores (padded SBO) are conflict-free.
    for (int w = tid; w < (BK / 4) * KC; w += THREADS) {
        const int c = w % KC, m = w / KC, j0 = 8 * (m >> 1) + (m & 1);
        const float4 x0 = *reinterpret_cast<const float4*>(sVst + j0 * (D + 4) + 4 * c);
        const float4 x1 = *reinterpret_cast<const float4*>(sVst + (j0 + 2) * (D + 4) + 4 * c);
        const float4 x2 = *reinterpret_cast<const float4*>(sVst + (j0 + 4) * (D + 4) + 4 * c);
        const float4 x3 = *reinterpret_cast<const float4*>(sVst + (j0 + 6) * (D + 4) + 4 * c);
        const float4 col[4] = {make_float4(x0.x, x1.x, x2.x, x3.x), make_float4(x0.y, x1.y, x2.y, x3.y),
                               make_float4(x0.z, x1.z, x2.z, x3.z), make_float4(x0.w, x1.w, x2.w, x3.w)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = 4 * c + e;
            const int at = (d >> 3) * (int)(L::VT_SBO / 16) + 8 * m + (d & 7);   // in 16-byte units
            uint4 hi, lo;
            split4(col[e], hi, lo);
            reinterpret_cast<uint4*>(smem_v_hi)[at] = hi;
            reinterpret_cast<uint4*>(smem_v_lo)[at] = lo;
        }
    }
}

// one group of G k-steps of S = Q K^T into c (fresh: the first wgmma ignores c); k-step ks is 256 bytes on
template <int N, int G>
__device__ __forceinline__ void qk_group(float (&c)[N / 2], desc_t qhi, desc_t qlo, desc_t khi, desc_t klo) {
#pragma unroll
    for (int ks = 0; ks < G; ++ks) {
        const desc_t at = 16 * ks;
        if (ks == 0)
            Wgmma<N>::template ss<0>(c, qlo, khi);
        else
            Wgmma<N>::template ss<1>(c, qlo + at, khi + at);
        Wgmma<N>::template ss<1>(c, qhi + at, klo + at);
        Wgmma<N>::template ss<1>(c, qhi + at, khi + at);
    }
}

// one group of G 8-key blocks (b .. b + G - 1) of O_part += P V into c (fresh)
template <int N, int G, int NB>
__device__ __forceinline__ void pv_group(float (&c)[N / 2], const unsigned (&ph)[NB][4], const unsigned (&pl)[NB][4],
                                         int b, desc_t vhi, desc_t vlo) {
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const desc_t at = 16 * i;
        if (i == 0)
            Wgmma<N>::template rs<0>(c, pl[b], vhi);
        else
            Wgmma<N>::template rs<1>(c, pl[b + i], vhi + at);
        Wgmma<N>::template rs<1>(c, ph[b + i], vlo + at);
        Wgmma<N>::template rs<1>(c, ph[b + i], vhi + at);
    }
}

// Q rows [first, first + rows) of the block (pre-scaled by mul = scale * log2 e: scores in log2 units), split once into
// sQhi/sQlo ([row / 8][chunk][row % 8]) by THREADS threads (this one: tid); rows past mq are zeros
template <int D, int THREADS>
__device__ __forceinline__ void split_queries(int tid, float* sQhi, float* sQlo, int first, int rows,
                                              const float* __restrict__ q, long long qoff, long long q_row, int qblock,
                                              int mq, float mul) {
    constexpr int KC = D / 4;
    for (int p = first * KC + tid; p < (first + rows) * KC; p += THREADS) {
        const int r = (p / (8 * KC)) * 8 + (p & 7), c = (p >> 3) % KC, i = qblock + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < mq) x = *reinterpret_cast<const float4*>(q + qoff + (long long)i * q_row + 4 * c);
        x.x *= mul; x.y *= mul; x.z *= mul; x.w *= mul;
        uint4 hi, lo;
        split4(x, hi, lo);
        reinterpret_cast<uint4*>(sQhi)[p] = hi;
        reinterpret_cast<uint4*>(sQlo)[p] = lo;
    }
}

// ---- The kernel, in two forms ----
//
// STAGES = 0: every thread stages each tile's raw K and V rows by cp.async, and splits it between two block
// barriers into the one split stage; the next tile's rows load while this one is computed.
// STAGES >= 1 (warp-specialized): warpgroup 0 is a producer (with WG > 1 setmaxnreg.dec to PREG registers) whose
// 128 threads stage tile it's rows into the staging buffer, wait for split stage it % STAGES to be free (empty[s]),
// split the tile into it, make the stores visible to the tensor cores' proxy and arrive on full[s] (128 arrivals),
// then stage the next tile's rows; warpgroups 1 .. WG consume (with WG > 1 setmaxnreg.inc to CREG): each splits its
// own 64 queries once, then for every tile waits full[s] (phase (it / STAGES) & 1), computes it and releases the
// stage (empty[s]: one arrival per consumer warp once its products completed). Named barriers: 1 = the producer, 2 + w = consumer w.
// Both forms run the same products in the same order, so they give the same bits.
//
// Per tile and computing warpgroup (64 queries):
//   S = Q K^T, group 0 straight into s, the others into alternating fresh accumulators added to s in FP32;
//   the online softmax (Q pre-scaled: mul = 1; a row's statistics live in its 4 lanes), masked at the causal or
//   length boundary;
//   P split into hi/lo in registers as the A operand in place (k-step b, a = (row g, k' t) (g + 8, t) (g, t + 4)
//   (g + 8, t + 4) = keys 2t, 2t, 2t + 1, 2t + 1 of block b);
//   O += P V: unit u = (key group u / NSPLIT, column part u % NSPLIT) into alternating fresh accumulators, each
//   added to its part of o in FP32 once done.

// Shared memory of a block, in floats: Q hi/lo, max(STAGES, 1) split stages (K hi, K lo, V^T hi, V^T lo), the raw
// K and V staging, then (STAGES >= 1) the 2 STAGES mbarriers (full, then empty).
template <int D, int BK, int WG, int STAGES>
struct WgmmaStages {
    using B = WgmmaSmem<D, BK, WG>;
    static constexpr int NST = STAGES > 0 ? STAGES : 1;
    static constexpr int STAGE = 2 * B::K + 2 * B::VT;
    static constexpr int BARS = 2 * B::Q + NST * STAGE + B::K + B::VS;   // floats before the mbarriers
    static constexpr int bytes = 4 * BARS + 16 * STAGES;
    static_assert(STAGES > 0 || 4 * BARS == 4 * B::floats, "the all-thread form's layout is WgmmaSmem's");
};

// Registers of the warp-specialized form (SplitRegs, tma.cuh): the producer keeps 56 (its cp.async and splits).
// With one consumer warpgroup (256 threads) the launch bound already gives every thread 255 and ptxas would
// cap the block at the consumers' 240, so that form moves no registers.
template <int WG>
using WgmmaWsRegs = SplitRegs<WG, 56>;

// the 128 threads of warpgroup `group` meet at named barrier 1 + group (1: the producer; 2 + w: consumer w)
__device__ __forceinline__ void tf32_warpgroup_sync(int group) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
}

template <int D, int BK, int WG, int NSPLIT, int STAGES = 0>
__global__ void __launch_bounds__(WG_THREADS * (WG + (STAGES > 0)), 1)
dilated_fwd_wgmma_tf32(DILATED_FWD_PARAMS)
{
    using B = WgmmaSmem<D, BK, WG>;
    using L = WgmmaStages<D, BK, WG, STAGES>;
    constexpr bool WS = STAGES > 0;
    constexpr int THREADS = WG_THREADS * WG;   // computing threads
    constexpr int BQ = B::BQ;
    constexpr int ND = D / 8;                // k-steps of Q K^T
    constexpr int NB = BK / 8;               // 8-key blocks = k-steps of P V
    constexpr int NS = BK / 2;               // score registers per thread
    constexpr int NO = D / 2;                // output registers per thread
    constexpr int DN = D / NSPLIT;           // wgmma N of P V (the output in NSPLIT column parts)
    constexpr int NP = DN / 2;               // registers of one part
    constexpr int US = ND / WGMMA_GROUP;     // fresh-accumulator groups of Q K^T
    constexpr int UO = NB / WGMMA_GROUP * NSPLIT;   // ... of P V (group-major, part-minor)
    constexpr unsigned QK_SBO = 32 * D;      // bytes between 8-row groups of Q and K
    static_assert(ND % WGMMA_GROUP == 0 && NB % WGMMA_GROUP == 0 && DN % 16 == 0 && D % NSPLIT == 0, "shape");
    static_assert(BK % 16 == 0 && BK <= 256 && DN <= 256, "wgmma N");
    static_assert(L::bytes <= HOPPER_SMEM, "the block's shared memory exceeds the opt-in limit");

    extern __shared__ __align__(128) float smem[];
    float* sQhi = smem;
    float* sQlo = sQhi + B::Q;
    float* stages = sQlo + B::Q;             // stage s: K hi, K lo, V^T hi, V^T lo at stages + s * L::STAGE
    float* sKst = stages + L::NST * L::STAGE;
    float* sVst = sKst + B::K;
    // the mbarriers: full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)
    const unsigned bars = (unsigned)__cvta_generic_to_shared(smem + L::BARS);

    const int tid = threadIdx.x, wg = tid >> 7;
    const int qblock = blockIdx.y * BQ;
    DILATED_FWD_PROBLEM_OFFSETS;

    const int kend = visible_key_end(mk, causal, qblock + BQ, causal_shift);
    if (kend <= 0) return;                   // no key visible to this block (uniform)

    if (WS) {
        if (tid == 0) {
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(bars + 8 * s, WG_THREADS);
                mbar_init(bars + 8 * (STAGES + s), RELEASE_ARRIVALS * WG);
            }
            mbar_fence_init();
        }
        __syncthreads();
        if (wg == 0) {                       // the producer
            if (WG > 1) setmaxnreg_dec<WgmmaWsRegs<WG>::PREG>();
            const int ntiles = (kend + BK - 1) / BK;
            load_kv_async<D, BK, WG_THREADS>(tid, sKst, sVst, k, v, koff, k_row, voff, v_row, 0, kend);
            for (int it = 0; it < ntiles; ++it) {
                const int s = stage_of<L::NST>(it);
                float* st = stages + s * L::STAGE;
                cp_async_wait_all();
                tf32_warpgroup_sync(0);      // every producer thread's rows of tile it landed
                mbar_wait(bars + 8 * (STAGES + s), phase_of<L::NST>(it) ^ 1);   // stage free (the first pass at once)
                split_tile<D, BK, WG_THREADS>(tid, st, st + B::K, st + 2 * B::K, st + 2 * B::K + B::VT, sKst, sVst);
                fence_async_shared();        // the split stores, visible to wgmma
                mbar_arrive(bars + 8 * s);
                tf32_warpgroup_sync(0);      // the staging read by all before it is refilled
                if (it + 1 < ntiles)
                    load_kv_async<D, BK, WG_THREADS>(tid, sKst, sVst, k, v, koff, k_row, voff, v_row, (it + 1) * BK,
                                                     kend);
            }
            return;
        }
        if (WG > 1) setmaxnreg_inc<WgmmaWsRegs<WG>::CREG>();
    }

    // the computing warpgroups: w of WG (all the block's threads when STAGES = 0)
    const int ctid = WS ? tid - WG_THREADS : tid, w = ctid >> 7, warp = (ctid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    if (WS) {
        split_queries<D, WG_THREADS>(ctid & (WG_THREADS - 1), sQhi, sQlo, WG_QUERIES * w, WG_QUERIES, q, qoff, q_row,
                                     qblock, mq, scale * LOG2E);
        fence_async_shared();
        tf32_warpgroup_sync(1 + w);          // this warpgroup's Q split before its first product
    } else {
        load_kv_async<D, BK, THREADS>(tid, sKst, sVst, k, v, koff, k_row, voff, v_row, 0, kend);
        split_queries<D, THREADS>(tid, sQhi, sQlo, 0, BQ, q, qoff, q_row, qblock, mq, scale * LOG2E);
    }

    // descriptors (16-byte units; k-step ks of Q K^T: + 16 * ks; 8-key block b of P V: + 16 * b; stage s:
    // + STAGE16 * s)
    const desc_t dQhi = smem_desc(sQhi + WG_QUERIES * D * w, 128, QK_SBO);
    const desc_t dQlo = smem_desc(sQlo + WG_QUERIES * D * w, 128, QK_SBO);
    const desc_t dKhi0 = smem_desc(stages, 128, QK_SBO);
    const desc_t dKlo0 = smem_desc(stages + B::K, 128, QK_SBO);
    const desc_t dVhi0 = smem_desc(stages + 2 * B::K, 128, B::VT_SBO);
    const desc_t dVlo0 = smem_desc(stages + 2 * B::K + B::VT, 128, B::VT_SBO);
    constexpr desc_t STAGE16 = L::STAGE / 4;

    const int row0 = qblock + WG_QUERIES * w + 16 * warp + g;   // this thread's rows: row0, row0 + 8
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.0f;
    // queries of this block see every key of a tile below this bound without a mask
    const int open_end = unmasked_key_end(kend, causal, qblock, causal_shift);

    for (int kt = 0, it = 0; kt < kend; kt += BK, ++it) {
        const int slot = WS ? stage_of<L::NST>(it) : 0;
        if (WS) {
            mbar_wait(bars + 8 * slot, phase_of<L::NST>(it));   // tile it split into stage slot
        } else {
            cp_async_wait_all();
            __syncthreads();                 // tile kt staged; every warpgroup is done with the last tile
            split_tile<D, BK, THREADS>(tid, stages, stages + B::K, stages + 2 * B::K, stages + 2 * B::K + B::VT, sKst,
                                       sVst);
            fence_async_shared();
            __syncthreads();                 // hi/lo visible to wgmma; staging free
            if (kt + BK < kend)
                load_kv_async<D, BK, THREADS>(tid, sKst, sVst, k, v, koff, k_row, voff, v_row, kt + BK, kend);
        }
        const desc_t at = STAGE16 * slot;
        const desc_t dKhi = dKhi0 + at, dKlo = dKlo0 + at, dVhi = dVhi0 + at, dVlo = dVlo0 + at;

        float s[NS];
        float cs[2][NS];
        pin(s);
        wgmma_fence();
        qk_group<BK, WGMMA_GROUP>(s, dQhi, dQlo, dKhi, dKlo);
        wgmma_commit();
#pragma unroll
        for (int u = 1; u < US; ++u) {
            pin(cs[u & 1]);
            wgmma_fence();
            const desc_t o16 = 16 * WGMMA_GROUP * u;   // G u k-steps on
            qk_group<BK, WGMMA_GROUP>(cs[u & 1], dQhi + o16, dQlo + o16, dKhi + o16, dKlo + o16);
            wgmma_commit();
            if (u >= 2) {
                wgmma_wait<1>();             // groups up to u - 1 are done
                pin(s);
                pin(cs[(u - 1) & 1]);
                add_to(s, cs[(u - 1) & 1]);
            }
        }
        wgmma_wait<0>();
        pin(s);
        if (US >= 2) {
            pin(cs[(US - 1) & 1]);
            add_to(s, cs[(US - 1) & 1]);
        }

        online_softmax_tile<NB, D / 2>(s, o, m, l, kt + BK > open_end, kt, kend, causal, causal_shift, row0, t, 1.0f);

        unsigned ph[NB][4], pl[NB][4];
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            split_tf32(s[4 * b + 0], ph[b][0], pl[b][0]);
            split_tf32(s[4 * b + 2], ph[b][1], pl[b][1]);
            split_tf32(s[4 * b + 1], ph[b][2], pl[b][2]);
            split_tf32(s[4 * b + 3], ph[b][3], pl[b][3]);
        }

        float co[2][NP];
#pragma unroll
        for (int u = 0; u < UO; ++u) {
            const int b = WGMMA_GROUP * (u / NSPLIT), part = u % NSPLIT;
            const desc_t voff16 = 16 * b + (desc_t)(part * (DN / 8) * (B::VT_SBO / 16));
            pin(co[u & 1]);
            wgmma_fence();
            pv_group<DN, WGMMA_GROUP, NB>(co[u & 1], ph, pl, b, dVhi + voff16, dVlo + voff16);
            wgmma_commit();
            if (u >= 1) {
                wgmma_wait<1>();
                pin(co[(u - 1) & 1]);
                add_to(o + ((u - 1) % NSPLIT) * NP, co[(u - 1) & 1]);
            }
        }
        wgmma_wait<0>();
        pin(co[(UO - 1) & 1]);
        add_to(o + ((UO - 1) % NSPLIT) * NP, co[(UO - 1) & 1]);
        if (WS) mbar_release(bars + 8 * (STAGES + slot));   // every product of the tile completed
    }

    // merge into the running output and log-sum-exp (natural-log units)
    merge_rows32<D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o);
}
