// Pieces of the tensor-core backward kernels (dilated_bwd_mma_16.cu, dilated_bwd_tf32x3.cu,
// dilated_bwd_wgmma_16.cu). Include after common.cuh and convert.cuh.
#pragma once

// L (log2 units; +inf where L = -inf or i >= mq, so that P = 0) and delta (0 past mq) of query row i
__device__ __forceinline__ void query_stats(const float* __restrict__ lse, const float* __restrict__ delta,
                                            long long loff, long long l_row, int i, int mq, float& l2, float& dl) {
    const float l = i < mq ? lse[loff + i * l_row] : NEG_INF;
    l2 = (l == NEG_INF) ? -NEG_INF : l * LOG2E;
    dl = i < mq ? delta[loff + i * l_row] : 0.0f;
}

// Programmatic dependent launch (compute capability 9.0; docs/kernels.md): every block lets the next backward
// launch of the same call start once all of this launch's blocks are running (its blocks fill the SMs that this
// launch's last wave leaves idle), and a block waits for the launch before it to complete only where it reads
// what that launch writes: dK and dV, before their read-add-write (its dQ additions commute, its inputs were
// written before the call). Without the launch attribute, and before 9.0, both are nothing.
__device__ __forceinline__ void allow_next_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void st_shared_b32(unsigned addr, unsigned x) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}

// (x, y) added to the two floats at p (8-byte aligned global memory): one vector reduction on compute
// capability 9.0, two atomicAdd before
__device__ __forceinline__ void add_pair(float* p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// The float32 dK (times scale) and dV of a warp's 16 keys, held on the accumulator layout of mma.sync m16n8
// (lane = 4 g + t: g[n][2 h + e] = key key0 + 8 h, column 8 n + 2 t + e), added to the float32 dk and dv rows
// (element offsets koff + j k_row, voff + j v_row; keys past mk left alone), the product scale dK rounded before
// the addition (as an addition by TMA reduce-add from a stored tile rounds it): every old value of a row is read
// before any is stored, once the launch before this one has completed (wait_for_previous_launch). The keys
// belong to this block alone: no atomics. fresh: dk and dv hold no terms yet (whatever they hold is not read):
// the rows are stored, not added to.
template <int ND>
__device__ __forceinline__ void add_key_gradients(float* dk, float* dv, long long koff, long long voff,
                                                  long long k_row, long long v_row, int key0, int mk, int t,
                                                  float scale, const float (&gk)[ND][4],
                                                  const float (&gv)[ND][4], bool fresh = false) {
    wait_for_previous_launch();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = key0 + 8 * h;
        if (j >= mk) continue;
        float2* krow = reinterpret_cast<float2*>(dk + koff + j * k_row + 2 * t);
        float2* vrow = reinterpret_cast<float2*>(dv + voff + j * v_row + 2 * t);
        float2 pk[ND], pv[ND];
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            pk[n] = fresh ? make_float2(0.0f, 0.0f) : krow[4 * n];
            pv[n] = fresh ? make_float2(0.0f, 0.0f) : vrow[4 * n];
        }
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            krow[4 * n] = make_float2(pk[n].x + __fmul_rn(scale, gk[n][2 * h]),
                                      pk[n].y + __fmul_rn(scale, gk[n][2 * h + 1]));
            vrow[4 * n] = make_float2(pv[n].x + gv[n][2 * h], pv[n].y + gv[n][2 * h + 1]);
        }
    }
}

// fresh launches (add_key_gradients): rows [k0, min(k0 + rows, mk)) of dk and dv (D floats each, element offsets
// koff + j k_row, voff + j v_row) set to zero by `count` threads numbered `self`, for key blocks that no query sees
template <int D>
__device__ __forceinline__ void zero_key_rows(float* dk, float* dv, long long koff, long long voff, long long k_row,
                                              long long v_row, int k0, int rows, int mk, int self, int count) {
    wait_for_previous_launch();
    const int n = max(0, min(rows, mk - k0)) * (D / 4);
    for (int p = self; p < n; p += count) {
        const long long j = k0 + p / (D / 4), c = 4 * (p % (D / 4));
        *reinterpret_cast<float4*>(dk + koff + j * k_row + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *reinterpret_cast<float4*>(dv + voff + j * v_row + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
