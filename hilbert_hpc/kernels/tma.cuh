// The bulk tensor copy engine (TMA, sm_90a) and what feeds a pipeline with it: tensor maps, mbarriers
// (init, expected transaction bytes, arrive, wait on a phase), 4-D tensor loads and reduce-adds, bulk groups, the per-warpgroup register
// budget (setmaxnreg), and the stage and phase of iteration it in a ring of STAGES stages.
#pragma once

// A CUtensorMap (opaque, 128 bytes, 64-byte aligned) in global memory: maps[0] = Q, [1] = K, [2] = V.
struct __align__(64) TensorMap {
    unsigned long long words[16];
};

// Columns of one region of a tile loaded by TMA for head dim D: 64 (rows of 128 bytes, the 128-byte swizzle), or 32
// at D = 32 (rows of 64 bytes, the 64-byte swizzle), as tma.region_columns boxes them on the host
template <int D>
__host__ __device__ constexpr int tma_region_columns() { return D == 32 ? 32 : 64; }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// until the phase of parity `parity` of the barrier has completed
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// A consumer's release of what its warp's wgmma read (a stage's K or V): one arrival per warp, by lane
// 0 once every lane of the warp has passed the wait on its products (a barrier released this way counts
// RELEASE_ARRIVALS per consumer warpgroup). Measured against one arrival per thread (H100, in one process):
// 1.00-1.01x.
constexpr int RELEASE_ARRIVALS = 4;
__device__ __forceinline__ void mbar_release(unsigned bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

// a 32-bit word of shared memory, stored and loaded in program order (published to other warps through an
// mbarrier phase: the arrival releases what the thread stored before it, the wait acquires it)
__device__ __forceinline__ void st_shared_int(unsigned addr, int value) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}
__device__ __forceinline__ int ld_shared_int(unsigned addr) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}

// Registers of a warp-specialized block of one producer and NC consumer warpgroups: the launch bound gives
// 65536 / threads per thread, rounded down to 8 (at most 248); the producer keeps PREG and the consumers share the
// rest (at most 240 each).
template <int NC, int PREG_>
struct SplitRegs {
    static constexpr int THREADS = 128 * (NC + 1);
    static constexpr int ALLOC = ((65536 / THREADS) / 8) * 8 > 255 ? 248 : ((65536 / THREADS) / 8) * 8;
    static constexpr int PREG = PREG_;
    static constexpr int C = (((NC + 1) * ALLOC - PREG) / NC / 8) * 8;
    static constexpr int CREG = C > 240 ? 240 : C;
};

// the most dynamic shared memory a block may have on compute capability 9.0 (registry.HOPPER_SHARED)
constexpr int HOPPER_SMEM = 227 * 1024;

// one box of a 4-D tensor map (coordinates innermost first) into shared memory; completes on `bar`
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

// the float32 box at shared address src added element by element to a 4-D tensor map's box (coordinates
// innermost first; elements out of the tensor's bounds are skipped), in this thread's current bulk group
__device__ __forceinline__ void tma_reduce_add_4d(const TensorMap* map, unsigned src, int c0, int c1, int c2,
                                                  int c3) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}

// the float32 box at shared address src stored into a 4-D tensor map's box (coordinates innermost first;
// elements out of the tensor's bounds are skipped), in this thread's current bulk group
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, unsigned src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}

// close this thread's bulk group; wait until its groups read their shared sources (the buffers may be
// written again); wait until they completed (their writes to global memory done)
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// the mbarrier inits of this thread are visible to the other threads and the copy engine
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// ring of STAGES stages: iteration it uses stage it % STAGES in phase (it / STAGES) & 1 of its barriers
template <int STAGES>
__device__ __forceinline__ int stage_of(int it) { return it % STAGES; }
template <int STAGES>
__device__ __forceinline__ unsigned phase_of(int it) { return (it / STAGES) & 1; }

// Turns of NC consumer warpgroups at the tensor cores (FlashAttention-3's ping-pong scheduling): warpgroup w
// issues its matrix products only in its turn, then hands the turn to warpgroup (w + 1) % NC, so one
// warpgroup's softmax runs under the others' products instead of every warpgroup issuing at once and then
// waiting at once. Turn k of warpgroup w waits on hardware barrier FIRST + w (bar.sync by its 128 threads and
// bar.arrive by the 128 of the warpgroup before it: 256). Warpgroup NC - 1 opens the first turn of warpgroup
// 0 (start); each warpgroup takes the same number of turns, `turns`, and the last turn of warpgroup NC - 1 is
// handed to nobody, so every barrier phase started is completed. ON = false: no turns (every call is empty).
template <int NC, bool ON>
struct IssueTurns {
    static constexpr int FIRST = 1;          // barrier 0 is __syncthreads'
    int w;
    __device__ __forceinline__ void start() const {
        if (ON && w == NC - 1) asm volatile("bar.arrive %0, %1;\n" ::"r"(FIRST), "n"(2 * WG_THREADS) : "memory");
    }
    __device__ __forceinline__ void wait() const {
        if (ON) asm volatile("bar.sync %0, %1;\n" ::"r"(FIRST + w), "n"(2 * WG_THREADS) : "memory");
    }
    // after the products of turn k of `turns`
    __device__ __forceinline__ void pass(int k, int turns) const {
        if (ON && !(w == NC - 1 && k == turns - 1))
            asm volatile("bar.arrive %0, %1;\n" ::"r"(FIRST + (w + 1) % NC), "n"(2 * WG_THREADS) : "memory");
    }
};
