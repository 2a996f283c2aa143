// Pieces of the mma.sync backward kernels (dilated_bwd_mma_16.cu, dilated_bwd_tf32x3.cu). Include after
// common.cuh.
#pragma once

// The float32 dK (times scale) and dV of a warp's 16 keys, held on the accumulator layout of mma.sync m16n8
// (lane = 4 g + t: g[n][2 h + e] = key key0 + 8 h, column 8 n + 2 t + e), added to the float32 dk and dv rows
// (element offsets koff + j k_row, voff + j v_row; keys past mk left alone): every old value of a row is read
// before any is stored. The keys belong to this block alone: no atomics.
template <int ND>
__device__ __forceinline__ void add_key_gradients(float* dk, float* dv, long long koff, long long voff,
                                                  long long k_row, long long v_row, int key0, int mk, int t,
                                                  float scale, const float (&gk)[ND][4],
                                                  const float (&gv)[ND][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = key0 + 8 * h;
        if (j >= mk) continue;
        float2* krow = reinterpret_cast<float2*>(dk + koff + j * k_row + 2 * t);
        float2* vrow = reinterpret_cast<float2*>(dv + voff + j * v_row + 2 * t);
        float2 pk[ND], pv[ND];
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            pk[n] = krow[4 * n];
            pv[n] = vrow[4 * n];
        }
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            krow[4 * n] = make_float2(pk[n].x + scale * gk[n][2 * h], pk[n].y + scale * gk[n][2 * h + 1]);
            vrow[4 * n] = make_float2(pv[n].x + gv[n][2 * h], pv[n].y + gv[n][2 * h + 1]);
        }
    }
}
