// delta = rowsum(a * b) of the backward (docs/semantics.md section 10): out[r] = sum_c a[r, c] b[r, c] in
// float32 over `rows` rows of `width` elements (row r at a + r * width, b + r * width: an (n, H, D) array is
// n H rows of D), the 16-bit values widened exactly (Half16 in convert.cuh). One pass over a and b, no
// temporaries: what the backward reads of dO and O before its kernels.
//
// LANES = 8 lanes a row, four rows a warp: lane l of a row takes the chunks l, l + 8, l + 16, ... of VEC
// elements (16 bytes when VEC > 1: the row's 8 lanes read 128 contiguous bytes a step), and the row's sum is
// the lanes' partial sums added by shuffles. VEC = 1: any width and alignment, one element a load. Each row's
// sum is taken in the same order every run (the result is reproducible bit for bit).

#include "common.cuh"
#include "convert.cuh"

// the VEC elements at p (16-byte aligned when VEC > 1) as float32, multiplied pairwise with those at q and
// added to acc
template <typename T, int VEC>
struct DotChunk;

template <>
struct DotChunk<float, 1> {
    static __device__ __forceinline__ float add(const float* p, const float* q, float acc) { return fmaf(*p, *q, acc); }
};

template <>
struct DotChunk<float, 4> {
    static __device__ __forceinline__ float add(const float* p, const float* q, float acc) {
        const float4 x = *reinterpret_cast<const float4*>(p), y = *reinterpret_cast<const float4*>(q);
        return fmaf(x.w, y.w, fmaf(x.z, y.z, fmaf(x.y, y.y, fmaf(x.x, y.x, acc))));
    }
};

template <typename T>
struct DotChunk<T, 1> {
    static __device__ __forceinline__ float add(const T* p, const T* q, float acc) {
        const float x = Half16<T>::unpack(p->bits).x, y = Half16<T>::unpack(q->bits).x;
        return fmaf(x, y, acc);
    }
};

template <typename T>
struct DotChunk<T, 8> {
    static __device__ __forceinline__ float add(const T* p, const T* q, float acc) {
        const uint4 x = *reinterpret_cast<const uint4*>(p), y = *reinterpret_cast<const uint4*>(q);
        const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 u = Half16<T>::unpack(xs[i]), w = Half16<T>::unpack(ys[i]);
            acc = fmaf(u.y, w.y, fmaf(u.x, w.x, acc));
        }
        return acc;
    }
};

constexpr int ROW_DOT_LANES = 8;

template <typename T, int VEC>
__global__ void row_dot(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ out, long long rows,
                        int width) {
    const int lane = threadIdx.x % ROW_DOT_LANES;
    const long long first = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / ROW_DOT_LANES;
    const long long step = (long long)gridDim.x * blockDim.x / ROW_DOT_LANES;
    const int chunks = width / VEC;
    for (long long r0 = first - first % (32 / ROW_DOT_LANES); r0 < rows; r0 += step) {
        // every lane of a warp runs the same number of iterations (the shuffles need all 32)
        const long long r = r0 + (first % (32 / ROW_DOT_LANES));
        float acc = 0.0f;
        if (r < rows) {
            const T* pa = a + r * width;
            const T* pb = b + r * width;
            for (int c = lane; c < chunks; c += ROW_DOT_LANES) acc = DotChunk<T, VEC>::add(pa + VEC * c, pb + VEC * c, acc);
        }
        acc = lanes_sum<ROW_DOT_LANES>(acc);
        if (r < rows && lane == 0) out[r] = acc;
    }
}
