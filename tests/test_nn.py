"""hilbert_hpc.nn: dilated attention differentiable by torch autograd (CPU tensors), its module and custom ops."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dense_reference import dense_dilated_attention_torch   # noqa: E402
from hilbert_hpc import ConfigError, serialization_order   # noqa: E402
from hilbert_hpc import dilated_attention as numpy_attention   # noqa: E402
from hilbert_hpc import nn as hnn   # noqa: E402

#: small problems for gradcheck: (grid, heads, head_dim, patterns, causal, ordering, batch)
GRADCHECK = [
    ((16,), 2, 3, [(8, 1), (16, 2)], False, "natural", None),
    ((4, 4), 3, 3, [(8, 2), (8, 2), (16, 4)], True, "hilbert", 2),        # one pattern twice: keys counted twice
    ((2, 4, 4), 2, 6, [(16, 1), (32, 4)], False, "hilbert", None),
    ((4, 8), 2, 3, [(8, 1), (32, 8)], True, "hilbert-segment", None),    # dilation 8 > heads: unselected rows
    ((24,), 3, 5, [(12, 3), (24, 1)], True, "natural", 1),
]


def make(shape, seed: int, dtype=torch.float64, grad: bool = True):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def call(case, q, k, v):
    grid, _, _, patterns, causal, ordering, _ = case
    return hnn.dilated_attention(q, k, v, patterns=patterns, causal=causal, grid=grid, ordering=ordering)


def shape_of(case):
    grid, heads, d, _, _, _, batch = case
    return (math.prod(grid), heads, d) if batch is None else (batch, math.prod(grid), heads, d)


@pytest.mark.parametrize("case", GRADCHECK)
def test_gradcheck(case):
    q, k, v = make(shape_of(case), seed=1)
    assert torch.autograd.gradcheck(lambda a, b, c: call(case, a, b, c), (q, k, v))


def reference(case, q, k, v):
    """The dense float64 reference in natural order (each batch entry on its own)."""
    grid, _, _, patterns, causal, ordering, batch = case
    seg = min(w for w, _ in patterns) if ordering == "hilbert-segment" else None
    perm = serialization_order(grid, ordering, segment=seg)
    if batch is None:
        return dense_dilated_attention_torch(q, k, v, patterns, causal, perm)
    return torch.stack([dense_dilated_attention_torch(q[i], k[i], v[i], patterns, causal, perm) for i in range(batch)])


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("case", GRADCHECK[1:4])
def test_gradients_match_the_dense_reference(case, dtype, tol):
    q, k, v = make(shape_of(case), seed=2, dtype=dtype)
    out = call(case, q, k, v)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    got = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want_out = reference(case, q64, k64, v64)
    want = torch.autograd.grad(want_out, (q64, k64, v64), dout.double())
    assert out.dtype == dtype and all(g.dtype == dtype for g in got)
    assert (out.double() - want_out).norm() / want_out.norm() <= tol
    for name, g, w in zip("qkv", got, want):
        assert (g.double() - w).norm() / w.norm() <= tol, name


def test_output_equals_the_numpy_api():
    case = GRADCHECK[1]
    q, k, v = make(shape_of(case), seed=4, grad=False)
    grid, _, _, patterns, causal, ordering, _ = case
    want = numpy_attention(q.numpy(), k.numpy(), v.numpy(), patterns=patterns, causal=causal, grid=grid,
                           ordering=ordering)
    assert np.array_equal(call(case, q, k, v).numpy(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_compute_in_float32_and_cast_back(dtype):
    case = GRADCHECK[0]
    q, k, v = make(shape_of(case), seed=5, dtype=dtype)
    out = call(case, q, k, v)
    out.sum().backward()
    assert out.dtype == dtype and q.grad.dtype == dtype and k.grad.dtype == dtype and v.grad.dtype == dtype
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    out32 = call(case, q32, k32, v32)
    out32.sum().backward()
    assert torch.equal(out, out32.to(dtype))
    assert torch.allclose(q.grad.float(), q32.grad, rtol=2e-2, atol=2e-2)


def test_the_module_is_the_function():
    case = GRADCHECK[1]
    grid, _, _, patterns, causal, ordering, _ = case
    module = hnn.DilatedAttention(patterns=patterns, causal=causal, grid=grid, ordering=ordering)
    q, k, v = make(shape_of(case), seed=6)
    assert torch.equal(module(q, k, v), call(case, q, k, v))
    assert torch.autograd.gradcheck(module, (q, k, v), fast_mode=True)
    assert "patterns=[(8,2), (8,2), (16,4)]" in repr(module)


def test_the_module_checks_patterns_and_ordering_when_built():
    with pytest.raises(ConfigError, match="dilation 3 does not divide segment length 8"):
        hnn.DilatedAttention(patterns=[(8, 3)])
    with pytest.raises(ConfigError, match="unknown ordering"):
        hnn.DilatedAttention(patterns=[(8, 1)], ordering="zigzag")


def refusal(fn, *args, **kwargs) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.type, str(info.value)


@pytest.mark.parametrize("bad", [
    dict(q=(16, 2)), dict(k=(16, 2, 5)), dict(v=(8, 2, 4)), dict(q=(16, 2, 0)), dict(causal=1), dict(scale=-1.0),
    dict(patterns=[(16, 3)]), dict(patterns=[(32, 1)]), dict(grid=(3, 5)), dict(ordering="zigzag"),
])
def test_misuse_is_refused_as_the_numpy_api_refuses_it(bad):
    shapes = dict(q=(16, 2, 4), k=(16, 2, 4), v=(16, 2, 4))
    shapes.update({n: bad[n] for n in "qkv" if n in bad})
    args = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
    kwargs = dict(patterns=[(8, 1)], causal=False, scale=None, grid=None, ordering="natural")
    kwargs.update({n: x for n, x in bad.items() if n not in "qkv"})
    got = refusal(hnn.dilated_attention, **args, **kwargs)
    assert got == refusal(numpy_attention, **{n: x.numpy() for n, x in args.items()}, **kwargs)
    assert got[0] in (TypeError, ValueError, ConfigError)


def test_arrays_and_mixed_inputs_are_type_errors():
    q, k, v = make((16, 2, 4), seed=7, grad=False)
    with pytest.raises(TypeError, match="q: expected a torch tensor, got numpy.ndarray"):
        hnn.dilated_attention(q.numpy(), k.numpy(), v.numpy(), patterns=[(8, 1)])
    with pytest.raises(TypeError, match="k: is a numpy.ndarray, but q, v are torch tensors"):
        hnn.dilated_attention(q, k.numpy(), v, patterns=[(8, 1)])


def test_tensors_off_the_cpu_and_cuda_are_refused_without_a_copy():
    q, k, v = (torch.empty((16, 2, 4), device="meta") for _ in range(3))
    with pytest.raises(NotImplementedError, match="q: is on meta; hilbert_hpc.nn computes on CPU and CUDA tensors"):
        hnn.dilated_attention(q, k, v, patterns=[(8, 1)])


def test_the_custom_ops_pass_opcheck():
    q, k, v = make((2, 16, 2, 3), seed=8)
    torch.library.opcheck(torch.ops.hilbert_hpc.dilated_forward.default, (q, k, v, [8, 16], [1, 2], True, 0.5))
    out, lse = torch.ops.hilbert_hpc.dilated_forward(q, k, v, [8, 16], [1, 2], True, 0.5)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.hilbert_hpc.dilated_backward.default,
                          (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout, [8, 16], [1, 2],
                           True, 0.5))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_keeps_one_graph(backend):
    """fullgraph=True: a graph break is an error; recompiles for new shapes keep the results exact."""
    module = hnn.DilatedAttention(patterns=[(8, 1), (16, 2)], causal=True, ordering="hilbert-segment")
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    for shape in ((16, 3, 4), (2, 32, 3, 4), (3, 32, 3, 4)):
        q, k, v = make(shape, seed=9)
        try:
            got = compiled(q, k, v)
        except torch._dynamo.exc.BackendCompilerFailed as exc:    # e.g. inductor without a C++ compiler
            pytest.skip(f"torch.compile backend {backend} cannot run here: {exc}")
        want = module(q, k, v)
        assert torch.equal(got, want)
        for g, w in zip(torch.autograd.grad(got.square().sum(), (q, k, v)),
                        torch.autograd.grad(want.square().sum(), (q, k, v))):
            assert torch.allclose(g, w, rtol=1e-12, atol=1e-12)


def test_import_hilbert_hpc_does_not_import_torch():
    code = "import sys, hilbert_hpc; assert 'torch' not in sys.modules and 'hilbert_hpc.nn' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_16_bit_backward_chunks_hold_whole_segments():
    from hilbert_hpc.backends.cuda_autograd import chunk_rows
    from hilbert_hpc.core.patterns import Pattern

    pats = [Pattern(2048, 1), Pattern(4096, 2), Pattern(8192, 4)]
    assert chunk_rows(262144, pats, 0.1) == 32768                   # 0.133 N = 34,952 rounded down to 8192s
    assert chunk_rows(262144, pats, 0.0) == 262144 and chunk_rows(262144, pats, 1.0) == 262144
    assert chunk_rows(262144, pats, 1e-9) == 8192                    # at least one lcm of the segments
    assert chunk_rows(24576, [Pattern(3072, 1), Pattern(8192, 2)], 0.5) == 24576   # lcm 24576: one chunk


def test_the_geometry_is_made_once_per_problem(monkeypatch):
    """A training loop calls dilated_attention with one problem many times: its serialization and index tensors
    are made on the first call only (a second problem makes its own); the arguments are checked on every call."""
    from hilbert_hpc import nn as hnn

    made = []
    real = hnn.problem_order
    monkeypatch.setattr(hnn, "problem_order", lambda *a: made.append(a) or real(*a))
    hnn._index_order.cache_clear()
    q = torch.randn(64, 2, 8)
    args = dict(patterns=[(16, 1), (64, 4)], grid=(8, 8), ordering="hilbert")
    first = [hnn.dilated_attention(q, q, q, **args) for _ in range(3)]
    assert len(made) == 1 and all(torch.equal(first[0], o) for o in first)
    hnn.dilated_attention(q, q, q, **dict(args, grid=[4, 16]))
    assert len(made) == 2
    hnn.dilated_attention(q, q, q, patterns=[(16, 1), (64, 4)], grid=(8, 8), ordering="natural")
    assert len(made) == 3
    with pytest.raises(ValueError):                                     # errors are raised every time
        hnn.dilated_attention(q, q, q, patterns=[(16, 3)])
    with pytest.raises(ValueError):
        hnn.dilated_attention(q, q, q, patterns=[(16, 3)])


def test_the_output_gradient_reaches_the_op_without_a_copy():
    """(N, H, D) inputs run as a batch of one: the output is the op's (1, N, H, D) output squeezed, so that the
    gradient the op's backward gets is a view of the caller's (select's backward would copy it into a zeroed
    tensor of the batched shape: one more tensor of the output's size at the backward's peak memory)."""
    q, k, v = (torch.randn((64, 2, 8), dtype=torch.float32, requires_grad=True) for _ in range(3))
    out = hnn.dilated_attention(q, k, v, patterns=[(16, 1), (32, 2)])
    seen = []
    op_node = out.grad_fn.next_functions[0][0]                      # the op's backward, after the squeeze's
    op_node.register_prehook(lambda grads: seen.append(grads[0]))
    dout = torch.randn_like(out)
    out.backward(dout)
    assert seen[0].shape == (1, *out.shape) and seen[0].data_ptr() == dout.data_ptr()
    assert q.grad is not None and torch.isfinite(q.grad).all()
