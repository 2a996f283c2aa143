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
