// Conversions between a 16-bit running output (bf16_t / f16_t bits) and the float32 running output that
// tma16 keeps for a group of heads (kernels/sixteen_bit.py, SixteenBitKernels): rows of `width` elements, `head_dim` per head
// (both multiples of 8), source row r at src + r * src_stride, destination row r at dst + r * dst_stride
// (elements; every row start 16-byte aligned); the log-sum-exp of row r, head j of the group at
// lse[r * l_stride + l_first + j]. A thread a (row, head) pair and step, 16-byte accesses on the 16-bit side.
//   widen_16: only (row, head) pairs with a running log-sum-exp (not -inf) are read: the others have no old
//     value, and the kernels' merge ignores their running output (weight 0), so a fresh output costs one read
//     of each pair's log-sum-exp;
//   narrow_16 (where the kernels do not round a row at its last merge: a dilation that does not divide its
//     segment): only pairs with a log-sum-exp are written: what no launch merged stays untouched, as the
//     kernels leave it.
// The 16-bit values are widened exactly and rounded to nearest even by the same PTX conversions as the
// attention kernels (Half16 in convert.cuh), so the result is what those kernels would have written.

#include "common.cuh"
#include "convert.cuh"

#define CONVERT16_PARAMS(SRC, DST)                                                                         \
    const SRC* __restrict__ src, DST* __restrict__ dst, const float* __restrict__ lse, long long rows,    \
    int width, int head_dim, long long src_stride, long long dst_stride, long long l_stride, long long l_first

// step(r, c) for every step of eight columns c of the head of each of this thread's (row r, head) pairs that has
// a log-sum-exp (a pair without one costs the read of it alone)
template <typename Step>
__device__ __forceinline__ void for_merged_steps(const float* __restrict__ lse, long long rows, int width,
                                                 int head_dim, long long l_stride, long long l_first, Step step) {
    const int heads = width / head_dim;
    const long long total = rows * heads;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / heads;
        const int j = (int)(i - r * heads);
        if (lse[r * l_stride + l_first + j] == NEG_INF) continue;
        for (int c = j * head_dim; c < (j + 1) * head_dim; c += 8) step(r, c);
    }
}

template <typename T>
__global__ void widen_16(CONVERT16_PARAMS(unsigned short, float)) {
    using H = Half16<T>;
    for_merged_steps(lse, rows, width, head_dim, l_stride, l_first, [&](long long r, int c) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + r * src_stride + c);
        const float2 a = H::unpack(v.x), b = H::unpack(v.y), e = H::unpack(v.z), f = H::unpack(v.w);
        float4* to = reinterpret_cast<float4*>(dst + r * dst_stride + c);
        to[0] = make_float4(a.x, a.y, b.x, b.y);
        to[1] = make_float4(e.x, e.y, f.x, f.y);
    });
}

template <typename T>
__global__ void narrow_16(CONVERT16_PARAMS(float, unsigned short)) {
    using H = Half16<T>;
    for_merged_steps(lse, rows, width, head_dim, l_stride, l_first, [&](long long r, int c) {
        const float4* from = reinterpret_cast<const float4*>(src + r * src_stride + c);
        const float4 a = from[0], b = from[1];
        *reinterpret_cast<uint4*>(dst + r * dst_stride + c) =
            make_uint4(H::pack(a.x, a.y), H::pack(a.z, a.w), H::pack(b.x, b.y), H::pack(b.z, b.w));
    });
}
