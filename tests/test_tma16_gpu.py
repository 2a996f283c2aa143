"""tma16's float32 running output of local patterns on a Hopper GPU (kernels.sixteen_bit.SixteenBitKernels).

Local patterns merge into a float32 scratch for a group of heads and are rounded to 16 bits once. Checked
against float64 (dense_reference) and the PyTorch peer on the same 16-bit inputs: merging into an output
that earlier calls filled (patterns split over two calls), and (row, head) pairs that no pattern selects
keeping their bits exactly (the conversions skip pairs without a log-sum-exp).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import gpu_available
from dense_reference import dense_dilated_attention

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    if not gpu_available():
        return False
    import cupy

    return int(cupy.cuda.Device().compute_capability) == 90


def _errors_against_float64(q, k, v, out, patterns, causal: bool, scale: float, selected=None) -> tuple:
    """(max |ours - float64| / max |float64|, the same of the PyTorch peer in the same 16-bit dtype, whether ours is
    finite everywhere) of ``out`` against dense_reference computed from the same 16-bit inputs; the errors over
    the (row, head) pairs ``selected`` (a boolean (n, H) tensor; all by default)."""
    from hilbert_hpc.backends.torch_peer import TorchPeer

    host = [x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    want = dense_dilated_attention(*host, [(p.segment, p.dilation) for p in patterns], causal, scale=scale)
    peer = TorchPeer().serialized_attention(q, k, v, patterns, causal, scale).double().cpu().numpy()
    got = out.double().cpu().numpy()
    sel = np.ones(want.shape[:2], dtype=bool) if selected is None else selected.cpu().numpy()
    top = np.abs(want[sel]).max()
    return (np.abs(got[sel] - want[sel]).max() / top, np.abs(peer[sel] - want[sel]).max() / top,
            bool(np.isfinite(got).all()))


def _force_tma16(monkeypatch, dtype: str, d: int, config: tuple) -> None:
    """HILBERT_HPC_HALF_KERNEL set to tma16 ``config``, and the choice for (dtype, d) checked to be it."""
    from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV, choose

    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tma16:" + ",".join(map(str, config)))
    assert choose(dtype, d).variant.config == config


@pytest.mark.skipif(not _hopper(), reason="tma16 needs compute capability 9.0")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,d", [("bfloat16", 64), ("float16", 128), ("bfloat16", 128), ("bfloat16", 96),
                                     ("float16", 32)])
def test_split_calls_merge_in_float32_and_leave_unselected_rows_alone(monkeypatch, dtype, d, causal):
    import torch

    from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV, choose
    from hilbert_hpc.kernels.sixteen_bit import launch_local_patterns
    from hilbert_hpc.core.patterns import Pattern

    monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)
    n, heads = 4096, 7
    patterns = [Pattern(512, 2), Pattern(1024, 4), Pattern(4096, 8)]    # rows s % 2 != h % 2: no pattern
    dt = getattr(torch, dtype)
    assert choose(dtype, d).name == "tma16"
    g = torch.Generator(device="cuda").manual_seed(d + causal)
    q, k, v = (torch.randn((n, heads, d), generator=g, device="cuda").to(dt) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    sentinel = torch.full((n, heads, d), 7.0, device="cuda").to(dt)
    out, lse = sentinel.clone(), torch.full((n, heads), -math.inf, device="cuda")
    launch_local_patterns(q, k, v, patterns[:1], causal, scale, out, lse)
    launch_local_patterns(q, k, v, patterns[1:], causal, scale, out, lse)
    torch.cuda.synchronize()

    s = torch.arange(n, device="cuda")[:, None]
    selected = (s % 2) == (torch.arange(heads, device="cuda")[None, :] % 2)
    assert torch.equal(out[~selected], sentinel[~selected])              # bits untouched where nothing merged
    assert torch.isneginf(lse[~selected]).all() and torch.isfinite(lse[selected]).all()

    ours_err, peer_err, finite = _errors_against_float64(q, k, v, out, patterns, causal, scale, selected)
    assert finite and ours_err <= 2 * peer_err, (ours_err, peer_err)


@pytest.mark.skipif(not _hopper(), reason="tma16 needs compute capability 9.0")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("lazy", [0, 1])
@pytest.mark.parametrize("d", [32, 64, 96, 128])
def test_scores_growing_along_the_keys_rescale_the_running_output(monkeypatch, d, lazy, dtype):
    """Scores that grow along the keys at a rate set per row (row % 4: not at all, by about 2, 5 and 12 in log2
    units per key tile), so one warp holds rows whose max moves on every tile, rows whose max is kept while the
    tile's max is a few units above it (probabilities well above 1) and rows that never move; on head 1 the
    ramp is reversed (the largest scores in the first tile). With lazy rescaling (LAZY = 1) and with every
    tile's rescale (LAZY = 0) the result must match float64 as closely as the peer does."""
    import torch

    from hilbert_hpc.core.patterns import Pattern
    from hilbert_hpc.kernels.registry import TMA16
    from hilbert_hpc.kernels.sixteen_bit import launch_local_patterns

    config = (*TMA16.defaults[d][:4], lazy, *TMA16.defaults[d][5:])
    _force_tma16(monkeypatch, dtype, d, config)
    n, heads, causal, keys_per_tile = 2048, 2, False, config[0]
    patterns = [Pattern(2048, 1)]
    g = torch.Generator(device="cuda").manual_seed(d + lazy)
    q = torch.randn((n, heads, d), generator=g, device="cuda") * 0.05 + 1.0
    k = torch.randn((n, heads, d), generator=g, device="cuda") * 0.05 + 1.0
    v = torch.randn((n, heads, d), generator=g, device="cuda")
    # score(i, j) ~ rate(i) * j * sqrt(d) / ln 2 in log2 units: rate per key tile 0, 2, 5, 12 by i % 4
    per_tile = torch.tensor([0.0, 2.0, 5.0, 12.0], device="cuda")[torch.arange(n, device="cuda") % 4]
    q = q * (per_tile * math.log(2) / (keys_per_tile * math.sqrt(d)))[:, None, None]
    k = k * torch.arange(n, device="cuda", dtype=torch.float32)[:, None, None]
    k[:, 1] = k[:, 1].flip(0)                  # head 1: the largest scores first
    dt = getattr(torch, dtype)
    q, k, v = (x.to(dt) for x in (q, k, v))
    scale = 1.0 / math.sqrt(d)
    out, lse = torch.zeros_like(q), torch.full((n, heads), -math.inf, device="cuda")
    launch_local_patterns(q, k, v, patterns, causal, scale, out, lse)
    torch.cuda.synchronize()

    ours_err, peer_err, finite = _errors_against_float64(q, k, v, out, patterns, causal, scale)
    floor = 2.0 ** -9 if dtype == "bfloat16" else 2.0 ** -12
    assert finite and ours_err <= 2 * max(peer_err, floor), (ours_err, peer_err)


@pytest.mark.skipif(not _hopper(), reason="tma16 needs compute capability 9.0")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pingpong", [0, 1])
@pytest.mark.parametrize("dtype,d", [("bfloat16", 32), ("float16", 64), ("bfloat16", 96), ("bfloat16", 128)])
def test_persistent_blocks_walk_many_query_blocks(monkeypatch, dtype, d, pingpong, causal):
    """PERSISTENT = 1 on a GPU made to look like 3 SMs: each block takes dozens of query blocks of several
    problems from the launch's counter (the stage ring and the Q buffer carried from one to the next; causal
    ones of unequal length, by groups of problems with a smaller last group), with and without ping-pong
    turns, ragged segments (the last query block of a problem partly past its rows) and a later pattern
    merging into the first's output; the result must match float64 as closely as the PyTorch peer does."""
    import torch

    from hilbert_hpc.core.patterns import Pattern
    from hilbert_hpc.kernels import sixteen_bit
    from hilbert_hpc.kernels.registry import TMA16

    _force_tma16(monkeypatch, dtype, d, (*TMA16.defaults[d][:5], pingpong, 1))
    monkeypatch.setattr(sixteen_bit, "multiprocessors", lambda device_id: 3)
    # causal items by groups of 4 problems: 18 and 3 x 2 problems leave a smaller last group
    monkeypatch.setattr(sixteen_bit, "item_group", lambda problems, keys, head_dim: min(problems, 4))
    n, heads = 6000, 3
    patterns = [Pattern(1000, 1), Pattern(3000, 2)]
    g = torch.Generator(device="cuda").manual_seed(d + 10 * pingpong + 100 * causal)
    q, k, v = (torch.randn((n, heads, d), generator=g, device="cuda").to(getattr(torch, dtype)) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    out, lse = torch.zeros_like(q), torch.full((n, heads), -math.inf, device="cuda")
    sixteen_bit.launch_local_patterns(q, k, v, patterns, causal, scale, out, lse)
    torch.cuda.synchronize()

    ours_err, peer_err, finite = _errors_against_float64(q, k, v, out, patterns, causal, scale)
    assert finite and ours_err <= 2 * peer_err, (ours_err, peer_err)
