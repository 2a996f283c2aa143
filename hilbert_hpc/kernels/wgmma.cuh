// Pieces shared by the Hopper (sm_90a) warpgroup-MMA kernels (dilated_fwd_wgmma_tf32.cu, dilated_fwd_wgmma_16.cu):
// warpgroup geometry, the descriptor type, wgmma fences, commits and waits, the async-proxy fence, and the
// register pin that keeps accumulator accesses on their side of a wgmma issue or wait.
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
