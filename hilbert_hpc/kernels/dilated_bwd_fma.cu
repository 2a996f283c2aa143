// Fused dilated-attention backward with FP32 FMA arithmetic (docs/kernels.md, "Backward kernels").
//
// Only sm_60 features (FP32 FMA, shared memory, warp shuffles, atomicAdd on float), so the float
// instantiations run on Pascal and every newer GPU; the 16-bit ones (bf16_t, f16_t) read their inputs as
// 16-bit values and compute in FP32 like the float ones. Any row alignment: the fallback for every launch.
//
// Arguments and semantics: DILATED_BWD_PARAMS (common.cuh). Grid: x = segments * heads problems, y = key
// blocks of BK keys of one problem. A block stages its keys' K and V rows in shared memory (rows padded to
// D + 1 floats: no bank conflicts), keeps their dK and dV in registers and walks the query tiles of BQ rows
// that see its keys (causal: from the first query that sees its first key). Per tile it loads Q, dO, L and
// delta, recomputes P = exp(scale q.k - L) and dP = dO.v (lane j: keys j, j + 32, ...; a warp: BQ / 4
// queries), forms dS = P (dP - delta), accumulates dV += P^T dO and dK += dS^T Q (a warp: BK / 4 keys; lane
// c: columns c, c + 32, ...) and adds scale dS K to dQ with atomicAdd (a query's dQ row gets terms from
// every key block). At the end dK (times scale) and dV are added to the float32 accumulators with one
// read-add-write each: a key belongs to one block of one problem.

#include "common.cuh"
#include "convert.cuh"
#include "mask.cuh"
#include "attention.cuh"

#define BWD_WARPS 4

// one element of an input row as FP32
__device__ __forceinline__ float element(const float* __restrict__ p, long long i) { return p[i]; }

__device__ __forceinline__ float element(const bf16_t* __restrict__ p, long long i) {
    return __uint_as_float((unsigned)p[i].bits << 16);
}

__device__ __forceinline__ float element(const f16_t* __restrict__ p, long long i) {
    float x;
    asm("{\n.reg .f16 h;\nmov.b16 h, %1;\ncvt.f32.f16 %0, h;\n}\n" : "=f"(x) : "h"(p[i].bits));
    return x;
}

template <typename T, int D, int BK, int BQ>
__global__ void __launch_bounds__(BWD_WARPS * 32)
dilated_bwd_fma(DILATED_BWD_PARAMS(T))
{
    static_assert(D % 32 == 0 && BK % 32 == 0 && BQ % BWD_WARPS == 0, "tile shapes");
    constexpr int C = D / 32;            // columns per lane
    constexpr int KPL = BK / 32;         // keys per lane when scoring
    constexpr int KPW = BK / BWD_WARPS;  // keys per warp when accumulating dK, dV
    constexpr int QPW = BQ / BWD_WARPS;  // queries per warp when scoring and adding to dQ
    constexpr int KS = D + 1;            // padded row of the K/V tiles
    extern __shared__ float smem[];
    float* sK = smem;                    // [BK][KS]
    float* sV = sK + BK * KS;            // [BK][KS]
    float* sQ = sV + BK * KS;            // [BQ][D]
    float* sO = sQ + BQ * D;             // [BQ][D]  dO
    float* sP = sO + BQ * D;             // [BQ][BK] P
    float* sS = sP + BQ * BK;            // [BQ][BK] dS
    float* sL = sS + BQ * BK;            // [BQ]
    float* sD = sL + BQ;                 // [BQ]    delta

    DILATED_FWD_PROBLEM_OFFSETS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int k0 = blockIdx.y * BK;
    const int qbegin = first_visible_query(causal, k0, causal_shift);
    if (k0 >= mk || qbegin >= mq) return;                        // uniform: no pair of this block is visible

    for (int idx = threadIdx.x; idx < BK * D; idx += BWD_WARPS * 32) {
        const int r = idx / D, d = idx % D, j = k0 + r;
        const bool ok = j < mk;
        sK[r * KS + d] = ok ? element(k, koff + j * k_row + d) : 0.0f;
        sV[r * KS + d] = ok ? element(v, voff + j * v_row + d) : 0.0f;
    }

    float dk_acc[KPW][C], dv_acc[KPW][C];
#pragma unroll
    for (int a = 0; a < KPW; ++a)
#pragma unroll
        for (int c = 0; c < C; ++c) dk_acc[a][c] = dv_acc[a][c] = 0.0f;

    for (int qt = qbegin; qt < mq; qt += BQ) {
        __syncthreads();                 // the previous tile's rows are no longer read
        for (int idx = threadIdx.x; idx < BQ * D; idx += BWD_WARPS * 32) {
            const int r = idx / D, d = idx % D, i = qt + r;
            const bool ok = i < mq;
            sQ[idx] = ok ? element(q, qoff + i * q_row + d) : 0.0f;
            sO[idx] = ok ? element(dout, qoff + i * q_row + d) : 0.0f;
        }
        if (threadIdx.x < BQ) {
            const int i = qt + threadIdx.x;
            sL[threadIdx.x] = i < mq ? lse[loff + i * l_row] : NEG_INF;
            sD[threadIdx.x] = i < mq ? delta[loff + i * l_row] : 0.0f;
        }
        __syncthreads();

        // scores and dP of this warp's queries against every key of the block
        float s[QPW][KPL], dp[QPW][KPL];
#pragma unroll
        for (int a = 0; a < QPW; ++a)
#pragma unroll
            for (int b = 0; b < KPL; ++b) s[a][b] = dp[a][b] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < D; ++d) {
            float kv[KPL], vv[KPL];
#pragma unroll
            for (int b = 0; b < KPL; ++b) {
                kv[b] = sK[(lane + 32 * b) * KS + d];
                vv[b] = sV[(lane + 32 * b) * KS + d];
            }
#pragma unroll
            for (int a = 0; a < QPW; ++a) {
                const float qv = sQ[(warp * QPW + a) * D + d], ov = sO[(warp * QPW + a) * D + d];
#pragma unroll
                for (int b = 0; b < KPL; ++b) {
                    s[a][b] = fmaf(qv, kv[b], s[a][b]);
                    dp[a][b] = fmaf(ov, vv[b], dp[a][b]);
                }
            }
        }
        bool row_any[QPW];               // whether the row has a nonzero dS in this block (warp-uniform)
#pragma unroll
        for (int a = 0; a < QPW; ++a) {
            const int r = warp * QPW + a, i = qt + r;
            const float L = sL[r], delta_i = sD[r];
            bool any = false;
#pragma unroll
            for (int b = 0; b < KPL; ++b) {
                const int j = k0 + lane + 32 * b;
                const bool visible = i < mq && j < mk && (!causal || j <= i + causal_shift) && L != NEG_INF;
                const float p = visible ? expf(fmaf(scale, s[a][b], -L)) : 0.0f;
                const float ds = p != 0.0f ? p * (dp[a][b] - delta_i) : 0.0f;
                sP[r * BK + lane + 32 * b] = p;
                sS[r * BK + lane + 32 * b] = ds;
                any = any || ds != 0.0f;
            }
            row_any[a] = __any_sync(0xffffffffu, any);
        }
        __syncthreads();

        // dV += P^T dO and dK += dS^T Q for this warp's keys
#pragma unroll 2
        for (int r = 0; r < BQ; ++r) {
            float o[C], qq[C];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                o[c] = sO[r * D + lane + 32 * c];
                qq[c] = sQ[r * D + lane + 32 * c];
            }
#pragma unroll
            for (int a = 0; a < KPW; ++a) {
                const float p = sP[r * BK + warp * KPW + a], ds = sS[r * BK + warp * KPW + a];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    dv_acc[a][c] = fmaf(p, o[c], dv_acc[a][c]);
                    dk_acc[a][c] = fmaf(ds, qq[c], dk_acc[a][c]);
                }
            }
        }

        // dQ += scale dS K for this warp's queries (rows of this warp's scores: no barrier needed)
#pragma unroll
        for (int a = 0; a < QPW; ++a) {
            if (!row_any[a]) continue;
            const int r = warp * QPW + a;
            float acc[C];
#pragma unroll
            for (int c = 0; c < C; ++c) acc[c] = 0.0f;
#pragma unroll 4
            for (int j = 0; j < BK; ++j) {
                const float ds = sS[r * BK + j];
#pragma unroll
                for (int c = 0; c < C; ++c) acc[c] = fmaf(ds, sK[j * KS + lane + 32 * c], acc[c]);
            }
            const long long row = qoff + (long long)(qt + r) * q_row;
#pragma unroll
            for (int c = 0; c < C; ++c) atomicAdd(dq + row + lane + 32 * c, scale * acc[c]);
        }
    }

    // one read-add-write of this block's dK and dV rows
#pragma unroll
    for (int a = 0; a < KPW; ++a) {
        const int j = k0 + warp * KPW + a;
        if (j >= mk) continue;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            dk[koff + j * k_row + lane + 32 * c] += scale * dk_acc[a][c];
            dv[voff + j * v_row + lane + 32 * c] += dv_acc[a][c];
        }
    }
}
