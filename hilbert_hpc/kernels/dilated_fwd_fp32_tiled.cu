// Register-tiled FP32 dilated-attention forward with an in-place log-sum-exp merge.
//
// Same problem geometry and merge contract as dilated_fwd_fp32.cu (see there):
// problems numbered (segment, head-in-group), rows addressed by element offsets,
// query i sees key j when j < mk and, if causal, j <= i + causal_shift, and the
// result is merged into O/L by log-sum-exp. Only sm_60 features.
//
// Block: 256 threads as a 16 x 16 grid (qg, kg) over a BQ x 64 score tile.
// Thread (qg, kg) holds TQ = BQ/16 queries x 4 keys of the scores (keys
// kg + 16*b) and, for P*V, the same TQ queries x C = D/16 output columns, so
// the softmax statistics of its queries are shared by the 16 lanes of its
// group (shuffles over lane bits 0..3) and never leave registers.
// Shared memory: Q^T [D][BQ] (pre-scaled by scale*log2 e), K^T [D][64] with
// the columns permuted so each thread's 4 keys are one float4, V [64][D];
// the P tile [64][BQ] reuses the K space (float4 chunks XOR-swizzled by row).
// Every row offset must be a multiple of 4 elements (float4 loads).

#include "common.cuh"
#include "convert.cuh"
#include "mask.cuh"
#include "attention.cuh"

#define TILED_THREADS 256
#define BK 64

template <int N>
__device__ __forceinline__ void load_row(float (&dst)[N], const float* src) {
    // N consecutive floats from shared memory in the widest aligned pieces
    if (N % 4 == 0) {
#pragma unroll
        for (int c = 0; c < N; c += 4) {
            const float4 x = *reinterpret_cast<const float4*>(src + c);
            dst[c] = x.x; dst[c + 1] = x.y; dst[c + 2] = x.z; dst[c + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int c = 0; c < N; c += 2) {
            const float2 x = *reinterpret_cast<const float2*>(src + c);
            dst[c] = x.x; dst[c + 1] = x.y;
        }
    }
}

// position of chunk `col` (a multiple of 4) of row j in the swizzled P tile
__device__ __forceinline__ int p_index(int j, int col, int bq) {
    return j * bq + (col ^ ((j & 7) << 2));
}

template <int D, int BQ>
__global__ void __launch_bounds__(TILED_THREADS)
dilated_fwd_fp32_tiled(DILATED_FWD_PARAMS)
{
    constexpr int TQ = BQ / 16;                          // queries per thread
    constexpr int C = D / 16;                            // output columns per thread
    constexpr int KP = (D * BK > BK * BQ) ? D * BK : BK * BQ;
    extern __shared__ float smem[];
    float* sQ = smem;                                    // [D][BQ]
    float* sKP = sQ + D * BQ;                            // K^T [D][BK], later P [BK][BQ]
    float* sV = sKP + KP;                                // [BK][D]

    const int tid = threadIdx.x, qg = tid >> 4, kg = tid & 15;
    const int qblock = blockIdx.y * BQ;
    DILATED_FWD_PROBLEM_OFFSETS;
    const float qscale = scale * LOG2E;                  // scores in log2 units: exp2 below

    for (int idx = tid; idx < BQ * (D / 4); idx += TILED_THREADS) {
        const int r = idx % BQ, d4 = idx / BQ, i = qblock + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < mq) x = *reinterpret_cast<const float4*>(q + qoff + i * q_row + 4 * d4);
        sQ[(4 * d4 + 0) * BQ + r] = x.x * qscale;
        sQ[(4 * d4 + 1) * BQ + r] = x.y * qscale;
        sQ[(4 * d4 + 2) * BQ + r] = x.z * qscale;
        sQ[(4 * d4 + 3) * BQ + r] = x.w * qscale;
    }

    float m[TQ], l[TQ], acc[TQ][C];
#pragma unroll
    for (int a = 0; a < TQ; ++a) {
        m[a] = NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[a][c] = 0.0f;
    }

    const int kend = visible_key_end(mk, causal, qblock + BQ, causal_shift);

    for (int kt = 0; kt < kend; kt += BK) {
        __syncthreads();                                 // previous P and V fully used
        for (int idx = tid; idx < BK * (D / 4); idx += TILED_THREADS) {
            const int r = idx % BK, d4 = idx / BK, j = kt + r;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (j < kend) x = *reinterpret_cast<const float4*>(k + koff + j * k_row + 4 * d4);
            const int col = (r & 15) * 4 + (r >> 4);     // key r -> column of its owner's float4
            sKP[(4 * d4 + 0) * BK + col] = x.x;
            sKP[(4 * d4 + 1) * BK + col] = x.y;
            sKP[(4 * d4 + 2) * BK + col] = x.z;
            sKP[(4 * d4 + 3) * BK + col] = x.w;
        }
        for (int idx = tid; idx < BK * (D / 4); idx += TILED_THREADS) {
            const int r = idx / (D / 4), d4 = idx % (D / 4), j = kt + r;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (j < kend) x = *reinterpret_cast<const float4*>(v + voff + j * v_row + 4 * d4);
            *reinterpret_cast<float4*>(sV + r * D + 4 * d4) = x;
        }
        __syncthreads();

        float s[TQ][4];
#pragma unroll
        for (int a = 0; a < TQ; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) s[a][b] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            float qa[TQ], kb[4];
            load_row(qa, sQ + d * BQ + qg * TQ);
            load_row(kb, sKP + d * BK + kg * 4);
#pragma unroll
            for (int a = 0; a < TQ; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) s[a][b] = fmaf(qa[a], kb[b], s[a][b]);
        }

        // online softmax over this tile (row statistics shared by the 16 lanes of the group)
#pragma unroll
        for (int a = 0; a < TQ; ++a) {
            const int i = qblock + qg * TQ + a;
            float mx = NEG_INF;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int j = kt + kg + 16 * b;
                const bool visible = j < kend && (!causal || j <= i + causal_shift);
                s[a][b] = visible ? s[a][b] : NEG_INF;
                mx = fmaxf(mx, s[a][b]);
            }
            const float m_new = fmaxf(m[a], lanes_max<16>(mx));
            const float m_use = (m_new == NEG_INF) ? 0.0f : m_new;
            const float alpha = exp2f(m[a] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                s[a][b] = exp2f(s[a][b] - m_use);
                sum += s[a][b];
            }
            l[a] = l[a] * alpha + sum;                   // this thread's partial row sum
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[a][c] *= alpha;
        }

        __syncthreads();                                 // K tile fully read: its space takes P
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int j = kg + 16 * b;
#pragma unroll
            for (int a4 = 0; a4 < TQ; a4 += 4)
                *reinterpret_cast<float4*>(sKP + p_index(j, qg * TQ + a4, BQ)) =
                    make_float4(s[a4][b], s[a4 + 1][b], s[a4 + 2][b], s[a4 + 3][b]);
        }
        __syncthreads();

#pragma unroll 8
        for (int j = 0; j < BK; ++j) {
            float pa[TQ], vv[C];
#pragma unroll
            for (int a4 = 0; a4 < TQ; a4 += 4) {
                const float4 x = *reinterpret_cast<const float4*>(sKP + p_index(j, qg * TQ + a4, BQ));
                pa[a4] = x.x; pa[a4 + 1] = x.y; pa[a4 + 2] = x.z; pa[a4 + 3] = x.w;
            }
            load_row(vv, sV + j * D + kg * C);
#pragma unroll
            for (int a = 0; a < TQ; ++a)
#pragma unroll
                for (int c = 0; c < C; ++c) acc[a][c] = fmaf(pa[a], vv[c], acc[a][c]);
        }
    }

    // merge into the running output and log-sum-exp (natural-log units)
    float old[TQ];
#pragma unroll
    for (int a = 0; a < TQ; ++a) {
        l[a] = lanes_sum<16>(l[a]);
        const int i = qblock + qg * TQ + a;
        old[a] = (i < mq && l[a] > 0.0f) ? lse[loff + i * l_row] : NEG_INF;
    }
    __syncwarp();                                        // every lane has read L before lane kg == 0 writes it
#pragma unroll
    for (int a = 0; a < TQ; ++a) {
        const int i = qblock + qg * TQ + a;
        if (i >= mq || l[a] <= 0.0f) continue;           // no visible key: nothing to merge
        const float mine = (m[a] + log2f(l[a])) * LN2;
        const MergeWeights w = merge_weights(old[a], mine);
        const float inv_l = 1.0f / l[a];
        float* orow = out + qoff + i * q_row + kg * C;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float prev = (w.wa == 0.0f) ? 0.0f : orow[c];
            orow[c] = (prev * w.wa + acc[a][c] * inv_l * w.wb) / w.den;
        }
        if (kg == 0) lse[loff + i * l_row] = w.mx + logf(w.den);
    }
}
