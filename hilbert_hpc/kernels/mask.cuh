// Which (query, key) pairs of a problem are visible, for the forward and the backward kernels alike: query i
// sees key j when j < mk (the problem's keys) and, if causal, j <= i + causal_shift (docs/semantics.md). The
// forward walks the keys of a block of queries (visible_key_end, unmasked_key_end), the backward the queries
// of a block of keys (first_visible_query); a tile that holds an invisible pair is masked (tile_needs_mask,
// mask_query_pair), the others are not. Include after common.cuh.
#pragma once

// Keys [0, visible_key_end) hold every key visible to queries below query_end (a uniform bound for a block or
// warpgroup); kend: the problem's keys.
__device__ __forceinline__ int visible_key_end(int kend, int causal, int query_end, int causal_shift) {
    return causal ? min(kend, max(0, query_end + causal_shift)) : kend;
}

// Keys [0, unmasked_key_end) are visible to every query from first_query on: tiles below it need no mask.
__device__ __forceinline__ int unmasked_key_end(int kend, int causal, int first_query, int causal_shift) {
    return causal ? min(kend, max(0, first_query + causal_shift + 1)) : kend;
}

// The first query that sees key k (every query before it sees no key from k on).
__device__ __forceinline__ int first_visible_query(int causal, int k, int causal_shift) {
    return causal ? max(0, k - causal_shift) : 0;
}

// Whether the tile of keys [k0, k0 + KEYS) and queries from q0 on holds a pair that is not visible: keys past
// mk, or (causal) a key past the tile's first query + causal_shift. Uniform over the tile.
template <int KEYS>
__device__ __forceinline__ bool tile_needs_mask(int k0, int q0, int mk, int causal, int causal_shift) {
    return k0 + KEYS > mk || (causal && q0 + causal_shift < k0 + KEYS - 1);
}

// The scores (or probabilities) of queries i and i + 1 with key j (a transposed tile's pair of adjacent
// columns, as the backward holds P^T), each set to 0 where the query does not see the key.
__device__ __forceinline__ void mask_query_pair(float& first, float& second, int i, int j, int mk, int causal,
                                                int causal_shift) {
    const bool in = j < mk;
    if (!in || (causal && j > i + causal_shift)) first = 0.0f;
    if (!in || (causal && j > i + 1 + causal_shift)) second = 0.0f;
}
