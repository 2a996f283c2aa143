"""Long-pattern schedules: the choice made once per case, and the gather geometry it runs on."""

from __future__ import annotations

import numpy as np
import pytest

from jobtext import JobSpec

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.distributed.gather import GatherPattern
from hilbert_hpc.distributed.ring import RingPattern
from hilbert_hpc.distributed.schedule import block_elements, choose_schedules
from hilbert_hpc.distributed.sharding import Shards
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.jobfile import load_job
from hilbert_hpc.study.setup import check_case

N, RANKS = 1 << 20, 4
LONGNET = [Pattern(2048, 1), Pattern(8192, 4), Pattern(N, 1), Pattern(N, 512)]


def test_auto_gathers_sparse_patterns_and_rotates_dense_ones():
    shards = Shards(N, RANKS)
    got = {s.index: s for s in choose_schedules(LONGNET, shards, 8, 64, 64, 2, "auto", backward=True)}
    assert sorted(got) == [2, 3]                   # the local patterns have no schedule
    assert got[2].kind == "ring" and "rotated" in got[2].reason       # (N, 1): the whole sequence
    assert got[3].kind == "gather" and "gathered" in got[3].reason    # (N, 512): N / 512 rows a head
    assert got[3].group == RANKS and got[3].gathered_elements == RANKS * got[3].block_elements
    shard_bytes = shards.shard * 8 * 3 * 64 * 2
    assert got[3].gather_bytes(2, True) <= shard_bytes < got[2].gather_bytes(2, True)
    assert got[3].describe() == f"({N}, 512) over {RANKS} ranks: gather"


@pytest.mark.parametrize("name", ["gather", "ring"])
def test_a_requested_schedule_applies_to_every_long_pattern(name):
    kinds = {s.kind for s in choose_schedules(LONGNET, Shards(N, RANKS), 8, 64, 64, 2, name)}
    assert kinds == {name}


def test_an_unknown_schedule_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="long_schedule.*gather, ring"):
        choose_schedules(LONGNET, Shards(N, RANKS), 8, 64, 64, 2, "allgather")


def test_the_case_setup_decides_once_and_the_job_key_is_checked(tmp_path):
    spec = JobSpec({"name": "s"}, defaults={"heads": 4, "head_dim": 8, "backend": "numpy"},
                   cases=[{"name": "a", "tokens": 4096, "ranks": 4, "patterns": [[256, 1], [4096, 1], [4096, 64]]},
                          {"name": "b", "tokens": 4096, "ranks": 4, "patterns": [[4096, 64]],
                           "long_schedule": "ring"}])
    job = load_job(tmp_path / "j.toml", text=spec.text(), world_size=4)
    a, b = (check_case(c, 4) for c in job.cases)
    assert [(s.index, s.kind) for s in a.schedules] == [(1, "ring"), (2, "gather")]
    assert [s.kind for s in b.schedules] == ["ring"]
    assert check_case(job.cases[0], 1).schedules == ()          # one rank: nothing spans ranks
    bad = JobSpec({"name": "s"}, cases=[{"name": "a", "tokens": 64, "patterns": [[64, 1]], "long_schedule": "x"}])
    with pytest.raises(Exception, match="long_schedule"):
        load_job(tmp_path / "bad.toml", text=bad.text(), world_size=1)


@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rank", range(4))
def test_sequence_order_holds_every_gathered_row_once(rank, causal, placement):
    """The unit index is a permutation of the rank-order buffer; each region lists its segment's selected rows
    in sequence order; a contiguous causal rank needs only the earlier ranks' blocks."""
    n, heads, d = 4 * 2 * 16, 3, 8
    shards = Shards(n, 4, placement)
    pattern = Pattern(n, 4)
    gp = GatherPattern(RingPattern(pattern, shards, rank, heads, d, d), causal)
    assert gp.covers_all and np.array_equal(np.sort(gp.index), np.arange(gp.total // gp.unit))
    # the schedule's memory counts the blocks the ring packs
    assert gp.sizes == [block_elements(pattern, shards, r, heads, d, d) for r in range(gp.ring.group)]
    # tag every element of each block with its serialized row, then check the sequence order
    tagged = np.empty(gp.total)
    for pos in range(gp.ring.group):
        for part in gp.ring.layout(pos):
            piece = gp.ring.pieces(pos)[part.piece]
            rows = gp.ring.rows(pos, part.piece, part.offset)
            serial = piece.start + np.arange(rows.start, rows.stop, rows.step) - piece.row0
            nh = gp.ring.nheads(part.offset)
            for base, width in ((part.k0, d), (part.v0, d)):
                view = tagged[gp.displs[pos] + base:gp.displs[pos] + base + part.rows * nh * width]
                view[...] = np.repeat(serial, nh * width)
    seq = gp.to_sequence(tagged, np.empty(gp.sequence_elements))
    for region in gp.regions.values():
        k, v = gp.keys(seq, region, region.rows)
        for x in (k, v):
            first = x[0, :, 0]
            assert np.all(np.diff(first) == pattern.dilation) and np.all(first % pattern.dilation == region.offset)
            assert np.all(x == first[None, :, None])
    if causal and placement == "contiguous":
        assert gp.sources == list(range(rank)) and gp.targets == list(range(rank + 1, 4))
    else:
        assert gp.sources == gp.targets == [s for s in range(4) if s != rank]
    back = gp.to_rank_order(seq, np.empty(gp.total))
    np.testing.assert_array_equal(back, tagged)
