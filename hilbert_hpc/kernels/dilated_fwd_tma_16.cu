// Hopper (sm_90a) warp-specialized dilated-attention forward for 16-bit inputs (bfloat16 or float16): a
// producer warpgroup feeds the tiles with the bulk tensor copy engine (TMA) into a ring of shared-memory
// stages guarded by mbarriers, and NC consumer warpgroups (64 queries each) run warpgroup MMA (wgmma
// m64nNk16, FP32 accumulation), the FP32 online softmax and the in-place log-sum-exp merge.
//
// Same problem geometry, merge and masking contract as dilated_fwd_wgmma_16.cu (problems numbered
// (segment, head-in-group); query i sees key j when j < mk and, if causal, j <= i + causal_shift; rows with
// no visible key are left untouched; float32 log-sum-exp), with three differences of form:
//   * Q, K and V are read through three 4-D tensor maps (CUtensorMap, built on the host by
//     cuTensorMapEncodeTiled, kernels/tma.py) over (column, head-in-group, row, segment), 128-byte swizzle
//     (64-byte at D = 32);
//     the output has an element-offset geometry of its own (o_seg, o_head, o_row; its first element per part);
//   * the running output is of type O: T (16-bit, rounded once per launch) or float (an FP32 running output,
//     which the host keeps for a group of heads while every local pattern is merged, then rounds once);
//   * the grid is one-dimensional, query blocks of one problem adjacent (block b: problem b / qblocks,
//     query block b % qblocks, in reverse when causal: longest first), so the blocks resident at one time
//     share their problems' K and V in L2.
// Head dims 32, 64, 96 and 128. A tile is stored per region of RC = 64 columns (rows of 128 bytes, 128-byte
// swizzle; D = 96 and 128 are two regions) or, at D = 32, of 32 columns (rows of 64 bytes, 64-byte swizzle, so
// P V runs N = 32). D = 96 is stored as DP = 128 columns (two regions): the copy engine zero-fills the columns
// past D of every tile (past the maps' first dimension), Q K^T runs D / 16 k-steps (the valid columns only) and
// P V runs N = D: wgmma reads V's first 96 columns, region 0 and the first half of region 1 (the MN-major
// descriptor's LBO steps from region to region), so no product computes the zero columns (N = DP, the whole
// regions, was 1.01x slower and took 16 more output registers).
//
// Block: warpgroup 0 is the producer (one thread issues every copy; setmaxnreg.dec to PREG registers),
// warpgroups 1..NC consume (setmaxnreg.inc to CREG). Barriers: q_full (Q of the query block, and its item
// number in a shared slot that the producer stores before the phase's arrival: phase k % 2 for the block's
// k-th query block), q_empty (one arrival per consumer thread once its products of the query block completed
// and it read the item number, so that every read of the slot is ordered before the producer's next store;
// the producer waits on it before loading the next Q), and per stage
// s of STAGES: k_full[s], v_full[s] (transaction-counted by the copy engine), k_empty[s], v_empty[s] (one arrival
// per consumer warp once its wgmma reading the stage's K, or V, completed: K is released as soon as S = Q K^T
// landed, V after P V: the defaults as fast as with one release of both, the pipelined configurations of two
// stages 1.2-1.35x faster). The block's g-th tile (counted over its query blocks) uses stage g % STAGES with
// phase (g / STAGES) & 1. The producer loads in the consumers'
// order (with PIPE, tile it's K before tile it - 1's V). Every consumer passes every tile of the query block in
// order (waiting full, arriving empty, computing only the tiles its own queries see), so a stage's K or V is
// refilled only after all consumers are done with it.
//
// Per tile and consumer warpgroup: S = Q K^T (D/16 wgmma m64n{BK}k16, both K-major from shared memory);
// online softmax in FP32 on the accumulators; P packed to T pairs in registers; O += P V (BK/16 wgmma
// m64n{D}k16, A = P from registers, B = V MN-major, imm-trans-b = 1). PIPE = 1 overlaps tile it's Q K^T with
// tile it - 1's P V: S(it) and P(it-1) V(it-1) are issued together, the softmax of S(it) runs while P V is in
// flight, and the running output is rescaled once that completes (FlashAttention-3's intra-warpgroup
// pipelining). PIPE = 0: one product at a time. LAZY = 1: the running max moves only by more than
// RESCALE_SLACK (attention.cuh), so most tiles skip the rescale of the running output (FlashAttention-4's
// conditional rescaling); 0: every tile rescales. PINGPONG = 1: the consumer warpgroups take turns issuing
// their products (IssueTurns, tma.cuh; FlashAttention-3's ping-pong), one turn per tile of the block each.
//
// Shared memory, rows of RB = 2 RC bytes swizzled as the copy engine's CU_TENSOR_MAP_SWIZZLE_128B (16-byte
// chunk c of row r of a 1024-byte-aligned region lands at chunk c ^ (r % 8)) or _64B (chunk c of row r of a
// 512-byte-aligned region at c ^ (r / 2 % 4)): every tile is stored per region as [row][RB bytes], 8-row atoms
// of 8 RB bytes. Matrix descriptors (layout type 1 = 128-byte, 2 = 64-byte swizzle, bits 62-63; PTX ISA
// "Shared Memory Matrix Layout", canonical layouts with T = 8 elements per 16 bytes, RB / 16 chunks a row):
//   K-major: ((8,m),(T,2k)):((RB/2,SBO),(1,T)): SBO = 8 RB (next 8 rows); LBO unused (1);
//     k-step ks (16 columns) starts at region ks / (RB / 32), + 32 (ks % (RB / 32)) bytes;
//   MN-major: ((T,RB/16,m),(8,k)):((1,T,LBO),(RB/2,SBO)): SBO = 8 RB (next 8 K-rows = keys), LBO = bytes
//     between regions (BK RB; D = 96 and 128 have two); k-step kk (16 keys): + 16 RB kk.
// Each warpgroup makes the descriptors of its Q and of stage 0's K and V once (SwizzledDesc, wgmma.cuh); a stage
// and a k-step add their offsets (in 16-byte units) to the descriptor's low word.

#include "common.cuh"
#include "convert.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "mask.cuh"
#include "attention.cuh"

// Shared memory of one block in bytes (from a 1024-byte-aligned base): Q of NC warpgroups, STAGES x (K, V)
// tiles, then the barriers; `bytes` adds the slack that aligns the dynamic shared window's base. D: the
// columns stored (DP), RB: bytes of a region's row.
template <int D, int RB, int BK, int NC, int STAGES>
struct SmemTma {
    static constexpr int Q_WG = WG_QUERIES * D * 2;
    static constexpr int Q_REGION = WG_QUERIES * RB;    // one region of a warpgroup's Q
    static constexpr int TILE = BK * D * 2;
    static constexpr int REGION = BK * RB;              // one region of a K or V tile
    static constexpr int BARS = NC * Q_WG + 2 * STAGES * TILE;
    static constexpr int bytes = BARS + 8 * (3 + 4 * STAGES) + 1024;
};

// Registers (SplitRegs, tma.cuh): the producer keeps 24.
template <int NC>
using RegsTma = SplitRegs<NC, 24>;

// The 16-bit output that a row's last merge into a float32 running output writes, rounded once (the host
// passes it for local patterns; out16 null: every row stays in the float32 running output, which a separate
// pass rounds). A launch part's row j of problem (seg, head) is element base + seg f_seg + head f_head + j f_row
// of it (base: the part's f_base, LaunchPart): sequence row i = offset / f_rowlen, head h = offset % f_rowlen / D. A later launch merges it again when a
// later pattern q selects it: i < later[2 q + 1] (the pattern's whole segments) and i = h (mod later[2 q]) (each
// head h reads the rows h mod r of a segment, r dividing the segment).
template <typename T>
struct FinalOutput {
    T* out16;
    const long long* later;
    int nlater;
    long long seg, head, row, rowlen;

    // the 16-bit row (column 0) if this is row j's last merge, else null
    template <int D>
    __device__ __forceinline__ T* last_merge_row(long long base, int s, int h, int j) const {
        if (out16 == nullptr) return nullptr;
        const long long offset = base + s * seg + h * head + j * row;
        const long long i = offset / rowlen, hd = offset % rowlen / D;
        for (int q = 0; q < nlater; ++q)
            if (i < later[2 * q + 1] && (i - hd) % later[2 * q] == 0) return nullptr;
        return out16 + offset;
    }
};

// The merge of the D-column accumulators into the running output: 16-bit (rounded once per launch)
// or float32 (an FP32 running output; rows whose last merge this is go to the 16-bit output instead).
// `before`: the rows' log-sum-exp before the merge, read at the query block's start (running_lse).
template <typename T, int D>
__device__ __forceinline__ void merge_out(T* __restrict__ out, float* __restrict__ lse, long long qoff, long long q_row,
                                          long long loff, long long l_row, int row0, int mq, int t,
                                          const float (&m)[2], float (&l)[2], const float (&o)[D / 2],
                                          const float (&before)[2], const FinalOutput<T>&, long long, int, int) {
    merge_rows16_before<T, D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o, before);
}
template <typename T, int D>
__device__ __forceinline__ void merge_out(float* __restrict__ out, float* __restrict__ lse, long long qoff,
                                          long long q_row, long long loff, long long l_row, int row0, int mq, int t,
                                          const float (&m)[2], float (&l)[2], const float (&o)[D / 2],
                                          const float (&before)[2], const FinalOutput<T>& fin, long long f_base,
                                          int seg, int head) {
    FinalRows16<T> store;
#pragma unroll
    for (int h = 0; h < 2; ++h)
        store.row16[h] = row0 + 8 * h < mq ? fin.template last_merge_row<D>(f_base, seg, head, row0 + 8 * h) : nullptr;
    merge_rows32_before<D>(out, lse, qoff, q_row, loff, l_row, row0, mq, t, m, l, o, before, store);
}

// One work item of the grid: a block of BQ = 64 NC queries of one problem (segment, head-in-group). The items
// are ordered by groups of `group` problems (the host's choice: 1 for non-causal launches, as many as keep
// their K and V in L2 for causal ones): a group's items are adjacent, so the items resident at one time share
// their problems' K and V in L2, and inside a group they go query block by query block (in reverse when
// causal: longest first), so a launch ends on its shortest items. kend: keys seen by the item (those of its
// last warpgroup with queries: the causal end grows with the row); ntiles: its key tiles, 0 when it sees no
// key (nothing to do).
struct TmaItem {
    int part, seg, head, qblock, kend, ntiles;
};

// One part of a launch (LaunchPart in kernels/sixteen_bit.py, 32 bytes): the launches of one pattern's head offsets
// share every stride and row count and differ in their first elements and head counts, so they run as one launch
// whose items are those of part 0, then part 1, ...: part p's items are [first_item, the next part's), its Q, K
// and V maps maps[3 p .. 3 p + 2], and its output, log-sum-exp and 16-bit output (FinalOutput) start at o_base,
// l_base and f_base.
struct LaunchPart {
    long long o_base, l_base, f_base;
    int first_item, heads;
};

template <int NC, int BK>
__device__ __forceinline__ TmaItem tma_item(int item, int heads, int qblocks, int problems, int group, int mq, int mk,
                                            int causal, int causal_shift) {
    TmaItem w;
    const int span = group * qblocks;                   // items of a whole group
    const int first = item / span * group;              // the group's first problem
    const int in_group = min(group, problems - first);  // the last group may be smaller
    const int r = item - first * qblocks;
    const int problem = first + r % in_group;
    const int qindex = r / in_group;
    w.qblock = (causal ? qblocks - 1 - qindex : qindex) * (WG_QUERIES * NC);
    w.seg = problem / heads;
    w.head = problem % heads;
    const int last_wg = min(NC - 1, (mq - 1 - w.qblock) / WG_QUERIES);
    w.kend = visible_key_end(mk, causal, w.qblock + WG_QUERIES * (last_wg + 1), causal_shift);
    w.ntiles = w.kend > 0 ? (w.kend + BK - 1) / BK : 0;
    return w;
}

// A persistent block's next item: the grid's first items are the blocks' own (blockIdx.x), the later ones go in
// order to whichever block asks first (`work`: a counter that is zero at launch), so a block whose items were
// short takes more of them (causal query blocks differ in length; a static round robin was 14 % slower).
__device__ __forceinline__ int next_item(int* work) { return gridDim.x + atomicAdd(work, 1); }

// O: the running output's element type, T or float (the output geometry is its own: o_seg .. o_row; with
// float, out16 .. f_rowlen: FinalOutput, the 16-bit output of rows whose last merge this is). nparts: the launch's
// parts (LaunchPart), whose table follows the 3 nparts maps.
// PERSISTENT = 0: a grid of `items` blocks, one item each (blockIdx.x); 1: a grid of one block per SM, each
// taking item blockIdx.x, then the next of the launch's counter (`work`, next_item) until none is left, its
// producer loading an item's Q and first tiles during the consumers' merge of the previous one. The producer
// takes the items and hands each to the consumers with its Q (the slot; -1 ends the walk), so every warp walks
// the same items and the stage ring and the Q buffer count alike.
template <typename T, int D, int BK, int NC, int STAGES, int PIPE, int LAZY, int PINGPONG, int PERSISTENT, typename O>
__global__ void __launch_bounds__(WG_THREADS * (NC + 1), 1)
dilated_fwd_tma_16(const TensorMap* __restrict__ maps, int* __restrict__ work, O* __restrict__ out, float* __restrict__ lse,
                   long long o_seg, long long o_head, long long o_row, long long l_seg, long long l_head, long long l_row,
                   int nparts, int qblocks, int items, int mq, int mk, int causal, int causal_shift, float scale,
                   int group, T* __restrict__ out16, const long long* __restrict__ later, int nlater,
                   long long f_seg, long long f_head, long long f_row, long long f_rowlen)
{
    using H = Half16<T>;
    constexpr int RC = tma_region_columns<D>();   // columns of a region (64-byte or 128-byte swizzled rows)
    constexpr int RB = 2 * RC;               // bytes of a region's row
    constexpr int DP = (D + RC - 1) / RC * RC;   // columns stored: whole regions (zero-filled past D)
    constexpr int KR = RB / 32;              // k-steps of 16 columns in a region
    using L = SmemTma<DP, RB, BK, NC, STAGES>;
    using R = RegsTma<NC>;
    constexpr int NR = DP / RC;              // regions of a row
    constexpr int NS = BK / 2;               // score registers per thread
    constexpr int NO = D / 2;                // output registers per thread (P V runs N = D)
    constexpr int KQ = D / 16;               // k-steps of Q K^T (the valid columns only)
    constexpr int KP = BK / 16;              // k-steps of P V
    static_assert(D == 32 || D == 64 || D == 96 || D == 128, "head dims 32, 64, 96 and 128");
    static_assert(BK % 16 == 0 && BK <= 256 && NC >= 1 && NC <= 4 && STAGES >= 2, "configuration");
    static_assert(!PINGPONG || NC >= 2, "turns need two consumer warpgroups");

    extern __shared__ __align__(128) unsigned char smem_tma[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(smem_tma) + 1023u) & ~1023u;
    const unsigned sQ = base;
    const unsigned sK = sQ + NC * L::Q_WG;              // stage s: K at sK + 2 s TILE, V at sK + (2 s + 1) TILE
    const unsigned bars = base + L::BARS;   // q_full, q_empty, k_full[S], v_full[S], k_empty[S], v_empty[S]
    const unsigned q_full = bars, q_empty = bars + 8;
    const unsigned item_slot = bars + 8 * (2 + 4 * STAGES);   // the item whose Q is loading (-1: none left)
#define K_FULL(s) (bars + 8 * (2 + (s)))
#define V_FULL(s) (bars + 8 * (2 + STAGES + (s)))
#define K_EMPTY(s) (bars + 8 * (2 + 2 * STAGES + (s)))
#define V_EMPTY(s) (bars + 8 * (2 + 3 * STAGES + (s)))

    // the warpgroup index through a shuffle from lane 0: the compiler then knows it is warp-uniform and keeps what
    // derives from it (the Q descriptors) in uniform registers
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const LaunchPart* parts = reinterpret_cast<const LaunchPart*>(maps + 3 * nparts);   // after the maps
    auto item_at = [&](int item) {
        int p = 0;                           // the part holding the item (a few parts: a linear walk)
        while (p + 1 < nparts && item >= __ldg(&parts[p + 1].first_item)) ++p;
        const int first = __ldg(&parts[p].first_item);
        const int end = p + 1 < nparts ? __ldg(&parts[p + 1].first_item) : items;
        TmaItem w = tma_item<NC, BK>(item - first, __ldg(&parts[p].heads), qblocks, (end - first) / qblocks, group,
                                     mq, mk, causal, causal_shift);
        w.part = p;
        return w;
    };
    if (!PERSISTENT && item_at(blockIdx.x).ntiles == 0) return;   // uniform: no key visible to this block
    if (tid == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, WG_THREADS * NC);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(K_FULL(s), 1);
            mbar_init(V_FULL(s), 1);
            mbar_init(K_EMPTY(s), RELEASE_ARRIVALS * NC);
            mbar_init(V_EMPTY(s), RELEASE_ARRIVALS * NC);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {                           // producer: one thread issues every copy
        setmaxnreg_dec<R::PREG>();
        if (tid == 0) {
            // g: the block's tiles before the current item, modulo 2 STAGES (a stage and its phase repeat with that
            // period; the count itself could pass 2^31); k: the block's items before the current one, modulo 2 (the
            // Q phase). A barrier's first wait, on the phase before its first (parity 1), returns at once, so the
            // first fill of a stage and the first Q wait for nothing.
            int g = 0, k = 0;
            for (int item = blockIdx.x; item < items; item = next_item(work)) {
                const TmaItem wi = item_at(item);
                if (wi.ntiles == 0) continue;
                const int seg = wi.seg;
                mbar_wait(q_empty, k ^ 1);       // every consumer is done with the last item's Q and its number
                st_shared_int(item_slot, item);  // published by q_full's phase (the arrival releases it)
                mbar_expect_tx(q_full, NC * L::Q_WG);
                for (int w = 0; w < NC; ++w)
                    for (int r = 0; r < NR; ++r)
                        tma_load_4d(sQ + (w * NR + r) * L::Q_REGION, maps + 3 * wi.part, RC * r, wi.head,
                                    wi.qblock + WG_QUERIES * w, seg, q_full);
                // tile it's K (map 1) or V (map 2) into its stage, once the consumers released the stage's last one
                auto load_tile = [&](int it, int m) {
                    const int gi = g + it;
                    const int s = stage_of<STAGES>(gi);
                    const unsigned full = m == 1 ? K_FULL(s) : V_FULL(s);
                    mbar_wait(m == 1 ? K_EMPTY(s) : V_EMPTY(s), phase_of<STAGES>(gi) ^ 1);
                    const unsigned st = sK + (2 * s + m - 1) * L::TILE;
                    mbar_expect_tx(full, L::TILE);
                    for (int r = 0; r < NR; ++r)
                        tma_load_4d(st + r * L::REGION, maps + 3 * wi.part + m, RC * r, wi.head, it * BK, seg, full);
                };
                // in the order the consumers read them: PIPE issues Q K^T of tile it before P V of tile it - 1
                for (int it = 0; it < wi.ntiles; ++it) {
                    load_tile(it, 1);
                    if (!PIPE) load_tile(it, 2);
                    if (PIPE && it > 0) load_tile(it - 1, 2);
                }
                if (PIPE) load_tile(wi.ntiles - 1, 2);
                g = (g + wi.ntiles) % (2 * STAGES);
                k ^= 1;
                if (!PERSISTENT) break;      // one item per block: nothing carried over
            }
            if (PERSISTENT) {                // no item left: the consumers' last Q phase carries the end mark
                mbar_wait(q_empty, k ^ 1);
                st_shared_int(item_slot, -1);
                mbar_arrive(q_full);
            }
        }
    } else {                                 // consumers
        setmaxnreg_inc<R::CREG>();
        const int w = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
        const unsigned sQw = sQ + w * NR * L::Q_REGION;
        // the operands' descriptors: this warpgroup's Q, K and V of stage 0, a stage and k-step adding their offsets
        // (SwizzledDesc; with a descriptor made per operand, 12 uniform instructions led each Q K^T wgmma, and
        // the kernel ran 1.01-1.05x slower)
        const SwizzledDesc<RB> q_desc(sQw, 16), k_desc(sK, 16), v_desc(sK + L::TILE, L::REGION);
        const float mul = scale * LOG2E;
        const IssueTurns<NC, PINGPONG != 0> turns{w};
        const FinalOutput<T> fin{out16, later, nlater, f_seg, f_head, f_row, f_rowlen};
        int g0 = 0, k = 0;                   // the producer's g and k
        while (true) {
            // the item the producer loads Q for next (-1: none is left)
            mbar_wait(q_full, k);
            const int item = ld_shared_int(item_slot);
            if (item < 0) break;
            const TmaItem wi = item_at(item);
            const int kend = wi.kend, ntiles = wi.ntiles;
            const int qwg = wi.qblock + WG_QUERIES * w;
            // visible_key_end / unmasked_key_end of mask.cuh, spelled out: through the helpers the cubin differs
            int kend_wg = (qwg < mq) ? kend : 0;
            if (causal) kend_wg = min(kend_wg, max(0, qwg + WG_QUERIES + causal_shift));
            const int open_end = causal ? min(kend, max(0, qwg + causal_shift + 1)) : kend;
            const int nt = min(ntiles, (kend_wg + BK - 1) / BK);   // tiles this warpgroup computes (a prefix)

            const int row0 = qwg + 16 * warp + g;    // this thread's rows: row0, row0 + 8
            float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
            float o[NO];
        #pragma unroll
            for (int i = 0; i < NO; ++i) o[i] = 0.0f;
            float s[NS];
            unsigned p[KP][4];

            // the rows' log-sum-exp before the merge, read now (its first use is PF tiles before the end): rows
            // that hold an earlier result get their running output prefetched into L2 for the merge
            const LaunchPart* part = parts + wi.part;
            const long long ooff = __ldg(&part->o_base) + (long long)wi.seg * o_seg + (long long)wi.head * o_head;
            const long long loff = __ldg(&part->l_base) + (long long)wi.seg * l_seg + (long long)wi.head * l_head;
            float old[2];
            running_lse(lse, loff, l_row, row0, mq, old);
            constexpr int PF = 2;                // tiles before the last that the prefetch is issued
            const int pf_tile = max(0, nt - 1 - PF);
            auto prefetch = [&](int it) {
                if (it == pf_tile) prefetch_merge_rows<D>(out, ooff, o_row, row0, t, old);
            };

            turns.start();

            // tile it's stage: the offset of its K from stage 0's (and of its V from stage 0's), in 16-byte units
            auto stage_units = [&](int it) { return (unsigned)(2 * stage_of<STAGES>(g0 + it) * (L::TILE / 16)); };
            // S = Q K^T of tile it into s (issued and committed, not waited for)
            auto issue_qk = [&](int it) {
                const unsigned stage = stage_units(it);
                pin(s);
                wgmma_fence();
        #pragma unroll
                for (int ks = 0; ks < KQ; ++ks) {
                    const desc_t dq = q_desc.at((ks / KR) * (L::Q_REGION / 16) + 2 * (ks % KR));
                    const desc_t dk = k_desc.at(stage + (ks / KR) * (L::REGION / 16) + 2 * (ks % KR));
                    if (ks == 0)
                        Wgmma16<T, BK>::template ss<0>(s, dq, dk);
                    else
                        Wgmma16<T, BK>::template ss<1>(s, dq, dk);
                }
                wgmma_commit();
            };
            // O += P V of tile it (issued and committed)
            auto issue_pv = [&](int it) {
                const unsigned stage = stage_units(it);
                pin(o);
                pin_u(p);
                wgmma_fence();
        #pragma unroll
                for (int kk = 0; kk < KP; ++kk)
                    Wgmma16<T, D>::template rs<1, 1>(o, p[kk], v_desc.at(stage + RB * kk));   // 16 keys: 16 RB bytes
                wgmma_commit();
            };
            auto pack_p = [&]() {
        #pragma unroll
                for (int kk = 0; kk < KP; ++kk)
        #pragma unroll
                    for (int j = 0; j < 4; ++j) p[kk][j] = H::pack(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
            };
            auto softmax = [&](int it) {
                const int kt = it * BK;
                softmax_tile<BK / 8, NO, false, LAZY != 0>(s, o, m, l, alpha, kt + BK > open_end, kt, kend, causal,
                                                           causal_shift, row0, t, mul);
            };
            auto rescale = [&]() {
                if (LAZY)
                    rescale_rows_lazy<NO>(o, alpha);
                else
                    rescale_rows<NO>(o, alpha);
            };

            // every warpgroup takes one turn per tile of the block (ntiles), those past its own nt without products
            if (PIPE) {
                if (nt > 0) {
                    mbar_wait(K_FULL(stage_of<STAGES>(g0)), phase_of<STAGES>(g0));
                    turns.wait();
                    issue_qk(0);
                    turns.pass(0, ntiles);
                    wgmma_wait<0>();
                    pin(s);
                    mbar_release(K_EMPTY(stage_of<STAGES>(g0)));
                    softmax(0);                      // o is zero: nothing to rescale
                    pack_p();
                    prefetch(0);
                    for (int it = 1; it < nt; ++it) {
                        prefetch(it);
                        mbar_wait(K_FULL(stage_of<STAGES>(g0 + it)), phase_of<STAGES>(g0 + it));
                        turns.wait();
                        issue_qk(it);
                        mbar_wait(V_FULL(stage_of<STAGES>(g0 + it - 1)), phase_of<STAGES>(g0 + it - 1));
                        issue_pv(it - 1);
                        turns.pass(it, ntiles);
                        wgmma_wait<1>();             // S(it) landed; P(it-1) V(it-1) may still run
                        pin(s);
                        mbar_release(K_EMPTY(stage_of<STAGES>(g0 + it)));
                        softmax(it);
                        wgmma_wait<0>();
                        pin(o);
                        mbar_release(V_EMPTY(stage_of<STAGES>(g0 + it - 1)));
                        rescale();
                        pack_p();
                    }
                    mbar_wait(V_FULL(stage_of<STAGES>(g0 + nt - 1)), phase_of<STAGES>(g0 + nt - 1));
                    issue_pv(nt - 1);
                    wgmma_wait<0>();
                    pin(o);
                    mbar_release(V_EMPTY(stage_of<STAGES>(g0 + nt - 1)));
                }
            } else {
                for (int it = 0; it < nt; ++it) {
                    prefetch(it);
                    const int st = stage_of<STAGES>(g0 + it);
                    const unsigned ph = phase_of<STAGES>(g0 + it);
                    mbar_wait(K_FULL(st), ph);
                    turns.wait();
                    issue_qk(it);
                    turns.pass(it, ntiles);
                    wgmma_wait<0>();
                    pin(s);
                    mbar_release(K_EMPTY(st));
                    softmax(it);
                    rescale();
                    pack_p();
                    mbar_wait(V_FULL(st), ph);
                    issue_pv(it);
                    wgmma_wait<0>();
                    pin(o);
                    mbar_release(V_EMPTY(st));
                }
            }
            mbar_arrive(q_empty);                // this warpgroup's products are complete: Q may be reloaded
            // tiles only later warpgroups see: let the producer reuse their stages, and pass the turns
            for (int it = nt; it < ntiles; ++it) {
                const int st = stage_of<STAGES>(g0 + it);
                const unsigned ph = phase_of<STAGES>(g0 + it);
                mbar_wait(K_FULL(st), ph);
                mbar_release(K_EMPTY(st));
                mbar_wait(V_FULL(st), ph);
                mbar_release(V_EMPTY(st));
                turns.wait();
                turns.pass(it, ntiles);
            }

            merge_out<T, D>(out, lse, ooff, o_row, loff, l_row, row0, mq, t, m, l, o, old, fin, __ldg(&part->f_base),
                            wi.seg, wi.head);
            g0 = (g0 + ntiles) % (2 * STAGES);
            k ^= 1;
            if (!PERSISTENT) break;
        }
    }
#undef K_FULL
#undef V_FULL
#undef K_EMPTY
#undef V_EMPTY
}
