// Warp-level MMA (mma.sync, sm_80+) and shared-memory matrix loads (ldmatrix, stmatrix): TF32 m16n8k8
// with the split ("3xTF32") product, bf16 / f16 m16n8k16, all with FP32 accumulators.
// Include after convert.cuh (split_tf32, bf16_t, f16_t).
#pragma once

// c += a * b: m16n8k8 TF32, A row-major (4 registers), B column-major (2 registers)
__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a * b with split operands: three TF32 products, small terms first
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const unsigned (&ahi)[4], const unsigned (&alo)[4],
                                           float b0, float b1) {
    unsigned b0hi, b0lo, b1hi, b1lo;
    split_tf32(b0, b0hi, b0lo);
    split_tf32(b1, b1hi, b1lo);
    mma_tf32(c, alo, b0hi, b1hi);
    mma_tf32(c, ahi, b0lo, b1lo);
    mma_tf32(c, ahi, b0hi, b1hi);
}

template <typename T>
struct Mma16;

template <>
struct Mma16<bf16_t> {
    // c += a * b: m16n8k16, A row-major (4 registers), B column-major (2 registers), FP32 accumulators
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct Mma16<f16_t> {
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// four 8 x 8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// the same, each matrix transposed (lane 4 g + t gets elements (2t, g) and (2t + 1, g))
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                              unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// four 8 x 8 16-bit matrices into shared memory, each transposed (element (r, c) of matrix i to row c, column
// r); lanes 8i..8i+7 give the row addresses of matrix i
__device__ __forceinline__ void stsm_x4_trans(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
