// Hilbert keys of every point of a grid, one thread per natural (row-major) index.
// The same algorithm and bit convention as hilbert_hpc.hilbert.hilbert_encode
// (Skilling's transpose algorithm, axis 0 most significant in each bit group),
// so sorting the keys reproduces the CPU serialization order bit for bit.

#define MAX_DIMS 16

extern "C" __global__ void hilbert_keys(const long long n, const int dims, const int bits,
                                        const long long* __restrict__ extents,
                                        unsigned long long* __restrict__ keys)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long x[MAX_DIMS];
    long long rem = i;
    for (int a = dims - 1; a >= 0; --a) {
        x[a] = (unsigned long long)(rem % extents[a]);
        rem /= extents[a];
    }
    // inverse undo of excess work, most significant bit first
    for (unsigned long long q = 1ull << (bits - 1); q > 1; q >>= 1) {
        const unsigned long long p = q - 1;
        for (int a = 0; a < dims; ++a) {
            if (x[a] & q) {
                x[0] ^= p;
            } else {
                const unsigned long long t = (x[0] ^ x[a]) & p;
                x[0] ^= t;
                x[a] ^= t;
            }
        }
    }
    // Gray encode
    for (int a = 1; a < dims; ++a) x[a] ^= x[a - 1];
    unsigned long long t = 0;
    for (unsigned long long q = 1ull << (bits - 1); q > 1; q >>= 1)
        if (x[dims - 1] & q) t ^= q - 1;
    for (int a = 0; a < dims; ++a) x[a] ^= t;
    // interleave: bit j of axis a lands at position j*dims + (dims-1-a)
    unsigned long long key = 0;
    for (int j = bits - 1; j >= 0; --j)
        for (int a = 0; a < dims; ++a) key = (key << 1) | ((x[a] >> j) & 1ull);
    keys[i] = key;
}
