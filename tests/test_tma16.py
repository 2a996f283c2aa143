"""The warp-specialized Hopper kernel (dilated_fwd_tma_16.cu, variant tma16) and its tensor maps, without a GPU.

NVRTC compiles every instantiation to an sm_90a cubin: bulk tensor copies completing on mbarriers, the
producer/consumer register split (setmaxnreg), 16-bit wgmma, no spills, no serialized wgmma. The tensor
maps of every launch (kernels/tma.py) address exactly the elements of the launch's element-offset
geometry, for local patterns and for packed ring blocks.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from hilbert_hpc.kernels import program, tma
from hilbert_hpc.kernels.launch import FusedKernels
from hilbert_hpc.kernels.registry import HOPPER_SHARED, TMA16
from hilbert_hpc.kernels.sixteen_bit import (CONVERT_SOURCE, LAUNCH_PART, convert_names, head_offset_parts,
                                             tma_launch_args)

from nvrtc_probe import HAVE_NVRTC, needs_nvrtc
VARIANTS = TMA16.instantiations()


@needs_nvrtc
def test_ptx_has_bulk_tensor_copies_mbarriers_and_register_split():
    from hilbert_hpc.kernels.check import compile_templates

    ptx = compile_templates("compute_90a", TMA16.source, [v.name for v in VARIANTS], program.ARCH_OPTIONS)[1]
    for needle in ("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                   "setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32",
                   "fence.mbarrier_init.release.cluster"):
        assert needle in ptx, needle
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16", ptx)
    assert "cp.async.cg" not in ptx                      # every tile comes through the copy engine


@needs_nvrtc
@pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
def test_sm90a_cubin_without_spills(v):
    from hilbert_hpc.kernels.check import arch_ptxas_report

    r = arch_ptxas_report(v)
    assert r["cubin_bytes"] > 0, r["log"]
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, f"{v.name}: spills\n{r['log']}"
    assert not r["serialized"], f"{v.name}: ptxas serialized wgmma\n{r['log']}"
    # the entry count is the launch bound's (65536 / threads, a multiple of 8): what setmaxnreg redistributes
    assert r["registers"] == min(248, (65536 // v.threads) // 8 * 8), r["registers"]
    assert v.shared_bytes <= HOPPER_SHARED


@needs_nvrtc
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_conversion_kernels_compile_with_the_kernels_rounding(arch):
    """widen_16 / narrow_16 (the float32 running output of a head group) use Half16's PTX conversions."""
    from hilbert_hpc.kernels.check import compile_templates

    lowered, ptx = compile_templates(arch, CONVERT_SOURCE, convert_names())
    assert len(lowered) == 4
    assert "cvt.rn.bf16x2.f32" in ptx and "cvt.rn.f16x2.f32" in ptx and "ld.global.nc.v4.u32" in ptx
    assert "0fFF800000" in ptx                               # rows without a log-sum-exp are skipped


def test_shared_bytes_and_threads_follow_the_configuration():
    v = TMA16.variant(64, "bfloat16", (64, 4, 3, 1, 1, 1, 1))
    assert (v.threads, v.block_queries, v.config) == (640, 256, (64, 4, 3, 1, 1, 1, 1))
    assert v.shared_bytes == 2 * 256 * 64 + 3 * 2 * 64 * 64 * 2 + 8 * 15 + 1024     # 14 mbarriers, the item slot
    assert v.name == "dilated_fwd_tma_16<bf16_t,64,64,4,3,1,1,1,1,bf16_t>" and v.arch == "sm_90a" and v.runs_on(90)
    with pytest.raises(ValueError, match="head_dim"):
        TMA16.variant(48, "bfloat16")
    d96 = TMA16.variant(96, "float16")          # computed as 128 columns: the shared memory of D = 128
    assert d96.shared_bytes == TMA16.variant(128, "float16", d96.config).shared_bytes
    for bad in ((48, 2, 2, 0, 1), (64, 1, 2, 0, 1), (64, 5, 2, 0, 1), (64, 2, 1, 0, 1), (64, 2, 2, 2, 1), (64, 2, 2, 0, 2)):
        with pytest.raises(ValueError, match="tma16 configuration"):
            TMA16.variant(64, "bfloat16", bad)


def _launches(monkeypatch, n: int, heads: int, d: int, patterns, causal: bool) -> list[dict]:
    """The launch geometries FusedKernels hands the 16-bit launcher for these local patterns."""
    calls: list[dict] = []
    fk = FusedKernels(lambda *arrays, **geo: calls.append(geo))
    fk.local_patterns(0, 0, 0, patterns, causal, 0.125, 0, 0, shape=(n, heads, d))
    return calls


def _check_maps(v, geo: dict | list[dict], n: int, heads: int, d: int) -> None:
    """Every map coordinate of every part addresses the element the part's launch geometry names, inside the
    (n, H, D) array; the parts' table says where each part's items start and its output begins."""
    parts = [geo] if isinstance(geo, dict) else geo
    pointers = (0x10000, 0x20000, 0x30000, 0x40000, 0x50000)
    sms = 132
    maps, grid, args, table = tma_launch_args(v, pointers, [{k: p[k] for k in (
        "qg", "kg", "vg", "lg", "segments", "heads", "mq", "mk", "shift", "scale", "head_dim")} for p in parts], sms=sms)
    keys, nc, persistent = v.config[0], v.config[1], v.config[6]
    first = parts[0]
    segments, mq, mk = first["segments"], first["mq"], first["mk"]
    qblocks = -(-mq // (64 * nc))
    starts = np.cumsum([0] + [segments * p["heads"] * qblocks for p in parts])
    items = int(starts[-1])
    assert grid == ((min(items, sms) if persistent else items),)
    assert [int(a) for a in args[:2]] == [0x40000, 0x50000]
    assert [int(a) for a in args[2:8]] == [*first["qg"][1:], *first["lg"][1:]]
    assert [int(a) for a in args[8:15]] == [len(parts), qblocks, items, mq, mk, first["shift"] is not None,
                                            first["shift"] or 0]
    group = int(args[16])
    assert group == 1 if first["shift"] is None else 1 <= group <= segments * max(p["heads"] for p in parts)
    rows = np.frombuffer(table, dtype=LAUNCH_PART)
    assert len(table) == 32 * len(parts) and rows["first_item"].tolist() == starts[:-1].tolist()
    assert rows["heads"].tolist() == [p["heads"] for p in parts]
    assert rows["o_base"].tolist() == [p["qg"][0] for p in parts] and rows["l_base"].tolist() == [p["lg"][0] for p in parts]
    for i, p in enumerate(parts):
        _check_part_maps(maps[3 * i:3 * i + 3], pointers, p, keys, n, heads)


def _check_part_maps(maps, pointers, geo: dict, keys: int, n: int, heads: int) -> None:
    segments, nh, mq, mk, d = geo["segments"], geo["heads"], geo["mq"], geo["mk"], geo["head_dim"]
    for m, ptr, g, rows, box in ((maps[0], pointers[0], geo["qg"], mq, 64), (maps[1], pointers[1], geo["kg"], mk, keys),
                                 (maps[2], pointers[2], geo["vg"], mk, keys)):
        assert m.dims == (d, nh, rows, segments) and m.box == (tma.region_columns(d), 1, box, 1)
        assert m.address == ptr + 2 * g[0] and all(s % 16 == 0 for s in m.strides)
        base = (m.address - ptr) // 2
        for c, h, j, s in itertools.product({0, min(63, d - 1), d - 1}, {0, nh - 1}, {0, 1, rows - 1}, {0, segments - 1}):
            if j >= rows:
                continue
            want = g[0] + s * g[1] + h * g[2] + j * g[3] + c
            assert base + m.element_offset(c, h, j, s) == want
            assert 0 <= want < n * heads * d


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", TMA16.head_dims)
def test_maps_address_the_local_pattern_geometry(monkeypatch, d, causal):
    n, heads = 16384, 6
    calls = _launches(monkeypatch, n, heads, d, [(2048, 1), (4096, 2), (8192, 4), (16384, 8)], causal)
    assert len(calls) == 1 + 2 + 4 + 6                   # one launch per pattern and head offset (r >= H: H)
    for cfg in TMA16.configurations(d):
        v = TMA16.variant(d, "bfloat16", cfg)
        for geo in calls:
            _check_maps(v, geo, n, heads, d)
        for parts in head_offset_parts(calls):          # a pattern's head offsets: one launch, a part each
            _check_maps(v, parts, n, heads, d)


def test_head_offsets_of_a_pattern_run_as_the_parts_of_one_launch():
    n, heads, d = 16384, 6, 64
    pats = [(2048, 1), (4096, 2), (8192, 4), (16384, 8), (8192, 4)]
    launches = _launches(None, n, heads, d, pats, True)
    runs = head_offset_parts(launches)
    # one run per pattern, in order; the repeated (8192, 4) merges after the first, not beside it
    assert [len(r) for r in runs] == [1, 2, 4, 6, 4] and [g for r in runs for g in r] == launches
    for r in runs:
        assert len({g["lg"][0] for g in r}) == len(r) and len({(g["qg"][1:], g["mq"]) for g in r}) == 1
    with pytest.raises(ValueError, match="differ in more than"):
        tma_launch_args(TMA16.variant(d, "bfloat16"), (0, 0, 0, 0, 0), [*runs[1], runs[2][0]], sms=132)


def test_maps_address_a_packed_ring_block():
    """Ring blocks: one segment (stride 0 in the geometry) and packed K/V rows of nh heads."""
    n, heads, d, r, o = 4096, 6, 64, 4, 1
    row, nh, mk = heads * d, len(range(o, heads, r)), 512
    geo = dict(qg=(o * row + o * d, 0, r * d, r * row), kg=(0, 0, d, nh * d), vg=(mk * nh * d, 0, d, nh * d),
               lg=(o * heads + o, 0, r, r * heads), segments=1, heads=nh, mq=n // r, mk=mk, shift=0, scale=0.1,
               head_dim=d)
    v = TMA16.variant(d, "float16")
    maps, _, _, _ = tma_launch_args(v, (0, 0, 0, 0, 0), [geo], sms=132)
    assert maps[0].strides[2] == maps[0].strides[1] * (n // r)     # the segment stride of one segment: packed
    _check_maps(v, geo, n, heads, d)


def test_map_geometry_refuses_what_the_copy_engine_cannot_read():
    with pytest.raises(ValueError, match="row stride of 72 bytes"):
        tma.map_geometry(0, (0, 0, 0, 36), 8, 1, 1, 64, 64)
    with pytest.raises(ValueError, match="not aligned to 16 bytes"):
        tma.map_geometry(8, (0, 0, 64, 64 * 2), 8, 2, 1, 64, 64)
    with pytest.raises(ValueError, match="box of 512 rows"):
        tma.map_geometry(0, (0, 0, 64, 128), 8, 2, 1, 64, 512)
    with pytest.raises(ValueError, match="empty launch"):
        tma.map_geometry(0, (0, 0, 64, 128), 0, 2, 1, 64, 64)
    g = tma.map_geometry(0x100, (8, 1 << 20, 64, 128), 8, 2, 3, 64, 64)
    assert (g.address, g.strides, g.dims) == (0x110, (128, 256, 2 << 20), (64, 2, 8, 3))
    assert isinstance(np.uint64(g.address), np.uint64)


def test_launch_refuses_more_query_blocks_than_the_item_index_walks():
    """The kernel walks items with an int index that reaches items + the grid: beyond 2^31 - 1 it refuses."""
    persistent = TMA16.variant(64, "bfloat16", (*TMA16.defaults[64][:6], 1))
    one_each = TMA16.variant(64, "bfloat16", (*TMA16.defaults[64][:6], 0))
    nc = persistent.config[1]
    segments, heads, mq = 2**28, 4, 64 * nc          # 2^30 query blocks
    geo = dict(qg=(0, mq * heads * 64, 64, heads * 64), kg=(0, mq * heads * 64, 64, heads * 64),
               vg=(0, mq * heads * 64, 64, heads * 64), lg=(0, mq * heads, 1, heads), segments=segments,
               heads=heads, mq=mq, mk=mq, scale=0.125)
    for shift in (None, 0):                          # causal or not: one block per SM
        _, grid, _, _ = tma_launch_args(persistent, (0, 0, 0, 0, 0), [dict(geo, shift=shift)], sms=132)
        assert grid == (132,)
    with pytest.raises(ValueError, match="exceed a one-dimensional grid"):
        tma_launch_args(one_each, (0, 0, 0, 0, 0), [dict(geo, shift=0)], sms=132)         # a block each


def test_causal_item_groups_keep_their_keys_and_values_within_the_budget():
    from hilbert_hpc.kernels.sixteen_bit import CAUSAL_GROUP_BYTES, item_group

    per_problem = 2 * 2048 * 128 * 2                     # K and V of 2048 keys of head dim 128, 16 bits
    assert item_group(5000, 2048, 128) == CAUSAL_GROUP_BYTES // per_problem
    assert item_group(3, 2048, 128) == 3                 # no more than the launch's problems
    assert item_group(10, 2**22, 128) == 1               # one problem over the budget: groups of one



def test_a_calls_plan_is_worked_out_once_and_its_launch_arguments_once_per_arrays(monkeypatch):
    """local_plan caches a call's launch runs per call signature, and _tma_arguments each run's launch on the
    same arrays: the same call again costs lookups, other arrays get maps of their own, and the cached
    arguments are those tma_launch_args makes."""
    from hilbert_hpc.kernels import sixteen_bit
    from hilbert_hpc.kernels.selection import choose

    monkeypatch.setattr(sixteen_bit, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(sixteen_bit, "_later_table", lambda device, later: None)
    made = []
    monkeypatch.setattr(tma, "device_maps", lambda device, maps, tail=b"": made.append((maps, tail)) or len(made))
    sixteen_bit._tma_arguments.cache_clear()
    choice = choose("bfloat16", 64, cc=90, shared_limit=HOPPER_SHARED)
    key = (choice, ((2048, 1), (4096, 2), (8192, 4)), False, 0.125, 16384, 6, 64, 3, True)
    plan = sixteen_bit.local_plan(*key)
    assert sixteen_bit.local_plan(*key) is plan
    assert [(h0, h1, [len(run.parts) for run in runs]) for h0, h1, runs in plan] == [(0, 3, [1, 2, 3]),
                                                                                     (3, 6, [1, 2, 3])]
    run = plan[0][2][1]
    assert run.chosen == choice.accumulating()
    arrays, other = (1 << 40, 2 << 40, 3 << 40, 4 << 40, 5 << 40), (1 << 41, 2 << 40, 3 << 40, 4 << 40, 5 << 40)
    first = sixteen_bit._tma_arguments(run, arrays, 6 << 40, 0)
    assert sixteen_bit._tma_arguments(run, arrays, 6 << 40, 0) is first and len(made) == 1
    maps, grid, args, table = tma_launch_args(run.chosen, arrays, run.parts, sms=132, final=(6 << 40, 0))
    assert first == (1, grid, args) and made[0] == (maps, table + bytes(sixteen_bit.COUNTER_BYTES))
    sixteen_bit._tma_arguments(run, other, 6 << 40, 0)
    assert len(made) == 2 and made[1][0][0].address == made[0][0][0].address + (1 << 40)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_backward_maps_address_the_rows_of_each_backward_launch(d, causal):
    """The tensor maps of wgmma16_bwd (``backward.tensor_maps``'s geometries): for every launch of overlapping
    patterns (head offsets, several segments) and each of its key chunks, a coordinate (column, head, row, segment)
    is the element the kernel's pointer formula reaches (base + s seg + h head + j row + c): the float32 dq (like
    Q), dk (like K), dv (like V) in boxes of 32 columns x 64 rows (128-byte rows, the 128-byte swizzle span), the
    16-bit Q and dO in boxes of one region (64 columns) x one query tile."""
    from hilbert_hpc.kernels.backward import key_chunks
    from hilbert_hpc.kernels.launch import local_launches

    n, heads, ptr = 16384, 6, 1 << 30
    for g in local_launches([(2048, 1), (4096, 2), (8192, 4)], causal, 0.1, n, heads, d):
        for kc, vc, mc, _ in key_chunks(g["kg"], g["vg"], g["mk"], g["shift"], 128, 4):
            maps = [(tma.accumulator_map(ptr, geo, rows, g["heads"], g["segments"], d), geo, rows, 4, (32, 1, 64, 1))
                    for geo, rows in ((g["qg"], g["mq"]), (kc, mc), (vc, mc))]
            maps += [(tma.query_tile_map(ptr, g["qg"], g["mq"], g["heads"], g["segments"], d), g["qg"], g["mq"], 2,
                      (64, 1, 64, 1))]
            for m, geo, rows, size, box in maps:
                assert m.element_bytes == size and m.box == box and m.dims == (d, g["heads"], rows, g["segments"])
                assert m.box[0] * m.element_bytes in tma.SWIZZLE_OF_ROW_BYTES and (m.address - ptr) % size == 0
                base = (m.address - ptr) // size
                for c, h, j, s in itertools.product({0, d - 1}, {0, g["heads"] - 1}, {0, rows - 1},
                                                    {0, g["segments"] - 1}):
                    want = geo[0] + s * geo[1] + h * geo[2] + j * geo[3] + c
                    assert base + m.element_offset(c, h, j, s) == want < n * heads * d
