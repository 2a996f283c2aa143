// Number conversions and constants: log2 e and ln 2, FP32 -> TF32 (rounded, and split into hi + lo),
// the 16-bit storage types (bf16_t, f16_t) and their packing to / from FP32. No CUDA headers are needed
// (NVRTC finds no cuda_bf16.h without an include path): conversions are PTX cvt instructions (TF32 and the
// 16-bit types: sm_80+; unused functions cost nothing on older targets).
#pragma once

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// FP32 -> TF32 bits, rounded to nearest. Compute capability 9.0 converts in one instruction with ties to even
// (cvt.rn, F2FP); before it only cvt.rna (ties away from zero) exists, four integer and compare instructions (an
// add of half a TF32 unit and a mask, inf and NaN kept): the split x = hi + lo then costs 3 instructions, not 9.
__device__ __forceinline__ unsigned tf32_bits(float x) {
    unsigned r;
#if __CUDA_ARCH__ >= 900
    asm volatile("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#endif
    return r;
}

// x = hi + lo, both representable in TF32
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
    hi = tf32_bits(x);
    lo = tf32_bits(x - __uint_as_float(hi));
}

// the same for each element of x
__device__ __forceinline__ void split4(const float4 x, uint4& hi, uint4& lo) {
    split_tf32(x.x, hi.x, lo.x);
    split_tf32(x.y, hi.y, lo.y);
    split_tf32(x.z, hi.z, lo.z);
    split_tf32(x.w, hi.w, lo.w);
}

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
