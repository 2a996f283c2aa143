// Fused FP32 dilated-attention forward with an in-place log-sum-exp merge.
//
// Only sm_60 features (plain FP32 FMA, shared memory, warp shuffles), so it
// runs on Pascal and on every newer GPU.
//
// One launch covers a set of independent attention problems, numbered
// (segment, head-in-group). Rows are addressed by element offsets, so the same
// kernel reads strided rows of a local shard (segment / dilation / offset
// indexing) and rows of packed ring blocks without gathered copies:
//   row i of Q for problem (seg, t)   = q   + q_base + seg*q_seg + t*q_head + i*q_row
//   (likewise K, V, the output O, and the log-sum-exp L with l_*; O uses q_* strides)
// Query i sees key j when j < mk and, if causal, j <= i + causal_shift.
// The result is merged into O/L by log-sum-exp: O and L hold earlier partial
// results (L = -inf where there are none) and are updated in place.
//
// Block: 4 warps. Each warp owns QPW queries; a tile of 32 keys and values is
// staged in shared memory (rows padded to D+1 floats: no bank conflicts); lane j
// scores key j against the warp's queries, the softmax statistics are reduced
// with shuffles, and each lane accumulates D/32 output columns.

#include "common.cuh"
#include "convert.cuh"
#include "mask.cuh"
#include "attention.cuh"

#define WARPS 4
#define KTILE 32

struct Geometry {
    long long q_base, q_seg, q_head, q_row;
    long long k_base, k_seg, k_head, k_row;
    long long v_base, v_seg, v_head, v_row;
    long long l_base, l_seg, l_head, l_row;
    int heads;          // problems per segment (heads in the group)
    int mq, mk;         // queries and keys per problem
    int causal;         // 0/1
    int causal_shift;
    float scale;
};

template <int D, int QPW>
__global__ void __launch_bounds__(WARPS * 32)
dilated_fwd_fp32(DILATED_FWD_PARAMS)
{
    const Geometry g = {q_base, q_seg, q_head, q_row, k_base, k_seg, k_head, k_row,
                        v_base, v_seg, v_head, v_row, l_base, l_seg, l_head, l_row,
                        heads, mq, mk, causal, causal_shift, scale};
    constexpr int BQ = WARPS * QPW;      // queries per block
    constexpr int C = D / 32;            // output columns per lane
    constexpr int KS = D + 1;            // padded row of the K/V tiles
    extern __shared__ float smem[];
    float* sQ = smem;                    // [BQ][D], pre-scaled
    float* sK = sQ + BQ * D;             // [KTILE][KS]
    float* sV = sK + KTILE * KS;         // [KTILE][KS]
    float* sP = sV + KTILE * KS;         // [BQ][KTILE]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long prob = blockIdx.x;
    const int t = (int)(prob % g.heads);
    const long long seg = prob / g.heads;
    const int qblock = blockIdx.y * BQ;
    const long long qoff = g.q_base + seg * g.q_seg + t * g.q_head;
    const long long koff = g.k_base + seg * g.k_seg + t * g.k_head;
    const long long voff = g.v_base + seg * g.v_seg + t * g.v_head;
    const long long loff = g.l_base + seg * g.l_seg + t * g.l_head;

    for (int idx = threadIdx.x; idx < BQ * D; idx += WARPS * 32) {
        const int r = idx / D, d = idx % D, i = qblock + r;
        sQ[idx] = i < g.mq ? q[qoff + i * g.q_row + d] * g.scale : 0.0f;
    }

    float m[QPW], l[QPW], acc[QPW][C];
#pragma unroll
    for (int a = 0; a < QPW; ++a) {
        m[a] = NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[a][c] = 0.0f;
    }

    const int kend = visible_key_end(g.mk, g.causal, qblock + BQ, g.causal_shift);
    const int q0 = qblock + warp * QPW;

    for (int kt = 0; kt < kend; kt += KTILE) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < KTILE * D; idx += WARPS * 32) {
            const int r = idx / D, d = idx % D, j = kt + r;
            const bool ok = j < kend;
            sK[r * KS + d] = ok ? k[koff + j * g.k_row + d] : 0.0f;
            sV[r * KS + d] = ok ? v[voff + j * g.v_row + d] : 0.0f;
        }
        __syncthreads();

        float s[QPW];
#pragma unroll
        for (int a = 0; a < QPW; ++a) s[a] = 0.0f;
        const float* krow = sK + lane * KS;
#pragma unroll 8
        for (int d = 0; d < D; ++d) {
            const float kv = krow[d];
#pragma unroll
            for (int a = 0; a < QPW; ++a) s[a] = fmaf(sQ[(warp * QPW + a) * D + d], kv, s[a]);
        }
        const int j = kt + lane;
#pragma unroll
        for (int a = 0; a < QPW; ++a) {
            const int i = q0 + a;
            const bool visible = j < kend && i < g.mq && (!g.causal || j <= i + g.causal_shift);
            const float sc = visible ? s[a] : NEG_INF;
            const float m_new = fmaxf(m[a], lanes_max<32>(sc));
            float p = 0.0f, alpha = 1.0f;
            if (m_new != NEG_INF) {
                p = visible ? expf(sc - m_new) : 0.0f;
                alpha = (m[a] == NEG_INF) ? 0.0f : expf(m[a] - m_new);
            }
            l[a] = l[a] * alpha + lanes_sum<32>(p);
#pragma unroll
            for (int c = 0; c < C; ++c) acc[a][c] *= alpha;
            m[a] = m_new;
            sP[(warp * QPW + a) * KTILE + lane] = p;
        }
        __syncwarp();
#pragma unroll 4
        for (int jj = 0; jj < KTILE; ++jj) {
            float vv[C];
#pragma unroll
            for (int c = 0; c < C; ++c) vv[c] = sV[jj * KS + lane + 32 * c];
#pragma unroll
            for (int a = 0; a < QPW; ++a) {
                const float p = sP[(warp * QPW + a) * KTILE + jj];
#pragma unroll
                for (int c = 0; c < C; ++c) acc[a][c] = fmaf(p, vv[c], acc[a][c]);
            }
        }
        __syncwarp();
    }

    // merge into the running output and log-sum-exp
#pragma unroll
    for (int a = 0; a < QPW; ++a) {
        const int i = q0 + a;
        if (i >= g.mq || l[a] <= 0.0f) continue;          // no visible key: nothing to merge
        const float mine = m[a] + logf(l[a]);
        const long long lpos = loff + i * g.l_row;
        const MergeWeights w = merge_weights(lse[lpos], mine);
        const float inv_l = 1.0f / l[a];
        const long long orow = qoff + i * g.q_row;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const long long pos = orow + lane + 32 * c;
            const float prev = (w.wa == 0.0f) ? 0.0f : out[pos];
            out[pos] = (prev * w.wa + acc[a][c] * inv_l * w.wb) / w.den;
        }
        __syncwarp();
        if (lane == 0) lse[lpos] = w.mx + logf(w.den);
    }
}
