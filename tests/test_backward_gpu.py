"""The backward kernels on a GPU against the exact float64 CPU backward on the same (rounded) inputs.

O and L come from the float64 forward of the rounded Q, K, V; dO is rounded like them; the kernels get L and
delta = rowsum(dO * O) in float32. Errors are max |got - want| / max |want| per gradient: FP32 <= 1e-5,
16 bits <= 2e-2 (FP32 arithmetic on 16-bit inputs; the gradients are float32 accumulators).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (gpu_available() and torch.cuda.is_available()),
                                 reason="needs an NVIDIA GPU (CuPy and torch with CUDA)")]

from hilbert_hpc.core.backward import local_dilated_backward  # noqa: E402
from hilbert_hpc.core.dilated import local_dilated_forward  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402
from hilbert_hpc.kernels import program, registry  # noqa: E402
from hilbert_hpc.kernels.backward import BackwardKernels  # noqa: E402
from hilbert_hpc.kernels.selection import choose_backward  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2}
#: overlapping patterns (every row of (144, 1) is in the others' segments, some in all three), selected rows not
#: multiples of the key blocks or query tiles, several segments per launch, head offsets 1..3 of (2304, 6)
N = 2304
PATTERNS = [Pattern(144, 1), Pattern(576, 3), Pattern(2304, 6)]
HEADS = 4


def problem(dtype: str, head_dim: int, causal: bool, patterns=PATTERNS, n: int = N, heads: int = HEADS,
            seed: int = 0) -> dict:
    """Rounded inputs on the GPU, L and delta in float32 on the GPU, and the float64 gradients they give."""
    rng = np.random.default_rng(seed)
    tdt = TORCH_DTYPES[dtype]
    scale = head_dim ** -0.5
    dev = [torch.from_numpy(rng.standard_normal((n, heads, head_dim))).to(tdt).cuda() for _ in range(4)]
    q, k, v, do = (x.double().cpu().numpy() for x in dev)
    out, lse = local_dilated_forward(q, k, v, patterns, causal, scale)
    want = local_dilated_backward(q, k, v, out, lse, do, patterns, causal, scale)
    delta = np.einsum("nhd,nhd->nh", do, out)
    f32 = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).cuda() for x in (lse, delta)]
    return dict(inputs=dev, lse=f32[0], delta=f32[1], want=want, scale=scale, patterns=patterns, causal=causal)


def run(kernels: BackwardKernels, p: dict, fresh: bool = False) -> tuple:
    """dQ, dK, dV of the kernels (float64 NumPy arrays); ``fresh``: dK and dV start as NaN, passed as
    ``fresh_kv`` (never read: stored by the first pattern, or zeroed first)."""
    q, k, v, do = p["inputs"]
    grads = [torch.full(x.shape, float("nan") if fresh and i else 0.0, dtype=torch.float32, device="cuda")
             for i, x in enumerate((q, k, v))]
    kernels.local_patterns(q, k, v, do, p["lse"], p["delta"], *grads, p["patterns"], p["causal"], p["scale"],
                           fresh_kv=fresh)
    torch.cuda.synchronize()
    return tuple(g.double().cpu().numpy() for g in grads)


def max_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def skip_unless_runs(dtype: str, family: str = "fma_bwd", head_dim: int = 64) -> None:
    """Skip where this GPU cannot run ``family`` for ``dtype`` (16 bits: compute capability 8.0; the family's own
    compute capabilities and shared memory)."""
    cc = program.compute_capability()
    chosen = registry.family(family).variant(head_dim, dtype)
    if dtype != "float32" and cc < 80:
        pytest.skip(f"16-bit dtypes need compute capability 8.0, this GPU has {cc / 10:.1f}")
    if not chosen.runs_on(cc) or chosen.shared_bytes > (registry.family(family).max_shared or program.shared_limit()):
        pytest.skip(f"{family} for head_dim {head_dim} does not run on this GPU (compute capability {cc / 10:.1f})")


def backward_instantiations() -> list:
    """(family, dtype, head dim) of every backward family's default instantiations."""
    return [(f.name, t, d) for f in registry.FAMILIES.values() if f.direction == registry.BACKWARD
            for t in f.dtypes for d in f.head_dims]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("family,dtype,head_dim", backward_instantiations())
def test_every_backward_instantiation_matches_float64(family, dtype, head_dim, causal):
    skip_unless_runs(dtype, family, head_dim)
    p = problem(dtype, head_dim, causal)
    got = run(BackwardKernels(choose_backward(dtype, head_dim, override=family)), p)
    for name, g, w in zip(("dq", "dk", "dv"), got, p["want"]):
        assert np.isfinite(g).all(), name
        assert max_rel(g, w) <= TOLERANCE[dtype], (name, max_rel(g, w))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_no_pattern_selects_get_zero_gradients(dtype):
    """One head, dilation 2: the odd rows are in no pattern (L = -inf, delta = 0): zero, never NaN."""
    skip_unless_runs(dtype)
    p = problem(dtype, 64, True, patterns=[Pattern(256, 2)], n=1024, heads=1)
    got = run(BackwardKernels(choose_backward(dtype, 64, override="")), p)
    for g, w in zip(got, p["want"]):
        assert np.isfinite(g).all() and not g[1::2].any()
        assert max_rel(g, w) <= TOLERANCE[dtype]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,head_dim", [("float32", 32), ("float32", 128), ("bfloat16", 64), ("bfloat16", 128)])
def test_key_chunks_give_the_unchunked_gradients(dtype, head_dim, causal):
    """One key block per launch (many chunks, causal shifts moved by each chunk) against one launch: dK and dV
    are the same sums in the same order, dQ the same terms added in another order. On compute capability 9.0
    the chunks and patterns are dependent launches that start while the one before ends: a read-add-write of dK
    or dV before the launch before it completed would lose terms here."""
    skip_unless_runs(dtype, choose_backward(dtype, head_dim, override="").name, head_dim)
    p = problem(dtype, head_dim, causal, seed=3)
    choice = choose_backward(dtype, head_dim, override="")
    whole = run(BackwardKernels(choice), p)
    chunked = run(BackwardKernels(choice, max_key_blocks=1), p)
    assert np.array_equal(chunked[1], whole[1]) and np.array_equal(chunked[2], whole[2])
    assert max_rel(chunked[0], whole[0]) <= 1e-6
    for g, w in zip(chunked, p["want"]):
        assert max_rel(g, w) <= TOLERANCE[dtype]


def test_cupy_float32_arrays_and_raw_pointers():
    """float32 CuPy arrays, and raw pointers with shape=, give the gradients of torch tensors."""
    import cupy

    p = problem("float32", 64, False, n=576, patterns=[Pattern(144, 1), Pattern(576, 3)])
    kernels = BackwardKernels(choose_backward("float32", 64, override=""))
    want = run(kernels, p)
    arrays = [cupy.asarray(x.cpu().numpy()) for x in (*p["inputs"], p["lse"], p["delta"])]
    grads = [cupy.zeros(x.shape, dtype=cupy.float32) for x in arrays[:3]]
    kernels.local_patterns(*arrays, *grads, p["patterns"], False, p["scale"])
    assert all(max_rel(cupy.asnumpy(g), w) <= 1e-6 for g, w in zip(grads, want))
    grads = [cupy.zeros(x.shape, dtype=cupy.float32) for x in arrays[:3]]
    kernels.local_patterns(*(int(x.data.ptr) for x in (*arrays, *grads)), p["patterns"], False, p["scale"],
                           shape=arrays[0].shape)
    assert all(max_rel(cupy.asnumpy(g), w) <= 1e-6 for g, w in zip(grads, want))


def tensor_map_configurations() -> list:
    """(head dim, configuration) of every wgmma16_bwd configuration that reads tensor maps: dQ added by TMA
    reduce-add (DQ = 1), Q and dO loaded by TMA (LOAD = 1), dK and dV added by TMA reduce-add (DKV = 1)."""
    fam = registry.WGMMA16_BWD
    return [(d, c) for d in fam.head_dims for c in fam.configurations(d)
            if fam.variant(d, "bfloat16", c).tensor_maps]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,config", tensor_map_configurations())
def test_tensor_map_kernels_match_float64_and_the_cp_async_atomic_kernel(head_dim, config, causal):
    """wgmma16_bwd with dQ added through its shared tile by TMA reduce-add (DQ = 1), Q and dO loaded by TMA into
    swizzled tiles (LOAD = 1), dK and dV added from shared tiles by TMA reduce-add (DKV = 1): within the 16-bit
    tolerance of float64 on ragged overlapping patterns, also cut into one key block per launch (every tile's rows
    through the tensor maps, rows past mq or mk zero-filled or dropped); dK and dV bit for bit those of the same
    kernel with cp.async loads, atomic dQ and read-add-write dK, dV (the same sums in the same order, launch after
    launch), dQ within float32 rounding of it."""
    skip_unless_runs("bfloat16", "wgmma16_bwd", head_dim)
    p = problem("bfloat16", head_dim, causal, seed=5)
    fam = registry.WGMMA16_BWD
    atomic = choose_backward("bfloat16", head_dim, override="wgmma16_bwd:" + ",".join(map(str, (*config[:3], 0, 0, 0, 64))))
    by_tma = choose_backward("bfloat16", head_dim, override="wgmma16_bwd:" + ",".join(map(str, config)))
    assert by_tma.variant.tensor_maps and not atomic.variant.tensor_maps and fam.name == by_tma.name
    want = run(BackwardKernels(atomic), p)
    for kernels in (BackwardKernels(by_tma), BackwardKernels(by_tma, max_key_blocks=1)):
        got = run(kernels, p)
        for name, g, w in zip(("dq", "dk", "dv"), got, p["want"]):
            assert np.isfinite(g).all() and max_rel(g, w) <= TOLERANCE["bfloat16"], (name, max_rel(g, w))
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
        assert max_rel(got[0], want[0]) <= 1e-6


def wgmma16_bwd_configurations() -> list:
    """(head dim, configuration) of every wgmma16_bwd configuration."""
    fam = registry.WGMMA16_BWD
    return [(d, c) for d in fam.head_dims for c in fam.configurations(d)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,config", wgmma16_bwd_configurations())
def test_fresh_launches_store_the_gradients_the_added_ones_give(head_dim, config, causal):
    """fresh_kv with dK and dV full of NaN: the first pattern (dilation 1, every row) stores its terms, in one
    launch and in one key block per launch, and the gradients are bit for bit those added into zeros (dQ within
    float32 rounding: its additions are unordered); a first pattern that misses rows leaves dK and dV zeroed
    first, with the same result."""
    skip_unless_runs("bfloat16", "wgmma16_bwd", head_dim)
    choice = choose_backward("bfloat16", head_dim, override="wgmma16_bwd:" + ",".join(map(str, config)))
    for patterns in (PATTERNS, PATTERNS[1:] + PATTERNS[:1]):
        p = problem("bfloat16", head_dim, causal, patterns=patterns, seed=7)
        for kernels in (BackwardKernels(choice), BackwardKernels(choice, max_key_blocks=1)):
            added, stored = run(kernels, p), run(kernels, p, fresh=True)
            assert np.isfinite(stored[1]).all() and np.isfinite(stored[2]).all()
            assert np.array_equal(stored[1], added[1]) and np.array_equal(stored[2], added[2])
            assert max_rel(stored[0], added[0]) <= 1e-6
            assert max_rel(stored[1], p["want"][1]) <= TOLERANCE["bfloat16"]


def persistent_configurations() -> list:
    """(head dim, configuration) of every wgmma16_bwd configuration whose blocks can work through several items."""
    fam = registry.WGMMA16_BWD
    return [(d, c) for d, c in wgmma16_bwd_configurations() if fam.variant(d, "bfloat16", c).persistent]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,config", persistent_configurations())
def test_persistent_grids_give_the_gradients_of_a_block_an_item(head_dim, config, causal, monkeypatch):
    """Three blocks working through every item of a launch (K and V staged item after item by a producer warp,
    the pipeline's stages, dS^T buffers and dQ tiles carried from item to item), also with fresh dK and dV and one
    key block per launch: dK and dV bit for bit those of a block an item, dQ within float32 rounding (its
    additions are unordered), within the 16-bit tolerance of float64."""
    skip_unless_runs("bfloat16", "wgmma16_bwd", head_dim)
    from hilbert_hpc.kernels import backward

    choice = choose_backward("bfloat16", head_dim, override="wgmma16_bwd:" + ",".join(map(str, config)))
    p = problem("bfloat16", head_dim, causal, seed=11)
    for fresh in (False, True):
        for chunks in (backward.MAX_GRID_Y, 1):
            monkeypatch.setenv(backward.PERSISTENT_ENV, "0")
            one = run(BackwardKernels(choice, max_key_blocks=chunks), p, fresh=fresh)
            monkeypatch.setenv(backward.PERSISTENT_ENV, "1")
            few = run(BackwardKernels(choice, max_key_blocks=chunks, max_blocks=3), p, fresh=fresh)
            assert np.array_equal(few[1], one[1]) and np.array_equal(few[2], one[2])
            assert max_rel(few[0], one[0]) <= 1e-6
            for name, g, w in zip(("dq", "dk", "dv"), few, p["want"]):
                assert np.isfinite(g).all() and max_rel(g, w) <= TOLERANCE["bfloat16"], (name, max_rel(g, w))


@pytest.mark.parametrize("dtype,head_dim", [("float32", 64), ("float32", 36), ("bfloat16", 128), ("bfloat16", 20),
                                            ("float16", 96), ("float16", 12)])
def test_row_dot_kernel_is_the_float32_rowsum(dtype, head_dim):
    """rowsum(dO * O) by the row_dot kernel (16-byte loads, or one element a load for rows of other sizes) on
    torch tensors and on CuPy raw bits: within float32 rounding of the float64 sum of the rounded values, and
    the same bits every run."""
    import cupy

    from hilbert_hpc.kernels.backward import row_dot

    gen = torch.Generator(device="cuda").manual_seed(7)
    a, b = (torch.randn((1001, 3, head_dim), generator=gen, device="cuda").to(TORCH_DTYPES[dtype]) for _ in range(2))
    want = (a.double() * b.double()).sum(-1)
    got = row_dot(a, b)
    assert got.dtype == torch.float32 and got.shape == (1001, 3) and got.is_cuda
    assert float((got.double() - want).abs().max() / want.abs().max()) <= 1e-6
    assert torch.equal(row_dot(a, b), got)
    if dtype != "float32":
        bits = [cupy.asarray(x.view(torch.int16).cpu().numpy()) for x in (a, b)]
        assert np.array_equal(cupy.asnumpy(row_dot(*bits, dtype)), got.cpu().numpy())
