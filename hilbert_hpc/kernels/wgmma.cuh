// Warpgroup MMA (wgmma, Hopper sm_90a): warpgroup geometry, the shared-memory matrix descriptors (no
// swizzle and 128-byte swizzle), fences, commits and waits, the async-proxy fence, the register pins that keep
// accumulator and A-fragment accesses on their side of a wgmma issue or wait, and the instructions: TF32
// m64nNk8 (Wgmma<N>) and bf16 / f16 m64nNk16 (Wgmma16<T, N>, each width written once for both types) with FP32
// accumulators at every tile width N the kernels use. Include after convert.cuh (bf16_t, f16_t).
#pragma once

#define WG_THREADS 128
#define WG_QUERIES 64

typedef unsigned long long desc_t;

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// this thread's shared-memory writes before it (ordinary stores, or cp.async landed and waited for) are
// visible to wgmma (the async proxy) after the next barrier
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// keeps the compiler from moving reads or writes of an accumulator across a wgmma issue or wait
template <int R>
__device__ __forceinline__ void pin(float (&x)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

// shared-memory matrix descriptor of a shared-window byte address, no swizzle, base offset 0: start address
// >> 4 (bits 0-13), LBO >> 4 (bits 16-29), SBO >> 4 (bits 32-45)
__device__ __forceinline__ desc_t smem_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (desc_t)((addr & 0x3FFFFu) >> 4) | ((desc_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((desc_t)((sbo & 0x3FFFFu) >> 4) << 32);
}

// the same for a pointer into shared memory
__device__ __forceinline__ desc_t smem_desc(const void* p, unsigned lbo, unsigned sbo) {
    return smem_desc((unsigned)__cvta_generic_to_shared(p), lbo, sbo);
}

// the swizzle of rows of ROW = 128 or 64 bytes (layout type 1 or 2), SBO = 8 rows
template <int ROW>
__device__ __forceinline__ desc_t smem_desc_swizzled(unsigned addr, unsigned lbo) {
    static_assert(ROW == 128 || ROW == 64, "128- or 64-byte swizzle");
    return smem_desc(addr, lbo, 8 * ROW) | ((ROW == 128 ? 1ull : 2ull) << 62);
}

// smem_desc_swizzled<ROW>(base + 16 u, lbo) for offsets of u 16-byte units, as its two 32-bit words: `lo` (the
// start address, bits 0-13, and LBO, bits 16-29), worked out once for `base`, and `hi` (SBO, the swizzle), the same
// for every offset. A k-step or stage further on adds its offset to `lo` alone: shared-window addresses lie below
// 256 KiB, so the sum stays inside the address field. One integer add per wgmma operand, not the masks and shifts
// of smem_desc.
template <int ROW>
struct SwizzledDesc {
    unsigned lo, hi;

    __device__ __forceinline__ SwizzledDesc(unsigned base, unsigned lbo) {
        const desc_t d = smem_desc_swizzled<ROW>(base, lbo);
        lo = (unsigned)d;
        hi = (unsigned)(d >> 32);
    }

    // the descriptor of base + 16 u bytes
    __device__ __forceinline__ desc_t at(unsigned u) const {
        desc_t d;
        asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo + u), "r"(hi));
        return d;
    }
};

template <int R>
__device__ __forceinline__ void pin_u(unsigned (&x)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(x[i][j])::"memory");
}

// The accumulator operands "+f"(d[0]) .. "+f"(d[n - 1]) of a wgmma asm statement with n FP32 accumulators
#define WGMMA_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WGMMA_D16 WGMMA_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WGMMA_D24 WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define WGMMA_D32 WGMMA_D24, "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D48 WGMMA_D32, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define WGMMA_D64 WGMMA_D48, \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_D96 WGMMA_D64, \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])

// wgmma D (+)= A * B, D f32 64 x N, A 64 x 8 and B 8 x N TF32; A and B from shared-memory descriptors
// (ss) or A from four registers (rs); SCALE_D = 0 ignores the old D (a fresh accumulator).
template <int N>
struct Wgmma;

template <>
struct Wgmma<32> {
    template <int SCALE_D>
    static __device__ __forceinline__ void ss(float (&d)[16], unsigned long long da, unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
            : WGMMA_D16
            : "l"(da), "l"(db), "n"(SCALE_D));
    }
    template <int SCALE_D>
    static __device__ __forceinline__ void rs(float (&d)[16], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
            : WGMMA_D16
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D));
    }
};

template <>
struct Wgmma<48> {
    template <int SCALE_D>
    static __device__ __forceinline__ void ss(float (&d)[24], unsigned long long da, unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1;\n}\n"
            : WGMMA_D24
            : "l"(da), "l"(db), "n"(SCALE_D));
    }
    template <int SCALE_D>
    static __device__ __forceinline__ void rs(float (&d)[24], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1;\n}\n"
            : WGMMA_D24
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D));
    }
};

template <>
struct Wgmma<64> {
    template <int SCALE_D>
    static __device__ __forceinline__ void ss(float (&d)[32], unsigned long long da, unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
            : WGMMA_D32
            : "l"(da), "l"(db), "n"(SCALE_D));
    }
    template <int SCALE_D>
    static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
            : WGMMA_D32
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D));
    }
};

template <>
struct Wgmma<96> {
    template <int SCALE_D>
    static __device__ __forceinline__ void ss(float (&d)[48], unsigned long long da, unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1;\n}\n"
            : WGMMA_D48
            : "l"(da), "l"(db), "n"(SCALE_D));
    }
    template <int SCALE_D>
    static __device__ __forceinline__ void rs(float (&d)[48], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1;\n}\n"
            : WGMMA_D48
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D));
    }
};

template <>
struct Wgmma<128> {
    template <int SCALE_D>
    static __device__ __forceinline__ void ss(float (&d)[64], unsigned long long da, unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
            : WGMMA_D64
            : "l"(da), "l"(db), "n"(SCALE_D));
    }
    template <int SCALE_D>
    static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
            : WGMMA_D64
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D));
    }
};

// wgmma D (+)= A * B, D f32 64 x N, A 64 x 16 and B 16 x N of T. ss: A and B from shared-memory
// descriptors, K-major, or MN-major where TRANS_A / TRANS_B = 1. rs: A from four registers, B from a
// descriptor, TRANS_B = 1: B MN-major. SCALE_D = 0 ignores the old D.
template <typename T, int N>
struct Wgmma16;

// One tile width N for one element type (the C type CT, the PTX type TY: bf16 or f16); instantiated below for
// both types, the instructions differing only in TY.

#define WGMMA16_TILE_16(CT, TY) \
template <> \
struct Wgmma16<CT, 16> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[8], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n16k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n" \
            : WGMMA_D8 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_16(bf16_t, bf16)
WGMMA16_TILE_16(f16_t, f16)
#undef WGMMA16_TILE_16

#define WGMMA16_TILE_32(CT, TY) \
template <> \
struct Wgmma16<CT, 32> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[16], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n32k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n" \
            : WGMMA_D16 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
    template <int SCALE_D, int TRANS_B> \
    static __device__ __forceinline__ void rs(float (&d)[16], const unsigned (&a)[4], desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n32k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n" \
            : WGMMA_D16 \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_32(bf16_t, bf16)
WGMMA16_TILE_32(f16_t, f16)
#undef WGMMA16_TILE_32

#define WGMMA16_TILE_48(CT, TY) \
template <> \
struct Wgmma16<CT, 48> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[24], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n48k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, %27, %28;\n}\n" \
            : WGMMA_D24 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_48(bf16_t, bf16)
WGMMA16_TILE_48(f16_t, f16)
#undef WGMMA16_TILE_48

#define WGMMA16_TILE_64(CT, TY) \
template <> \
struct Wgmma16<CT, 64> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[32], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
            : WGMMA_D32 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
    template <int SCALE_D, int TRANS_B> \
    static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
            : WGMMA_D32 \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_64(bf16_t, bf16)
WGMMA16_TILE_64(f16_t, f16)
#undef WGMMA16_TILE_64

#define WGMMA16_TILE_96(CT, TY) \
template <> \
struct Wgmma16<CT, 96> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[48], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n96k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, %51, %52;\n}\n" \
            : WGMMA_D48 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
    template <int SCALE_D, int TRANS_B> \
    static __device__ __forceinline__ void rs(float (&d)[48], const unsigned (&a)[4], desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n96k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, %54;\n}\n" \
            : WGMMA_D48 \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_96(bf16_t, bf16)
WGMMA16_TILE_96(f16_t, f16)
#undef WGMMA16_TILE_96

#define WGMMA16_TILE_128(CT, TY) \
template <> \
struct Wgmma16<CT, 128> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[64], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
            : WGMMA_D64 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
    template <int SCALE_D, int TRANS_B> \
    static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
            : WGMMA_D64 \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_128(bf16_t, bf16)
WGMMA16_TILE_128(f16_t, f16)
#undef WGMMA16_TILE_128

#define WGMMA16_TILE_192(CT, TY) \
template <> \
struct Wgmma16<CT, 192> { \
    template <int SCALE_D, int TRANS_A = 0, int TRANS_B = 0> \
    static __device__ __forceinline__ void ss(float (&d)[96], desc_t da, desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n192k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, %99, %100;\n}\n" \
            : WGMMA_D96 \
            : "l"(da), "l"(db), "n"(SCALE_D), "n"(TRANS_A), "n"(TRANS_B)); \
    } \
    template <int SCALE_D, int TRANS_B> \
    static __device__ __forceinline__ void rs(float (&d)[96], const unsigned (&a)[4], desc_t db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n192k16.f32." #TY "." #TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100, p, 1, 1, %102;\n}\n" \
            : WGMMA_D96 \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(SCALE_D), "n"(TRANS_B)); \
    } \
};
WGMMA16_TILE_192(bf16_t, bf16)
WGMMA16_TILE_192(f16_t, f16)
#undef WGMMA16_TILE_192
