// Hopper (sm_90a) tensor-core dilated-attention backward for 16-bit inputs (bfloat16 or float16): warpgroup
// MMA (wgmma m64nNk16, FP32 accumulation) in FlashAttention-2/3 order: a block owns BK = 64 NWG keys and walks
// the query tiles that see them. Arguments and semantics: DILATED_BWD_PARAMS (common.cuh), docs/semantics.md
// section 10; rows aligned to 8 elements (16 bytes), mq and mk arbitrary (tails zero-filled and masked). The
// same algorithm as dilated_bwd_mma_16.cu, with a warpgroup per 64 keys (the wgmma M dimension). Head dims 32,
// 64, 96, 128.
//
// Grid: problems (DILATED_FWD_PROBLEM_OFFSETS's segment * heads) x key blocks of BK keys, numbered key block
// fastest (block = x + gridDim.x y: problem block / gridDim.y, key block block % gridDim.y), so that the key
// blocks of one problem run together and its Q, dO and dq stay in L2. Computing threads: NWG warpgroups of
// 128, warpgroup w owning keys k0 + 64 w .. k0 + 64 w + 63; query tiles of BQ = 64 rows (BQ = 128: below). K and
// V of the block's keys are staged once. Q, dO, L and delta per tile: warpgroup 0 is a producer
//   (setmaxnreg.dec) that fills STAGES stages, publishes tile it on full[it % STAGES] and refills a stage once
//   empty[s] has the 256 arrivals of the consumers (warpgroups 1, 2, setmaxnreg.inc), which meet only at named
//   barrier 1 (dS^T of the previous tile published; PIPE = 2: an mbarrier). LOAD = 0: Q and dO by cp.async from
//   the producer's threads (full: 128 arrivals after the copies landed and a proxy fence); LOAD = 1: by TMA from
//   one thread through the tensor maps maps[1], maps[2] (boxes of 64 columns x 64 rows, 128-byte swizzle; at
//   D = 32 of 32 columns, 64-byte swizzle; rows past mq zero-filled; full: the copies' bytes, one arrival with
//   them and one from each of the 64 threads that store L and delta), the first NST stages issued while K and V
//   load.
// Per query tile and computing warpgroup:
//   S^T = K Q^T and dP^T = V dO^T (D / 16 wgmma m64n64k16 each, A = this warpgroup's K / V rows and B = the
//     Q / dO tile from shared memory, both K-major; issued together, S^T waited for first);
//   P^T = exp2(scale log2e S^T - L log2e), 0 for invisible pairs (masks only on boundary tiles) and for rows
//     with L = -inf or past mq (L staged as +inf);
//   dV += P^T dO (A = P^T repacked in registers as 16-bit fragments; B = dO MN-major, imm-trans-b = 1);
//   dS^T = P^T (dP^T - delta); dK += dS^T Q (A = dS^T from registers; B = Q MN-major);
//   dS^T (16-bit) to shared memory; after the consumers met, dQ(tile) = dS K: M = the BQ queries, N = D / NWG
//     columns per warpgroup, K = the BK keys (A = dS read MN-major from the dS^T buffer, imm-trans-a = 1;
//     B = K MN-major), and scale dQ added to the float32 dq with red.global.add.v2.f32.
// dS^T is double-buffered and a tile's dQ is issued with the next tile's S^T and dP^T, so that it runs during
// that tile's softmax (PIPE = 1: the consumers meet once a tile at the named barrier); with more than 48 dQ
// columns per warpgroup (D = 128) only the first 32 are, the rest follow once S^T and dP^T are dead. PIPE = 2:
// as PIPE = 1, but the consumers hand dS^T over through an mbarrier instead of
// meeting at the named barrier: a consumer arrives once its dS^T of tile it is stored (and fenced) and its
// reads of tile it - 1's dS^T (the dQ of it - 1, every column part) are done, and waits for the 256 arrivals of
// tile it - 1 only right before issuing that tile's dQ; the two warpgroups drift apart by up to a tile, so one's
// softmax overlaps the other's wgmma. The last tile's dQ follows the loop.
// DQ = 1 (PIPE = 2): instead of red.global.add, a tile's scaled dQ is stored into a float32 shared tile in the
// boxes of the tensor map maps[0] (32 columns x BQ rows each, 128-byte swizzle) and published on an mbarrier
// (256 arrivals); warp 3 of the producer adds it to dq by one TMA reduce-add a box, waits until the tile is read
// and frees it on a second mbarrier, which the consumers wait for before storing the next tile's dQ (with LOAD = 0
// slower than DQ = 0: the loads then lose a warp; with LOAD = 1 the default, docs/kernels.md).
// At the end dK is scaled and dK, dV are added to dk, dv after the launch before this one completed
// (programmatic dependent launch, backward.cuh): DKV = 0: read-add-write by every consumer thread (a key row
// belongs to one block); DKV = 1: stored as float32 tiles over K, V and the stages in the boxes of maps[3] (dk)
// and maps[4] (dv) and added by one TMA reduce-add a box from thread 0 of each warpgroup.
// BQ = 128 (D <= 64, PIPE = 2, LOAD = 1; DS_FIRST): S^T and dP^T are 64 registers each, so dS^T is worked out
// before dV is issued (P^T packed for dV once S^T is dead), dK reads dS^T from this warpgroup's rows of the dS^T
// buffer (K-major, after a named barrier of its 128 threads) instead of from registers, and a tile's dQ is split
// by query halves (warpgroup w: queries 64 w .. 64 w + 63, every column, in parts of 32) and issued once dS^T is
// stored, not with the next tile's S^T; a Q or dO region and a dQ column box are two TMA boxes of 64 rows.
// Producer 24, consumers 240 registers. Slower than BQ = 64 (0.94-0.99x, docs/kernels.md).
// Persistent blocks (LOOP: LOAD = 1, DQ = 1, PIPE = 2, DKV = 0, BQ = 64, D = 32 or 64; the host gives `items` > 0
// and a grid of one block per SM): a block works through the work items (problem, key block) first, first +
// gridDim, ...; every role walks the same items, the stages, dS^T buffers, dQ tiles and their mbarrier phases
// counted over the block's tiles of all its items (g); producer warp 2 stages each item's K and V by cp.async into
// one of two buffers (kv_full[b], 32 arrivals; refilled once kv_empty[b] has the consumers' 256 arrivals after the
// item's last dQ), so the next item's K, V and first Q, dO tiles load during this item's tiles and its dK, dV
// epilogue. A block's fixed cost (staging, pipeline fill, last dQ, epilogue) fell from 8.7 to 5.1 us at D = 64 and
// from 6.6 to 4.0 us at D = 32 (tests/scripts/bwd_block_cost.py, docs/performance.md); at D = 96 and 128 there is
// no room for the second buffer, and with one the gain was none (0.97-0.99x at D = 128).
// Registers (ptxas, sm_90a): 168 at launch (one block of 12 warps per SM), producer 40 / consumers 232 (D = 64),
// 24 / 240 (D = 96, 128), no spills at STAGES = 3 (D = 128 spills a few bytes at STAGES = 2 and 4). LOAD = 1 defaults
// (2, 2, 3, 1, 1, 0), H200, 2026-11-29: D = 64 361 useful TFLOP/s, causal 285; D = 96 407 / 327; D = 128
// 437 / 354 (docs/performance.md). Earlier, before the TMA loads, on an H200
// (tests/scripts/bwd_wgmma16_check.py, 2026-11-25; N = 262,144, patterns (2048,1) (4096,2) (8192,4), bf16,
// useful TFLOP/s = 2.5 x the forward's FLOPs): D = 64 (H = 12) (2, 2, 3): 299, causal 253 ((2, 1, 3): 292 / 235);
// D = 128 (H = 8) (2, 2, 3): 338, causal 294 ((2, 1, 3): 333 / 283, (2, 1, 0): 314 / 264). Numbering the blocks
// problem-major cut the DRAM traffic from 50 % to 7 % of its peak (L2 hit rate 57 % -> 92 %, ncu). Tried and no
// faster: a dQ per warpgroup over its own 64 keys and every column (no dS^T exchange at all, twice the dq
// atomics: 29.3 / 17.5 ms at D = 64 against 24.5 / 14.4 in that run); no wait at the end of a tile, so that its
// dV and dK run on into the next tile's S^T and dP^T (the stage released after that S^T): 24.3 / 14.1 ms at
// D = 64 against 24.1 / 14.3, and it spills at D = 128.
// Tried and no faster (before the producer): dQ staged in shared memory and added by one bulk reduce
// (cp.reduce.async.bulk) per row, red.global.add.v4.f32 after a lane exchange, the A operands of dV and dK
// (P^T, dS^T) read from shared memory.
//
// Shared memory (bytes); K, V and dS^T in core-matrix order [row / 8][col / 8][row % 8][8], no swizzle (as in
// dilated_fwd_wgmma_16.cu: K-major descriptors LBO = 128, SBO = 16 W for a W-wide tile; the same tile read
// MN-major with LBO = 16 W, SBO = 128), Q and dO so too with LOAD = 0, with LOAD = 1 as the copy engine's
// 128-byte (D = 32: 64-byte) swizzle writes them (StagedTile); from a 1024-byte-aligned window where any tile is
// swizzled:
//   K, V of the block     2 * BK * D * 2
//   Q, dO, NST stages     2 * NST * BQ * TD * 2 (NST = STAGES; TD = D, or LOAD = 1 whole
//                         regions of 64 columns, 32 at D = 32: 128 at D = 96)
//   dS^T (keys x queries) 2 * BK * BQ * 2
//   L, delta, NST stages  8 * NST * BQ
//   mbarriers full[NST], empty[NST]: 16 * NST; PIPE = 2: + the dS^T handoff mbarrier, 8
//   DQ = 1: the dQ tile first, BQ * D * 4, and its two mbarriers, 16
//   DKV = 1: no more (the dK and dV tiles, 4 * 64 * D * 4, overwrite K, V and the stages at the end)
//   LOOP: kv_full[2], kv_empty[2], 32; then, from the next 1024-byte boundary, the second K and V, 2 * BK * D * 2
//   (D = 64: 116,280 (PIPE, STAGES = 2, 3), 132,680 (2, 3, DQ = LOAD = 1), 165,888 (the LOOP default); D = 96:
//   206,408 (2, 3, 1, 1); D = 128: 198,200 (2, 3), 230,984 (2, 3, DQ = 1, any LOAD))
// Fragments (per warp of a warpgroup, lane = 4 g + t): accumulator element 4 i + 2 h + e = (row g + 8 h of the
// warp's 16, column 8 i + 2 t + e); element r of the 16-bit A fragment of k-step kk is accumulator element
// 8 kk + r (dilated_fwd_wgmma_16.cu), so P^T and dS^T become A operands in place.

#include "common.cuh"
#include "convert.cuh"
#include "cp_async.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "mask.cuh"
#include "backward.cuh"

// rows [r0, r0 + ROWS) of a D-wide 16-bit matrix (row j at src + off + j * row_stride elements; rows at or
// past rend are zero-filled) into shared memory at byte address dst in core-matrix order
// [row / 8][col / 8][row % 8][8] by the THREADS threads numbered `self`; one 16-byte cp.async per chunk, no commit
template <typename T, int D, int ROWS, int THREADS, int UNROLL = 4>
__device__ __forceinline__ void stage_core_rows(unsigned dst, const T* __restrict__ src, long long off,
                                                long long row_stride, int r0, int rend, int self) {
    constexpr int KC = D / 8;
#pragma unroll UNROLL
    for (int p = self; p < ROWS * KC; p += THREADS) {
        const int r = (p / (8 * KC)) * 8 + (p & 7), c = (p >> 3) % KC, j = r0 + r;
        const T* from = src + off + (long long)max(0, min(j, rend - 1)) * row_stride + 8 * c;
        cp_async_16(dst + 16 * p, from, j < rend ? 16 : 0);
    }
}

__device__ __forceinline__ void st_shared_v2_f32(unsigned addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ void st_shared_f32(unsigned addr, float x) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}

// Descriptors of a staged Q or dO tile of BQ rows in the layout LOAD gives it (0: core-matrix order, D columns;
// 1: the copy engine's swizzle of RB-byte rows, regions of RC columns of BQ rows, BQ RB bytes apart), read K-major
// (the B of S^T and dP^T; k-step ks = 16 columns) or MN-major (the B of dV and dK; k-step kk = 16 queries). Steps
// are offsets in 16-byte units, added to the descriptor's start address.
template <int D, int BQ, int LOAD>
struct StagedTile {
    static constexpr int RC = tma_region_columns<D>(), RB = 2 * RC, KS = RC / 16;   // KS: k-steps of a region
    static __device__ __forceinline__ desc_t k_major(unsigned base) {
        return LOAD ? smem_desc_swizzled<RB>(base, 16) : smem_desc(base, 128, 16 * D);
    }
    static __device__ __forceinline__ unsigned k_step(int ks) {   // region ks / KS, + 32 (ks % KS) bytes
        return LOAD ? BQ * RB / 16 * (ks / KS) + 2 * (ks % KS) : 16 * ks;
    }
    static __device__ __forceinline__ desc_t mn_major(unsigned base) {
        return LOAD ? smem_desc_swizzled<RB>(base, BQ * RB) : smem_desc(base, 16 * D, 128);
    }
    static __device__ __forceinline__ unsigned mn_step(int kk) { return LOAD ? RB * kk : 2 * D * kk; }
};

// A warpgroup's float32 accumulators of 64 rows x 8 NB columns (fragment [NB][4]: row 16 warp + g + 8 h, column
// c0 + 8 n + 2 t + e), times mul, stored into rows r0 .. r0 + 63 of a [ROWS][W] float32 tile at byte address base
// (1024-byte aligned; r0 a multiple of 8) in the layout of boxes of [ROWS][32] floats with the 128-byte swizzle
// (tensor-map boxes of 64 rows stacked): box col / 32 at ROWS * 128 col / 32 bytes, 16-byte chunk col % 32 / 4 of
// row r at chunk (col % 32 / 4) ^ (r % 8), 4 (col % 4) bytes in
template <int NB, int ROWS = 64>
__device__ __forceinline__ void store_swizzled_boxes(unsigned base, int c0, const float (&a)[NB][4], float mul,
                                                     int warp, int g, int t, int r0 = 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const int col = c0 + 8 * n + 2 * t;
            const unsigned at = base + (col >> 5) * (ROWS * 128) + (r0 + 16 * warp + g + 8 * h) * 128 +
                                16 * (((col & 31) >> 2) ^ g) + 4 * (col & 3);
            st_shared_v2_f32(at, mul * a[n][2 * h], mul * a[n][2 * h + 1]);
        }
}

// One work item of dilated_bwd_wgmma_16: the BK keys from k0 of problem (seg, head), the element offsets of its
// problem's Q (dO, dq), K (dk), V (dv) and L (delta) rows, the first query that sees its keys and its query tiles
// (0: no query sees them)
struct BwdItem {
    long long qoff, koff, voff, loff;
    int seg, head, k0, q_begin, ntiles;
};

// the consumer warpgroups (threads 128 .. 383 of a warp-specialized block) meet at named barrier 1
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// the 128 threads of computing warpgroup wg meet at named barrier 2 + wg
__device__ __forceinline__ void warpgroup_sync(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
}

// Shared memory of one block in bytes (the layout at the top of this file); NST stages of Q, dO, L and delta
// of query tiles of BQ rows; a Q or dO tile stores TD columns (D, or with LOAD = 1 whole swizzled regions of 64);
// DQ = 1: the float32 dQ tile first (OFF_* count from the end of it); ALIGN: swizzled tiles (DQ, LOAD or DKV = 1),
// from a 1024-byte-aligned base at offsets that keep them so; LOOP: the K/V full and empty mbarriers of a block that
// works through several items, and with KVB = 2 a second K and V buffer (the next item's, staged during this one)
template <int D, int TD, int NWG, int PIPE, int NST, int DQ, int ALIGN, int BQ_, bool LOOP, int KVB = 1>
struct BwdSmemWg {
    static constexpr int BK = 64 * NWG, BQ = BQ_;
    static constexpr int DQ_TILE = DQ ? BQ * D * 4 : 0;   // the dQ tile: D / 32 boxes of [BQ][32] floats
    static constexpr int KV = BK * D * 2;        // K or V of the block
    static constexpr int TILE = BQ * TD * 2;     // one Q or dO tile
    static constexpr int REGION = BQ * 2 * tma_region_columns<D>();   // LOAD = 1: one swizzled region of a tile
    static constexpr int DS = BK * BQ * 2;       // one dS^T buffer
    static constexpr int GRAD_TILE = 64 * D * 4; // DKV = 1: a warpgroup's float32 dK or dV, over K, V and the stages
    static constexpr bool GRADS_FIT = 2 * NWG * GRAD_TILE <= 2 * KV + 2 * NST * TILE;
    static constexpr int OFF_V = KV, OFF_Q = 2 * KV;
    static constexpr int OFF_DS = OFF_Q + 2 * NST * TILE;  // stage s: Q at OFF_Q + 2 s TILE, dO at + TILE
    static constexpr int OFF_L = OFF_DS + 2 * DS;             // stage s: L at float 2 s BQ, delta at (2 s + 1) BQ
    static constexpr int OFF_BAR = OFF_L + 8 * NST * BQ;        // full[NST], empty[NST]
    static constexpr int OFF_DQBAR = OFF_BAR + 16 * NST + (PIPE == 2 ? 8 : 0);   // PIPE = 2: + the dS^T handoff
    static constexpr int OFF_KVBAR = OFF_DQBAR + (DQ ? 16 : 0);         // DQ = 1: + dQ full and empty mbarriers
    static constexpr int KV_BARS = LOOP ? 16 * KVB : 0;                 // LOOP: K/V full[KVB] and empty[KVB]
    static constexpr int OFF_KV2 = (OFF_KVBAR + KV_BARS + 1023) / 1024 * 1024;   // KVB = 2: K and V again
    static constexpr int bytes = (KVB == 2 ? OFF_KV2 + 2 * KV : OFF_KVBAR + KV_BARS) + DQ_TILE;
    static constexpr bool ALIGNED = ALIGN;
    static_assert(!ALIGN || (KV % 1024 == 0 && TILE % 1024 == 0 && DQ_TILE % 1024 == 0 && GRAD_TILE % 1024 == 0),
                  "swizzled tiles aligned");
};

// What a configuration (NWG, PIPE, STAGES, DQ, LOAD, DKV, QT) of the kernel below derives, in one place (the host's
// registry.wgmma16_bwd_shared_bytes and wgmma16_bwd_persistent mirror Layout::bytes and LOOP; the package's tests
// compile static_asserts that they agree). TD: stored columns of a Q or dO tile (D, or with LOAD = 1 whole
// regions of RC columns). LOOP (LOAD = 1, DQ = 1, PIPE = 2, DKV = 0, BQ = 64, D = 32 or 64): a block works through
// items first, first + stride, ... (a persistent grid when `items` > 0), the next item's K and V staged into a
// second buffer by producer warp 2 during this item's tiles (KVB = 2 buffers behind kv_full / kv_empty mbarriers).
// Not at D = 96 and 128: no room for a second K and V (with one, the item's K and V wait for the last one's tiles:
// 0.97-0.99x at D = 128, docs/performance.md), and with BQ = 128 no register to spare.
template <int D, int NWG, int PIPE, int STAGES, int DQ, int LOAD, int DKV, int QT>
struct BwdConfig {
    enum : int {                             // (an enum: constants that are never objects in device memory)
        RC = tma_region_columns<D>(),
        TD = LOAD ? (D + RC - 1) / RC * RC : D,
        LOOP = LOAD == 1 && DQ == 1 && PIPE == 2 && DKV == 0 && QT == 64 && D <= 64,
        KVB = LOOP ? 2 : 1
    };
    using Layout = BwdSmemWg<D, TD, NWG, PIPE, STAGES, DQ, DQ || LOAD || DKV, QT, LOOP != 0, KVB>;
};

// NWG = 2 computing warpgroups and STAGES (2 to 4) stages: warpgroup 0 is the producer (setmaxnreg.dec to
// PREG), warpgroups 1 and 2 the consumers (setmaxnreg.inc to CREG): 40 / 232 for D = 64, 24 / 240 for D = 96,
// 128 and BQ = 128 (the launch bound gives 168 each). PIPE: 1 or 2. BQ: query rows of a tile, 64, or 128
// (D <= 64, PIPE = 2, LOAD = 1).
// DQ = 0: the consumers add dQ to dq (red.global.add); DQ = 1 (PIPE = 2): they store it into a shared tile and
// warp 3 of the producer adds the tile to dq by TMA reduce-add through the tensor map maps[0] (docs/kernels.md).
// LOAD = 0: the producer's threads load Q and dO by cp.async into core-matrix order; LOAD = 1: one
// producer thread loads them by TMA through the tensor maps maps[1] (Q) and maps[2] (dO), 128-byte swizzled.
// DKV = 0: every consumer thread adds its dK, dV to dk, dv (read-add-write); DKV = 1: the consumers
// store them into swizzled float32 tiles over K, V and the stages, and one thread a warpgroup adds them by TMA
// reduce-add through maps[3] (dk) and maps[4] (dv). maps: null unless DQ, LOAD or DKV is 1. fresh (not 0): dk and dv
// hold no terms yet and are not read: the block's dK and dV rows are stored (zeros where no query sees its keys), the
// launch of the first pattern of a backward whose keys cover every row (kernels/backward.py).
template <typename T, int D, int NWG, int PIPE, int STAGES, int DQ, int LOAD, int DKV, int QT>
__global__ void __launch_bounds__(WG_THREADS * (NWG + 1), 1)
dilated_bwd_wgmma_16(DILATED_BWD_PARAMS(T), const TensorMap* __restrict__ maps, int fresh, long long items)
{
    allow_next_launch();                     // backward.cuh: programmatic dependent launch
    using H = Half16<T>;
    using C = BwdConfig<D, NWG, PIPE, STAGES, DQ, LOAD, DKV, QT>;
    constexpr int NST = STAGES;              // stages of Q, dO, L and delta
    constexpr int RC = C::RC, TD = C::TD, NR = TD / RC;   // LOAD = 1: columns of a region, columns, regions of a tile
    constexpr bool LOOP = C::LOOP != 0;
    constexpr int KVB = C::KVB;
    using L = typename C::Layout;
    static_assert(L::bytes <= HOPPER_SMEM, "the block's shared memory fits");
    using Tile = StagedTile<D, QT, LOAD>;    // descriptors of the Q and dO tiles
    constexpr int THREADS = WG_THREADS * NWG, BK = L::BK, BQ = L::BQ;   // THREADS: the computing threads
    constexpr int NS = BQ / 2;               // score registers per thread (64 keys x BQ queries)
    constexpr int KD = D / 16;               // k-steps over the head dimension
    constexpr int KQ = BQ / 16;              // k-steps over the queries of a tile
    constexpr int KB = BK / 16;              // k-steps over the keys of the block (dQ)
    constexpr int QH = BQ / 64;              // query halves of a tile (64 rows: the M of one dQ product)
    // a warpgroup's share of a tile's dQ: QH = 1: every query, columns NQ wg .. NQ wg + NQ - 1 (NQ = D / NWG);
    // QH = 2: query half wg, every column (NQ = D)
    constexpr int NQ = QH == 2 ? D : D / NWG;
    constexpr int NP = (PIPE && NQ > 48) ? 2 : 1;   // PIPE: the share in column parts of 32 (fewer live registers)
    constexpr int NC = NQ / NP;              // columns of one part
    // QH = 2: dS^T worked out before dV is issued, so that P^T (as A fragments) and S^T are never live together
    constexpr bool DS_FIRST = QH == 2;
    // registers per thread of the producer and of the consumers; 128 PREG + 256 CREG is at most the
    // block's 384 x 168 (what setmaxnreg.dec frees is all setmaxnreg.inc can take: more would wait for ever)
    constexpr int PREG = D <= 64 && BQ == 64 ? 40 : 24, CREG = D <= 64 && BQ == 64 ? 232 : 240;
    static_assert(WG_THREADS * PREG + THREADS * CREG <= (WG_THREADS + THREADS) * 168,
                  "setmaxnreg: the consumers take no more registers than the producer gives up");
    static_assert((D == 32 || D == 64 || D == 96 || D == 128) && NWG == 2, "D: 32 to 128; NWG: 2");
    static_assert(BQ == 64 || (BQ == 128 && NWG == 2 && D <= 64 && PIPE == 2 && LOAD == 1),
                  "BQ: 64, or 128 with D <= 64, PIPE = 2 and LOAD = 1 (S^T and dP^T of 64 keys x 128 queries)");
    static_assert(STAGES >= 2 && STAGES <= 4, "STAGES: 2..4");
    static_assert(PIPE == 1 || PIPE == 2, "PIPE: 1 or 2");
    static_assert(DQ == 0 || (DQ == 1 && PIPE == 2 && NC % 16 == 0), "DQ: 0, or 1 with PIPE = 2");
    static_assert(LOAD == 0 || LOAD == 1, "LOAD: 0 or 1");
    static_assert(DKV == 0 || (DKV == 1 && L::GRADS_FIT), "DKV: 0, or 1 where the tiles fit");
    // producer threads that load, arriving on full[s] (LOAD = 0: warps 0-2 with DQ = 1, else all four; LOAD = 1:
    // the 64 threads that store L and delta, BQ / 64 rows each, and thread 0 once more with the TMA's expected bytes)
    constexpr int LOADERS = LOAD ? 64 : DQ ? WG_THREADS - 32 : WG_THREADS;
    constexpr int WRITER = WG_THREADS - 32;  // DQ = 1: the first thread of the producer's dQ writer warp (3)

    // the window 1024-byte aligned (the swizzled tiles need it): by its declaration, not by arithmetic on its
    // address, which would keep the base in a register (and spill at D = 128)
    extern __shared__ __align__(1024) unsigned char smem_bwd[];
    const unsigned sDQ = (unsigned)__cvta_generic_to_shared(smem_bwd);   // DQ = 1: the dQ tile
    if (L::ALIGNED && (sDQ & 1023u)) __trap();   // (never: the declaration aligns it)
    unsigned window;                             // the launch's dynamic shared memory: the layout's at least
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(window));
    if (window < (unsigned)L::bytes) __trap();
    const unsigned sK = sDQ + L::DQ_TILE;
    const unsigned sV = sK + L::OFF_V, sDS = sK + L::OFF_DS;
    float* const sL = reinterpret_cast<float*>(smem_bwd + L::DQ_TILE + L::OFF_L);
#define BWD_FULL(s) (sK + L::OFF_BAR + 8 * (s))
#define BWD_EMPTY(s) (sK + L::OFF_BAR + 8 * (NST + (s)))
#define BWD_DS (sK + L::OFF_BAR + 16 * NST)
#define BWD_DQ_FULL (sK + L::OFF_DQBAR)
#define BWD_DQ_EMPTY (sK + L::OFF_DQBAR + 8)
#define BWD_KV_FULL(b) (sK + L::OFF_KVBAR + 8 * (b))
#define BWD_KV_EMPTY(b) (sK + L::OFF_KVBAR + 8 * (KVB + (b)))

    // work items numbered key block fastest (problems x key blocks, the grid's shape when one item is a block): the
    // key blocks of one problem run at the same time and share its Q, dO, L, delta and dq in L2. A block takes items
    // first, first + stride, ... below total (LOOP with items > 0: the persistent grid's blocks; otherwise its own)
    const int kblocks = (mk + BK - 1) / BK;
    const int first = blockIdx.x + gridDim.x * blockIdx.y;
    const int total = LOOP && items > 0 ? (int)items : gridDim.x * gridDim.y;
    const int stride = LOOP && items > 0 ? gridDim.x * gridDim.y : total;
    auto item_at = [&](int block) {
        BwdItem w;
        const int problem = block / kblocks;
        w.seg = problem / heads;
        w.head = problem - w.seg * heads;
        w.k0 = (block - problem * kblocks) * BK;
        w.qoff = q_base + (long long)w.seg * q_seg + w.head * q_head;
        w.koff = k_base + (long long)w.seg * k_seg + w.head * k_head;
        w.voff = v_base + (long long)w.seg * v_seg + w.head * v_head;
        w.loff = l_base + (long long)w.seg * l_seg + w.head * l_head;
        w.q_begin = first_visible_query(causal, w.k0, causal_shift);
        w.ntiles = w.q_begin < mq ? (mq - w.q_begin + BQ - 1) / BQ : 0;
        return w;
    };
    BwdItem w = item_at(first);              // the block's first item
    if (!LOOP && w.ntiles == 0) {            // no query sees these keys (uniform): zero terms
        if (fresh) zero_key_rows<D>(dk, dv, w.koff, w.voff, k_row, v_row, w.k0, BK, mk, threadIdx.x, blockDim.x);
        return;
    }

    constexpr int ALL = THREADS + WG_THREADS;
    // LOAD = 1: Q and dO of tile it of item w (the block's tile g) into stage g % NST by TMA (one thread), completing
    // on full[stage]; a box (the tensor maps') is one region of 64 query rows: QH of them stacked make a region of
    // the tile
    auto load_tile = [&](const BwdItem& w, int g, int it) {
        const int s = stage_of<NST>(g), q0 = w.q_begin + it * BQ;
        const unsigned st = sK + L::OFF_Q + 2 * s * L::TILE;
        mbar_expect_tx(BWD_FULL(s), 2 * L::TILE);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int h = 0; h < QH; ++h) {
                const unsigned box = h * (64 * 2 * RC);   // rows 64 h .. 64 h + 63 of the region
                tma_load_4d(st + r * L::REGION + box, maps + 1, RC * r, w.head, q0 + 64 * h, w.seg,
                            BWD_FULL(s));
                tma_load_4d(st + L::TILE + r * L::REGION + box, maps + 2, RC * r, w.head, q0 + 64 * h, w.seg,
                            BWD_FULL(s));
            }
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(BWD_FULL(s), LOADERS + LOAD);
            mbar_init(BWD_EMPTY(s), THREADS);
        }
        if (PIPE == 2) mbar_init(BWD_DS, THREADS);
        if (DQ) {
            mbar_init(BWD_DQ_FULL, THREADS);
            mbar_init(BWD_DQ_EMPTY, 1);
        }
        if (LOOP) {
            for (int b = 0; b < KVB; ++b) {
                mbar_init(BWD_KV_FULL(b), 32);
                mbar_init(BWD_KV_EMPTY(b), THREADS);
            }
        }
        mbar_fence_init();
        if (LOAD && !LOOP)               // the first stages' Q and dO load while K and V do
            for (int it = 0; it < min(NST, w.ntiles); ++it) load_tile(w, it, it);
    }
    if (!LOOP) {                         // one item: its K and V staged by every thread
        stage_core_rows<T, D, BK, ALL>(sK, k, w.koff, k_row, w.k0, mk, threadIdx.x);
        stage_core_rows<T, D, BK, ALL>(sV, v, w.voff, v_row, w.k0, mk, threadIdx.x);
        cp_async_commit();
        cp_async_wait_all();
        fence_async_shared();
    }
    __syncthreads();                     // the barriers ready (and without LOOP K and V)
    if (threadIdx.x < WG_THREADS) {      // producer: Q, dO, L and delta of tile it into stage it % STAGES;
        setmaxnreg_dec<PREG>();      // full once they landed, refilled once empty
        const int self = threadIdx.x;
        if (DQ && self >= WRITER) {      // warp 3: each tile's dQ, once stored, added to dq by TMA
            if (self == WRITER) {
                int g = 0;               // the block's tiles, over its items
                for (int item = first, pass = 0; LOOP ? item < total : pass < 1; item += stride, ++pass) {
                    if (LOOP) w = item_at(item);
                    for (int it = 0; it < w.ntiles; ++it, ++g) {
                        mbar_wait(BWD_DQ_FULL, g & 1);
#pragma unroll
                        for (int c = 0; c < D / 32; ++c)
#pragma unroll
                            for (int h = 0; h < QH; ++h)   // boxes of 64 rows, QH stacked a column box
                                tma_reduce_add_4d(maps, sDQ + c * (BQ * 128) + h * (64 * 128), 32 * c, w.head,
                                                  w.q_begin + it * BQ + 64 * h, w.seg);
                        bulk_commit();
                        bulk_wait_read();    // the tile may be stored again
                        mbar_arrive(BWD_DQ_EMPTY);
                    }
                }
                bulk_wait_all();
            }
            return;
        }
        if (LOOP && self >= 64) {        // warp 2: each item's K and V, once the consumers are done with the last
            if (self < 96) {
                int n = 0;               // the block's items with query tiles
                for (int item = first, pass = 0; LOOP ? item < total : pass < 1; item += stride, ++pass) {
                    if (LOOP) w = item_at(item);
                    if (w.ntiles == 0) continue;
                    const int buf = n % KVB;
                    if (n >= KVB) mbar_wait(BWD_KV_EMPTY(buf), (n / KVB - 1) & 1);
                    const unsigned kv = buf ? sK + L::OFF_KV2 : sK;
                    stage_core_rows<T, D, BK, 32, 1>(kv, k, w.koff, k_row, w.k0, mk, self - 64);
                    stage_core_rows<T, D, BK, 32, 1>(kv + L::OFF_V, v, w.voff, v_row, w.k0, mk, self - 64);
                    cp_async_commit();
                    cp_async_wait_all();
                    fence_async_shared();
                    mbar_arrive(BWD_KV_FULL(buf));
                    ++n;
                }
            }
            return;
        }
        if (LOAD) {                      // thread 0: Q and dO by TMA; threads 0 .. 63: L and delta
            if (self >= LOADERS) return;
            int g = 0;                   // the block's tiles, over its items
            for (int item = first, pass = 0; LOOP ? item < total : pass < 1; item += stride, ++pass) {
                if (LOOP) w = item_at(item);
                for (int it = 0; it < w.ntiles; ++it, ++g) {   // (without LOOP the first NST issued above)
                    const int s = stage_of<NST>(g), q0 = w.q_begin + it * BQ;
                    if (LOOP || g >= NST) {
                        if (g >= NST) mbar_wait(BWD_EMPTY(s), (phase_of<NST>(g) + 1) & 1);
                        if (self == 0) load_tile(w, g, it);
                    }
#pragma unroll
                    for (int j = 0; j < BQ / LOADERS; ++j) {
                        const int row = self + LOADERS * j;
                        float l2, dl;
                        query_stats(lse, delta, w.loff, l_row, q0 + row, mq, l2, dl);
                        const unsigned sl = sK + L::OFF_L + 4 * (2 * s * BQ + row);
                        st_shared_f32(sl, l2);
                        st_shared_f32(sl + 4 * BQ, dl);
                    }
                    mbar_arrive(BWD_FULL(s));
                }
            }
            return;
        }
        float lr = 0.0f, dr = 0.0f;      // raw L and delta of row `self` of the last tile issued
        for (int it = 0; it <= w.ntiles; ++it) {
            if (it < w.ntiles) {
                const int s = stage_of<NST>(it), q0 = w.q_begin + it * BQ;
                if (it >= NST) mbar_wait(BWD_EMPTY(s), (phase_of<NST>(it) + 1) & 1);
                const unsigned st = sK + L::OFF_Q + 2 * s * L::TILE;
                stage_core_rows<T, D, BQ, LOADERS, 1>(st, q, w.qoff, q_row, q0, mq, self);
                stage_core_rows<T, D, BQ, LOADERS, 1>(st + L::TILE, dout, w.qoff, q_row, q0, mq, self);
                cp_async_commit();
            }
            if (it > 0) {                // tile it - 1 complete: its L, delta stored, then published
                const int p = stage_of<NST>(it - 1);
                if (it < w.ntiles)
                    cp_async_wait<1>();
                else
                    cp_async_wait_all();
                if (self < BQ) {
                    const unsigned sl = sK + L::OFF_L + 4 * (2 * p * BQ + self);
                    st_shared_f32(sl, lr == NEG_INF ? -NEG_INF : lr * LOG2E);
                    st_shared_f32(sl + 4 * BQ, dr);
                }
                fence_async_shared();
                mbar_arrive(BWD_FULL(p));
            }
            if (it < w.ntiles && self < BQ) {
                const int i = w.q_begin + it * BQ + self;
                lr = i < mq ? lse[w.loff + i * l_row] : NEG_INF;
                dr = i < mq ? delta[w.loff + i * l_row] : 0.0f;
            }
        }
        return;
    }
    setmaxnreg_inc<CREG>();

    const int tid = threadIdx.x - WG_THREADS;   // among the computing threads
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    int n = 0, g0 = 0;                       // the block's items with query tiles so far, and their tiles
    for (int item = first, pass = 0; LOOP ? item < total : pass < 1; item += stride, ++pass) {
        if (LOOP) w = item_at(item);
        if (w.ntiles == 0) {                 // (LOOP) no query sees these keys: zero terms
            if (fresh) zero_key_rows<D>(dk, dv, w.koff, w.voff, k_row, v_row, w.k0, BK, mk, tid, THREADS);
            continue;
        }
        const int buf = n % KVB;             // (LOOP) this item's K/V buffer
        if (LOOP) mbar_wait(BWD_KV_FULL(buf), (n / KVB) & 1);   // this item's K and V staged
        const unsigned kvK = buf ? sK + L::OFF_KV2 : sK, kvV = kvK + L::OFF_V;
        const int q_begin = w.q_begin;
        const int kw0 = w.k0 + 64 * wg;          // this warpgroup's first key
        const int key0 = kw0 + 16 * warp + g;    // this thread's keys: key0, key0 + 8
        const float mul = scale * LOG2E;
        // A of S^T and dP^T: this warpgroup's K / V rows, K-major; k-step ks: + 256 ks bytes (16 ks in 16-byte units)
        const desc_t dKw = smem_desc(kvK + 64 * wg * D * 2, 128, 16 * D);
        const desc_t dVw = smem_desc(kvV + 64 * wg * D * 2, 128, 16 * D);
        // dS^T row (key) of this thread's first stores: key block 8 wg + 2 warp (+ 1 for h = 1), row g, 4 t bytes in
        const unsigned ds_row = (8 * wg + 2 * warp) * (16 * BQ) + 16 * g + 4 * t;

        float gk[D / 2], gv[D / 2];              // dK, dV of this warpgroup's keys
#pragma unroll
        for (int i = 0; i < D / 2; ++i) gk[i] = gv[i] = 0.0f;
        // this warpgroup's share of a tile's dQ: queries dq_row() .. + 63, columns dq_col() .. + NQ - 1
        auto dq_row = [&]() { return QH == 2 ? 64 * wg : 0; };
        auto dq_col = [&]() { return QH == 2 ? 0 : NQ * wg; };
        float c[NC / 2];                         // dQ of a tile, its share's columns NC part .. + NC - 1
        unsigned pa[KQ][4], da[KQ][4];           // P^T and dS^T as A fragments

        // dQ(tile) = dS K, part `part` of the share, from the dS^T buffer at ds: A = dS (queries x keys) read MN-major
        // from dS^T (k-step kk = 16 keys: + 32 BQ kk bytes; 8 queries: + 128 bytes), B = K MN-major (+ 32 D kk bytes;
        // 8 columns: + 128 bytes); issued, not committed
        auto issue_dq = [&](unsigned ds, int part) {
            const desc_t a = smem_desc(ds + 16 * dq_row(), 16 * BQ, 128);
            const desc_t b = smem_desc(kvK + 16 * (dq_col() + NC * part), 16 * D, 128);
            Wgmma16<T, NC>::template ss<0, 1, 1>(c, a, b);
#pragma unroll
            for (int kk = 1; kk < KB; ++kk) Wgmma16<T, NC>::template ss<1, 1, 1>(c, a + 2 * BQ * kk, b + 2 * D * kk);
        };
        // PIPE = 2: this thread's dS^T of the current tile stored and its reads of the other buffer done
        auto ds_release = [&]() {
            fence_async_shared();
            mbar_arrive(BWD_DS);
        };
        // scale dQ (part `part` of the share) of the tile at query qt added to dq (red.global.add.v2.f32); DQ = 1: stored
        // into the dQ tile (the tile of tile number qt / BQ - 1 reduced first), published after the last part
        auto add_dq = [&](int qt, int part) {
            if (DQ) {
                const int j = g0 + (qt - q_begin) / BQ;      // the block's tile number
                if (part == 0 && j > 0) mbar_wait(BWD_DQ_EMPTY, (j - 1) & 1);
                // NC = 32: the part is rows dq_row() .. + 63 of box (dq_col() + NC part) / 32 of [BQ][32] floats, with its
                // tensor map's 128-byte swizzle (16-byte chunk k of row r at chunk k ^ (r % 8)); this thread's pair (row
                // 16 warp + g + 8 h of the part, column 8 n + 2 t) is in chunk 2 n + t / 2 of a row with r % 8 = g: at
                // chunk (2 n + t / 2) ^ g, 8 (t % 2) bytes in
                if (NC == 32) {
                    const unsigned at = sDQ + ((QH == 2 ? 0 : NQ / 32 * wg) + part) * (BQ * 128) +
                                        (dq_row() + 16 * warp + g) * 128 + 16 * ((t >> 1) ^ (g & 1)) + 8 * (t & 1);
                    const unsigned swz = 32 * (g >> 1);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int n = 0; n < 4; ++n)
                            st_shared_v2_f32(at + 8 * 128 * h + (swz ^ (32 * n)), scale * c[4 * n + 2 * h],
                                             scale * c[4 * n + 2 * h + 1]);
                } else {                         // NC = 16 (D = 32), 48 (D = 96): within or across boxes
                    store_swizzled_boxes<NC / 8, BQ>(sDQ, dq_col() + NC * part,
                                                     reinterpret_cast<const float (&)[NC / 8][4]>(c), scale, warp, g, t,
                                                     dq_row());
                }
                if (part == NP - 1) {
                    fence_async_shared();
                    mbar_arrive(BWD_DQ_FULL);
                }
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = qt + dq_row() + 16 * warp + g + 8 * h;
                    if (i >= mq) continue;
                    float* row = dq + w.qoff + i * q_row + dq_col() + NC * part + 2 * t;
#pragma unroll
                    for (int n = 0; n < NC / 8; ++n)
                        add_pair(row + 8 * n, scale * c[4 * n + 2 * h], scale * c[4 * n + 2 * h + 1]);
                }
            }
        };

        int it = 0;
        for (int q0 = q_begin; q0 < mq; q0 += BQ, ++it) {
            const int cur = (g0 + it) & 1;       // dS^T buffer
            const int stage = stage_of<NST>(g0 + it);
            mbar_wait(BWD_FULL(stage), phase_of<NST>(g0 + it));
            fence_async_shared();
            if (PIPE == 1)
                consumers_sync();                // every consumer is done with tile q0 - BQ's products (its dS^T is in
                                                 // shared memory)
            const unsigned sQ = sK + L::OFF_Q + 2 * stage * L::TILE, sO = sQ + L::TILE;
            const unsigned ds_buf = sDS + cur * L::DS;
            const float* const lt = sL + 2 * stage * BQ;
            const float* const dt = lt + BQ;
            const bool masked = tile_needs_mask<64>(kw0, q0, mk, causal, causal_shift);

            // S^T = K Q^T and dP^T = V dO^T (64 keys x BQ queries each), then the dQ of the previous tile
            float s[NS], dp[NS];
            pin(s);
            pin(dp);
            if (!DS_FIRST) pin(c);
            wgmma_fence();
            {
                const desc_t bq = Tile::k_major(sQ), bo = Tile::k_major(sO);
                Wgmma16<T, BQ>::template ss<0>(s, dKw, bq);
#pragma unroll
                for (int ks = 1; ks < KD; ++ks) Wgmma16<T, BQ>::template ss<1>(s, dKw + 16 * ks, bq + Tile::k_step(ks));
                wgmma_commit();
                Wgmma16<T, BQ>::template ss<0>(dp, dVw, bo);
#pragma unroll
                for (int ks = 1; ks < KD; ++ks) Wgmma16<T, BQ>::template ss<1>(dp, dVw + 16 * ks, bo + Tile::k_step(ks));
                wgmma_commit();
            }
            // the first part of the previous tile's dQ, one commit group (an empty one for the first tile); issued here,
            // or with DS_FIRST once S^T and dP^T are consumed (fewer live registers)
            auto issue_previous_dq = [&]() {
                if (it > 0) {
                    if (PIPE == 2) mbar_wait(BWD_DS, (g0 + it - 1) & 1);   // every consumer's dS^T of tile q0 - BQ
                    issue_dq(sDS + (cur ^ 1) * L::DS, 0);
                }
                wgmma_commit();
            };
            if (!DS_FIRST) {
                issue_previous_dq();
                wgmma_wait<2>();
            } else {
                wgmma_wait<1>();
            }
            pin(s);

            // P^T = exp2(mul S^T - L log2 e); 0 for keys past mk and, if causal, past i + causal_shift
#pragma unroll
            for (int b = 0; b < BQ / 8; ++b) {
                const float2 l2 = *reinterpret_cast<const float2*>(lt + 8 * b + 2 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    s[4 * b + 2 * h] = exp2f(fmaf(s[4 * b + 2 * h], mul, -l2.x));
                    s[4 * b + 2 * h + 1] = exp2f(fmaf(s[4 * b + 2 * h + 1], mul, -l2.y));
                    if (masked) {
                        const int j = key0 + 8 * h, i = q0 + 8 * b + 2 * t;
                        mask_query_pair(s[4 * b + 2 * h], s[4 * b + 2 * h + 1], i, j, mk, causal, causal_shift);
                    }
                }
            }

            // dS^T = P^T (dP^T - delta) into ds: dp (DS_FIRST: P^T kept in s for dV) or s (P^T packed for dV first)
            float (&ds)[NS] = DS_FIRST ? dp : s;
            auto dscore = [&]() {
#pragma unroll
                for (int b = 0; b < BQ / 8; ++b) {
                    const float2 d2 = *reinterpret_cast<const float2*>(dt + 8 * b + 2 * t);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        ds[4 * b + 2 * h] = s[4 * b + 2 * h] * (dp[4 * b + 2 * h] - d2.x);
                        ds[4 * b + 2 * h + 1] = s[4 * b + 2 * h + 1] * (dp[4 * b + 2 * h + 1] - d2.y);
                    }
                }
            };
            if (DS_FIRST) {
                wgmma_wait<0>();                 // dP^T landed
                pin(dp);
                dscore();
            }

            // dV += P^T dO: A = P^T (k-step kk = accumulator elements 8 kk .. 8 kk + 7), B = dO MN-major
#pragma unroll
            for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
                for (int j = 0; j < 4; ++j) pa[kk][j] = H::pack(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
            pin(gv);
            pin_u(pa);
            wgmma_fence();
            {
                const desc_t bo = Tile::mn_major(sO);
#pragma unroll
                for (int kk = 0; kk < KQ; ++kk) Wgmma16<T, D>::template rs<1, 1>(gv, pa[kk], bo + Tile::mn_step(kk));
            }
            wgmma_commit();
            if (!DS_FIRST) {
                wgmma_wait<2>();                 // dP^T landed (dQ, dV may still run)
                pin(dp);
                dscore();
            }

            // dS^T packed as A fragments (DS_FIRST: not kept) and stored (16-bit) as rows of dS^T
#pragma unroll
            for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const unsigned packed = H::pack(ds[8 * kk + 2 * j], ds[8 * kk + 2 * j + 1]);
                    if (!DS_FIRST) da[kk][j] = packed;
                    // key row + 8 (j & 1), query columns 16 kk + 8 (j >> 1) + 2 t, + 1
                    st_shared_b32(ds_buf + ds_row + (j & 1) * (16 * BQ) + (2 * kk + (j >> 1)) * 128, packed);
                }

            // dK += dS^T Q: B = Q MN-major; A = dS^T from registers, or with DS_FIRST from this warpgroup's rows of the
            // dS^T buffer, K-major (k-step kk = 16 queries: + 256 bytes), once all its threads stored theirs
            pin(gk);
            if (DS_FIRST) {
                fence_async_shared();
                warpgroup_sync(wg);
                pin(c);
            } else {
                pin_u(da);
            }
            wgmma_fence();
            if (DS_FIRST) issue_previous_dq();   // the previous tile's dQ: its own commit group
            {
                const desc_t bq = Tile::mn_major(sQ), aw = smem_desc(ds_buf + 8 * wg * (16 * BQ), 128, 16 * BQ);
#pragma unroll
                for (int kk = 0; kk < KQ; ++kk)
                    if (DS_FIRST)
                        Wgmma16<T, D>::template ss<1, 0, 1>(gk, aw + 16 * kk, bq + Tile::mn_step(kk));
                    else
                        Wgmma16<T, D>::template rs<1, 1>(gk, da[kk], bq + Tile::mn_step(kk));
            }
            wgmma_commit();
            if (DS_FIRST)
                wgmma_wait<1>();                 // dQ of the previous tile landed (dK may still run)
            else
                wgmma_wait<2>();                 // dQ of the previous tile landed (dV, dK may still run)
            pin(c);
            if (PIPE == 2 && (it == 0 || NP == 1)) ds_release();
            if (it > 0) {
                add_dq(q0 - BQ, 0);
                if (NP == 2) {                   // its second part, now that S^T and dP^T are dead
                    wgmma_fence();
                    issue_dq(sDS + (cur ^ 1) * L::DS, 1);
                    wgmma_commit();
                    wgmma_wait<0>();
                    pin(c);
                    if (PIPE == 2) ds_release();
                    add_dq(q0 - BQ, 1);
                }
            }
            wgmma_wait<0>();
            pin(gk);
            pin(gv);
            pin_u(pa);
            pin_u(da);
            mbar_arrive(BWD_EMPTY(stage));       // this thread's reads of the stage are done
        }
        // dQ of the last tile
        fence_async_shared();
        if (PIPE == 2)
            mbar_wait(BWD_DS, (g0 + it - 1) & 1);   // its dS^T (every warpgroup) in shared memory
        else
            consumers_sync();                    // its dS^T (every warpgroup) in shared memory
        for (int part = 0; part < NP; ++part) {
            pin(c);
            wgmma_fence();
            issue_dq(sDS + ((g0 + it - 1) & 1) * L::DS, part);
            wgmma_commit();
            wgmma_wait<0>();
            pin(c);
            add_dq(q_begin + (it - 1) * BQ, part);
        }
        if (LOOP) mbar_arrive(BWD_KV_EMPTY(buf));   // K and V read for the last time: the buffer may be refilled

        // dK (scaled) and dV of this thread's keys added to dk, dv (the accumulators' layout is backward.cuh's
        // [D / 8][4] fragment, flattened); the item's offsets worked out again here (not kept through its tiles)
        if (LOOP) w = item_at(item);
        const auto& fk = reinterpret_cast<const float (&)[D / 8][4]>(gk);
        const auto& fv = reinterpret_cast<const float (&)[D / 8][4]>(gv);
        if (DKV) {   // into shared tiles over K, V and the stages (every consumer is done with them), then by TMA
            consumers_sync();
            const unsigned tk = sK + 2 * wg * L::GRAD_TILE, tv = tk + L::GRAD_TILE;
            store_swizzled_boxes<D / 8>(tk, 0, fk, scale, warp, g, t);
            store_swizzled_boxes<D / 8>(tv, 0, fv, 1.0f, warp, g, t);
            fence_async_shared();
            consumers_sync();                    // every tile stored
            if ((tid & (WG_THREADS - 1)) == 0) { // thread 0 of a warpgroup adds its dK and dV tiles (the previous launch's
                wait_for_previous_launch();      // additions to the same rows done first: the same order every run)
#pragma unroll
                for (int b = 0; b < D / 32; ++b) {
                    if (fresh) {                 // the rows hold no terms yet: stored, not added to
                        tma_store_4d(maps + 3, tk + b * (64 * 128), 32 * b, w.head, kw0, w.seg);
                        tma_store_4d(maps + 4, tv + b * (64 * 128), 32 * b, w.head, kw0, w.seg);
                    } else {
                        tma_reduce_add_4d(maps + 3, tk + b * (64 * 128), 32 * b, w.head, kw0, w.seg);
                        tma_reduce_add_4d(maps + 4, tv + b * (64 * 128), 32 * b, w.head, kw0, w.seg);
                    }
                }
                bulk_commit();
                bulk_wait_read();                // the tiles read before the block's shared memory is freed
            }
        } else {
            add_key_gradients<D / 8>(dk, dv, w.koff, w.voff, k_row, v_row, key0, mk, t, scale, fk, fv, fresh != 0);
        }
        g0 += it;
        ++n;
    }
}
#undef BWD_FULL
#undef BWD_EMPTY
#undef BWD_DS
#undef BWD_DQ_FULL
#undef BWD_DQ_EMPTY
#undef BWD_KV_FULL
#undef BWD_KV_EMPTY
