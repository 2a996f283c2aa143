// Pieces shared by the 16-bit forward kernels (wgmma16 for sm_90a, mma16 for sm_80+): the 16-bit storage
// types, their conversions, the argument list, and the in-place log-sum-exp merge into a 16-bit output.
// Include after common.cuh (NEG_INF, lanes_sum, merge_weights). No CUDA headers are needed (NVRTC finds no
// cuda_bf16.h without an include path): conversions are PTX cvt instructions (sm_80+).
#pragma once

#ifndef LOG2E
#define LOG2E 1.4426950408889634f
#endif
#ifndef LN2
#define LN2 0.6931471805599453f
#endif

// 16-bit storage types (the bits of a bfloat16 / IEEE half value)
struct bf16_t {
    unsigned short bits;
};
struct f16_t {
    unsigned short bits;
};

template <typename T>
struct Half16;

template <>
struct Half16<bf16_t> {
    // (lo, hi) -> one register, lo in the low 16 bits; round to nearest even
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    static __device__ __forceinline__ float2 unpack(unsigned x) {
        return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    }
};

template <>
struct Half16<f16_t> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    static __device__ __forceinline__ float2 unpack(unsigned x) {
        float lo, hi;
        asm("{\n.reg .f16 a, b;\nmov.b32 {a, b}, %2;\ncvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\n}\n"
            : "=f"(lo), "=f"(hi) : "r"(x));
        return make_float2(lo, hi);
    }
};

// cp.async groups (sm_80+): close the group of copies issued so far; wait until every group has landed
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// The arguments of the 16-bit kernels: DILATED_FWD_PARAMS with 16-bit q, k, v, out (float lse)
#define DILATED_FWD16_PARAMS(T)                                                                           \
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,                            \
    T* __restrict__ out, float* __restrict__ lse,                                                         \
    long long q_base, long long q_seg, long long q_head, long long q_row,                                 \
    long long k_base, long long k_seg, long long k_head, long long k_row,                                 \
    long long v_base, long long v_seg, long long v_head, long long v_row,                                 \
    long long l_base, long long l_seg, long long l_head, long long l_row,                                 \
    int heads, int mq, int mk, int causal, int causal_shift, float scale

// Merge this thread's two rows (row0, row0 + 8) of an unnormalized FP32 result into the running 16-bit
// output and the float32 log-sum-exp (natural-log units), in place. Accumulator layout of both MMA kinds
// (mma.sync m16n8 and wgmma m64nN, per warp of 16 rows, lane = 4 g + t): o[4 n + 2 h + e] = (row g + 8 h,
// column 8 n + 2 t + e). m: running max (log2 units), l: this lane's partial row sums (summed over the 4
// lanes of a row here). The old output is read, combined in FP32 and rounded once to T. Rows past mq or
// with no visible key are left untouched. Every lane of the warp must call it.
template <typename T, int D>
__device__ __forceinline__ void merge_rows16(T* __restrict__ out, float* __restrict__ lse, long long qoff,
                                             long long q_row, long long loff, long long l_row, int row0, int mq,
                                             int t, const float (&m)[2], float (&l)[2], const float (&o)[D / 2]) {
    using H = Half16<T>;
    float old[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] = lanes_sum<4>(l[h]);
        const int i = row0 + 8 * h;
        old[h] = (i < mq && l[h] > 0.0f) ? lse[loff + i * l_row] : NEG_INF;
    }
    __syncwarp();                            // every lane has read L before lane t == 0 writes it
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row0 + 8 * h;
        if (i >= mq || l[h] <= 0.0f) continue;   // no visible key: nothing to merge
        const float mine = (m[h] + log2f(l[h])) * LN2;
        const MergeWeights w = merge_weights(old[h], mine);
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
