// The pieces of the attention computation shared by the tensor-core kernels: the online softmax of a key
// tile, and the one log-sum-exp merge of a partial result into the running output and log-sum-exp (FP32 or
// 16-bit running output). Include after common.cuh and convert.cuh (the ranges of visible keys: mask.cuh).
#pragma once

// Lazy rescaling (softmax_tile<..., LAZY = true>): the running max m of a row moves only when a tile's max
// exceeds it by more than RESCALE_SLACK (log2 units). Below that the probabilities exp2(mul s - m) stay at most
// 2^RESCALE_SLACK, alpha is exactly 1 and the running output keeps its scale: most tiles skip the rescale.
// Exact in the sense of the merge: o and l always share the m they were scaled with.
constexpr float RESCALE_SLACK = 8.0f;

// Online softmax of one key tile for this thread's two query rows (row0, row0 + 8), in log2 units, on the
// accumulator layout of mma.sync m16n8 and wgmma m64nN (lane = 4 g + t): s[4 b + 2 h + e] = score of
// (row g + 8 h, key kt + 8 b + 2 t + e), o[4 n + 2 h + e] = running output (row g + 8 h, column 8 n + 2 t + e).
// Scores become mul * score (mul = scale * log2 e, or 1 when Q was pre-scaled); masked (only boundary tiles
// need it): keys at or past kend, and past i + causal_shift when causal. On return s holds the FP32
// probabilities exp2(mul s - m), m the running max, l this lane's partial row sum, alpha[h] the factor of the
// running output of row h, and, when RESCALE, o is rescaled by it. LAZY: m moves by more than RESCALE_SLACK
// or not at all (above). MASK: whether the tile is masked, known at compile time (softmax_tile decides it).
template <int NB, int NO, bool RESCALE, bool LAZY, bool MASK>
__device__ __forceinline__ void softmax_tile_body(float (&s)[4 * NB], float (&o)[NO], float (&m)[2], float (&l)[2],
                                                  float (&alpha)[2], int kt, int kend, int causal, int causal_shift,
                                                  int row0, int t, float mul) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row0 + 8 * h;
        float mx = NEG_INF;
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * b + 2 * h + e];
                if (MASK) {
                    const int j = kt + 8 * b + 2 * t + e;
                    x = (j < kend && (!causal || j <= i + causal_shift)) ? x : NEG_INF;
                }
                mx = fmaxf(mx, x);
            }
        float m_new = fmaxf(m[h], lanes_max<4>(mx) * mul);
        if (LAZY && m_new - m[h] <= RESCALE_SLACK) m_new = m[h];   // false while m[h] is -inf
        const float m_use = (m_new == NEG_INF) ? 0.0f : m_new;
        const float a = exp2f(m[h] - m_use);
        alpha[h] = a;
        float sum = 0.0f;
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * b + 2 * h + e];
                x = exp2f(fmaf(x, mul, -m_use));
                sum += x;
            }
        l[h] = l[h] * a + sum;               // this lane's partial row sum (FP32 probabilities)
        m[h] = m_new;
        if (RESCALE)
#pragma unroll
            for (int n = 0; n < NO / 4; ++n) {
                o[4 * n + 2 * h] *= a;
                o[4 * n + 2 * h + 1] *= a;
            }
    }
}

// The softmax of a tile, masked or not (`masked`, once per tile): a masked and an unmasked copy of the body. With
// one copy and a run-time flag the compiler computes and selects every score's mask, masked tile or not (two ALU
// instructions a score: 18 % of tma16's instructions at D = 64, H200 ncu).
template <int NB, int NO, bool RESCALE, bool LAZY = false>
__device__ __forceinline__ void softmax_tile(float (&s)[4 * NB], float (&o)[NO], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], bool masked, int kt, int kend, int causal,
                                             int causal_shift, int row0, int t, float mul) {
    if (masked)
        softmax_tile_body<NB, NO, RESCALE, LAZY, true>(s, o, m, l, alpha, kt, kend, causal, causal_shift, row0, t, mul);
    else
        softmax_tile_body<NB, NO, RESCALE, LAZY, false>(s, o, m, l, alpha, kt, kend, causal, causal_shift, row0, t, mul);
}

// softmax_tile with the running output o rescaled in place.
template <int NB, int NO>
__device__ __forceinline__ void online_softmax_tile(float (&s)[4 * NB], float (&o)[NO], float (&m)[2], float (&l)[2],
                                                    bool masked, int kt, int kend, int causal, int causal_shift,
                                                    int row0, int t, float mul) {
    float alpha[2];
    softmax_tile<NB, NO, true>(s, o, m, l, alpha, masked, kt, kend, causal, causal_shift, row0, t, mul);
}

// Running output rows (row g + 8 h: o[4 n + 2 h + e]) multiplied by alpha[h] (after softmax_tile<..., false>).
template <int NO>
__device__ __forceinline__ void rescale_rows(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int n = 0; n < NO / 4; ++n) {
            o[4 * n + 2 * h] *= alpha[h];
            o[4 * n + 2 * h + 1] *= alpha[h];
        }
}

// rescale_rows where some row of the warp has alpha != 1 (after a lazy softmax_tile: most tiles have none).
template <int NO>
__device__ __forceinline__ void rescale_rows_lazy(float (&o)[NO], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale_rows<NO>(o, alpha);
}

// Prefetch into L2 the running output that this thread's merge will read: its rows (row0, row0 + 8) that hold an
// earlier result (`old`: their log-sum-exp before the merge, -inf for none), a row's 128-byte lines spread over
// its 4 lanes (t), the row's last byte included (rows need not start on a line). A hint: the merge's reads then
// find the lines in L2 instead of waiting on DRAM.
template <int D, typename O>
__device__ __forceinline__ void prefetch_merge_rows(const O* __restrict__ out, long long qoff, long long q_row, int row0,
                                                    int t, const float (&old)[2]) {
    constexpr int BYTES = D * (int)sizeof(O), LINES = (BYTES + 127) / 128 + 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (old[h] == NEG_INF) continue;
        const char* row = reinterpret_cast<const char*>(out + qoff + (row0 + 8 * h) * q_row);
#pragma unroll
        for (int c = t; c < LINES; c += 4) {
            const char* at = c < LINES - 1 ? row + 128 * c : row + BYTES - 1;
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(at));
        }
    }
}

// Merging a new partial result (log-sum-exp `mine`) into a running one (`old`, -inf for none):
// out = (old_out * wa + new_out * wb) / den and lse = mx + log(den).
struct MergeWeights {
    float mx, wa, wb, den;
};

__device__ __forceinline__ MergeWeights merge_weights(float old, float mine) {
    MergeWeights w;
    w.mx = fmaxf(old, mine);
    w.wa = (old == NEG_INF) ? 0.0f : expf(old - w.mx);
    w.wb = expf(mine - w.mx);
    w.den = w.wa + w.wb;
    return w;
}

// Where a merge into a float32 running output puts element pair n (columns 8 n + 2 t, + 1) of row h (merge_rows32):
// the running output's row `orow` (FP32Store), or, for rows whose last merge this is, their 16-bit output row
// `row16[h]` (column 0; null: the running output), rounded once to T there (FinalRows16).
struct FP32Store {
    __device__ __forceinline__ void put(int, int, int n, float2* orow, float2 r) const { orow[4 * n] = r; }
};
template <typename T>
struct FinalRows16 {
    T* row16[2];
    __device__ __forceinline__ void put(int h, int t, int n, float2* orow, float2 r) const {
        if (row16[h])
            reinterpret_cast<unsigned*>(row16[h])[t + 4 * n] = Half16<T>::pack(r.x, r.y);
        else
            orow[4 * n] = r;
    }
};

// This thread's two rows' running log-sum-exp before a merge (-inf: none, or the row is past mq), for the
// merges' `before` forms: a kernel that reads it early (tma16, at a query block's start) keeps the read off the
// merge's critical path. Rows merge nowhere else meanwhile.
__device__ __forceinline__ void running_lse(const float* __restrict__ lse, long long loff, long long l_row, int row0,
                                            int mq, float (&before)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) before[h] = row0 + 8 * h < mq ? lse[loff + (row0 + 8 * h) * l_row] : NEG_INF;
}

// Merge this thread's two rows (row0, row0 + 8) of an unnormalized FP32 result into the running FP32
// output and log-sum-exp (natural-log units), in place: out = old * wa / den + o * (wb / (l den)) (rows at
// even element offsets: read and written as float2; `store` may put a row into its 16-bit output instead,
// rounded once, the float32 running output left alone). `before`: the rows' log-sum-exp before the merge
// (running_lse). Accumulator layout of mma.sync m16n8 and wgmma m64nN (lane = 4 g + t): o[4 n + 2 h + e] =
// (row g + 8 h, column 8 n + 2 t + e); m: running max (log2 units), l: this lane's partial row sums (summed over
// the row's 4 lanes here). Rows past mq or with no visible key are left untouched. Every lane of the warp must
// call it. DA >= D: columns of the accumulators; columns past D are not written.
template <int D, int DA = D, typename Store = FP32Store>
__device__ __forceinline__ void merge_rows32_before(float* __restrict__ out, float* __restrict__ lse, long long qoff,
                                                    long long q_row, long long loff, long long l_row, int row0, int mq,
                                                    int t, const float (&m)[2], float (&l)[2],
                                                    const float (&o)[DA / 2], const float (&before)[2],
                                                    const Store& store = Store{}) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] = lanes_sum<4>(l[h]);
        const int i = row0 + 8 * h;
        if (i >= mq || l[h] <= 0.0f) continue;   // no visible key: nothing to merge
        const float mine = (m[h] + log2f(l[h])) * LN2;
        const MergeWeights w = merge_weights(before[h], mine);
        float2* orow = reinterpret_cast<float2*>(out + qoff + i * q_row + 2 * t);
        // every old value of the row is read before any is combined: one round trip to memory, not D / 4
        float2 prev[D / 8];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) prev[n] = make_float2(0.0f, 0.0f);
        if (w.wa != 0.0f)
#pragma unroll
            for (int n = 0; n < D / 8; ++n) prev[n] = orow[4 * n];
        const float inv_den = 1.0f / w.den, keep = w.wa * inv_den, add = w.wb * inv_den / l[h];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            float2 r;
            r.x = fmaf(prev[n].x, keep, o[4 * n + 2 * h] * add);
            r.y = fmaf(prev[n].y, keep, o[4 * n + 2 * h + 1] * add);
            store.put(h, t, n, orow, r);
        }
        if (t == 0) lse[loff + i * l_row] = w.mx + logf(w.den);
    }
}

// merge_rows32_before with the rows' log-sum-exp read here
template <int D, int DA = D, typename Store = FP32Store>
__device__ __forceinline__ void merge_rows32(float* __restrict__ out, float* __restrict__ lse, long long qoff,
                                             long long q_row, long long loff, long long l_row, int row0, int mq,
                                             int t, const float (&m)[2], float (&l)[2], const float (&o)[DA / 2],
                                             const Store& store = Store{}) {
    float before[2];
    running_lse(lse, loff, l_row, row0, mq, before);
    __syncwarp();                            // every lane has read L before lane t == 0 writes it
    merge_rows32_before<D, DA>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o, before, store);
}

// Merge this thread's two rows (row0, row0 + 8) of an unnormalized FP32 result into the running 16-bit
// output and the float32 log-sum-exp (natural-log units), in place (`before`: the rows' log-sum-exp before the
// merge, running_lse). Accumulator layout of both MMA kinds
// (mma.sync m16n8 and wgmma m64nN, per warp of 16 rows, lane = 4 g + t): o[4 n + 2 h + e] = (row g + 8 h,
// column 8 n + 2 t + e). m: running max (log2 units), l: this lane's partial row sums (summed over the 4
// lanes of a row here). The old output is read, combined in FP32 and rounded once to T. Rows past mq or
// with no visible key are left untouched. Every lane of the warp must call it. DA >= D: columns of the
// accumulators (a kernel computing D rounded up to whole regions); columns past D are not written.
template <typename T, int D, int DA = D>
__device__ __forceinline__ void merge_rows16_before(T* __restrict__ out, float* __restrict__ lse, long long qoff,
                                                    long long q_row, long long loff, long long l_row, int row0, int mq,
                                                    int t, const float (&m)[2], float (&l)[2],
                                                    const float (&o)[DA / 2], const float (&before)[2]) {
    using H = Half16<T>;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] = lanes_sum<4>(l[h]);
        const int i = row0 + 8 * h;
        if (i >= mq || l[h] <= 0.0f) continue;   // no visible key: nothing to merge
        const float mine = (m[h] + log2f(l[h])) * LN2;
        const MergeWeights w = merge_weights(before[h], mine);
        const float inv_l = 1.0f / l[h];
        const float wb = inv_l * w.wb, inv_den = 1.0f / w.den;
        unsigned* orow = reinterpret_cast<unsigned*>(out + qoff + i * q_row + 2 * t);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const float2 prev = (w.wa == 0.0f) ? make_float2(0.0f, 0.0f) : H::unpack(orow[4 * n]);
            const float lo = (prev.x * w.wa + o[4 * n + 2 * h] * wb) * inv_den;
            const float hi = (prev.y * w.wa + o[4 * n + 2 * h + 1] * wb) * inv_den;
            orow[4 * n] = H::pack(lo, hi);
        }
        if (t == 0) lse[loff + i * l_row] = w.mx + logf(w.den);
    }
}

// merge_rows16_before with the rows' log-sum-exp read here
template <typename T, int D, int DA = D>
__device__ __forceinline__ void merge_rows16(T* __restrict__ out, float* __restrict__ lse, long long qoff,
                                             long long q_row, long long loff, long long l_row, int row0, int mq,
                                             int t, const float (&m)[2], float (&l)[2], const float (&o)[DA / 2]) {
    float before[2];
    running_lse(lse, loff, l_row, row0, mq, before);
    __syncwarp();                            // every lane has read L before lane t == 0 writes it
    merge_rows16_before<T, D, DA>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o, before);
}
