// Asynchronous copies global -> shared memory (cp.async, sm_80+): closing a group, waiting for groups.
#pragma once

// cp.async groups (sm_80+): close the group of copies issued so far; wait until every group has landed
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// until at most N groups of this thread are pending (no compiler memory barrier: the FP32 mma.sync kernel)
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 16 bytes global -> shared (byte address `to`), `bytes` of them read (16, or 0: zero-filled), in the open group
__device__ __forceinline__ void cp_async_16(unsigned to, const void* from, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(bytes) : "memory");
}
