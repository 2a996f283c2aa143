// Pieces of every attention kernel: -inf, their parameter lists (one geometry), the offsets of a
// block's problem, and lane reductions (warp shuffles). Headers of this folder do not include each other:
// a kernel includes those it needs in this order: common.cuh, convert.cuh, cp_async.cuh, mma_sync.cuh,
// wgmma.cuh, tma.cuh, mask.cuh, attention.cuh, backward.cuh (kernels.program.source inlines them).
#pragma once

#define NEG_INF (-__int_as_float(0x7f800000))

// The geometry of a launch's problems, the last parameters of every attention kernel but tma16 (which takes a table
// of launch parts): element offsets (base) and segment, head and row strides of Q, K, V and the log-sum-exp L;
// heads of the group (problems per segment); query rows mq and key rows mk of a problem; causal (0 / 1) and its
// shift (query i sees key j when j < mk and, if causal, j <= i + causal_shift); the score scale. Row i of Q of
// problem (seg, t) is at q + q_base + seg q_seg + t q_head + i q_row; the output is addressed like Q (dO and dQ
// too), dK like K, dV like V, delta like L. Mirrored name for name and type for type by kernels.launch.GEOMETRY,
// the one packer of these values (tests/test_kernel_geometry.py reads this list). Scalars, not a struct: a struct
// passed by value is addressed through a register, its fields loaded where used (wgmma16_bwd 1.10-1.14x slower so
// on an H200).
#define DILATED_GEOMETRY_PARAMS                                                                           \
    long long q_base, long long q_seg, long long q_head, long long q_row,                                 \
    long long k_base, long long k_seg, long long k_head, long long k_row,                                 \
    long long v_base, long long v_seg, long long v_head, long long v_row,                                 \
    long long l_base, long long l_seg, long long l_head, long long l_row,                                 \
    int heads, int mq, int mk, int causal, int causal_shift, float scale

// This block's problem (blockIdx.x = segment * heads + head-in-group): element offsets of its first
// Q/output, K, V and log-sum-exp rows (qoff, koff, voff, loff), with DILATED_GEOMETRY_PARAMS in scope.
#define DILATED_FWD_PROBLEM_OFFSETS                                                                        \
    const long long problem_seg = (long long)blockIdx.x / heads;                                          \
    const int problem_head = (int)((long long)blockIdx.x % heads);                                        \
    const long long qoff = q_base + problem_seg * q_seg + problem_head * q_head;                           \
    const long long koff = k_base + problem_seg * k_seg + problem_head * k_head;                          \
    const long long voff = v_base + problem_seg * v_seg + problem_head * v_head;                          \
    const long long loff = l_base + problem_seg * l_seg + problem_head * l_head

// The parameters of the 16-bit forward kernels (T: bf16_t or f16_t): Q, K, V and the running output in T, the
// running log-sum-exp in float32 (merged into in place), then the geometry
#define DILATED_FWD16_PARAMS(T)                                                                           \
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,                            \
    T* __restrict__ out, float* __restrict__ lse, DILATED_GEOMETRY_PARAMS

// The parameters of every FP32 forward kernel: DILATED_FWD16_PARAMS of float
#define DILATED_FWD_PARAMS DILATED_FWD16_PARAMS(float)

// The parameters of every backward kernel (T: float, bf16_t or f16_t), docs/semantics.md section 10. Q, K, V
// and the output gradient dO in T; the merged log-sum-exp L (natural-log units, as the forward stores it) and
// delta = rowsum(dO * O) in float32; dQ, dK, dV float32 accumulators that the kernel adds its terms to; then the
// geometry. For the visible pairs (query i, key j) of a problem, with P = exp(scale q_i.k_j - L_i) and
// dS = P (dO_i.v_j - delta_i):
//   dQ_i += scale sum_j dS k_j,   dK_j += scale sum_i dS q_i,   dV_j += sum_i P dO_i.
// A launch's problems address disjoint rows; within a problem a key belongs to one block (dK, dV: plain
// read-add-write) while a query's dQ row gets terms from every key block (atomicAdd).
#define DILATED_BWD_PARAMS(T)                                                                             \
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,                            \
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,           \
    float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, DILATED_GEOMETRY_PARAMS

// max / sum over groups of WIDTH consecutive lanes (WIDTH a power of two <= 32)
template <int WIDTH>
__device__ __forceinline__ float lanes_max(float x) {
    for (int o = WIDTH / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

template <int WIDTH>
__device__ __forceinline__ float lanes_sum(float x) {
    for (int o = WIDTH / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
