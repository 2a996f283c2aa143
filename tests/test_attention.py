"""Dilated attention (NumPy backend and the PyTorch peer) against the float64 dense reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import random_config, random_qkv, rel_err
from dense_reference import dense_dilated_attention
from hilbert_hpc import ConfigError, dilated_attention, serialization_order
from hilbert_hpc.core.inputs import random_qkv as counter_qkv
from hilbert_hpc.core.reference import reference_rows

BACKENDS = ["numpy", "torch"]


def run(cfg, q, k, v, backend):
    return dilated_attention(q, k, v, patterns=cfg["patterns"], causal=cfg["causal"], grid=cfg["grid"],
                             ordering=cfg["ordering"], backend=backend)


def reference(cfg, q, k, v):
    perm = serialization_order(cfg["grid"], cfg["ordering"])
    return dense_dilated_attention(q, k, v, cfg["patterns"], cfg["causal"], perm)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(16))
def test_float64_matches_dense_reference(seed, backend):
    cfg = random_config(seed)
    q, k, v = random_qkv(cfg, seed)
    out = run(cfg, q, k, v, backend)
    assert out.dtype == np.float64
    assert rel_err(out, reference(cfg, q, k, v)) < 1e-12, cfg


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(100, 112))
def test_float32_matches_dense_reference(seed, backend):
    cfg = random_config(seed)
    q, k, v = random_qkv(cfg, seed, dtype=np.float32)
    out = run(cfg, q, k, v, backend)
    assert out.dtype == np.float32
    assert rel_err(out, reference(cfg, q, k, v)) < 1e-5, cfg


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_one_global_pattern_is_full_softmax_attention(backend, causal):
    rng = np.random.default_rng(7)
    n, h, d = 256, 3, 32
    q, k, v = (rng.standard_normal((n, h, d)) for _ in range(3))
    out = dilated_attention(q, k, v, patterns=[(n, 1)], causal=causal, backend=backend)
    scores = np.einsum("nhd,mhd->hnm", q, k) / math.sqrt(d)
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("hnm,mhd->nhd", p / p.sum(-1, keepdims=True), v)
    assert rel_err(out, expected) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_unselected_positions_are_zero_and_batches_independent(backend):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 64, 1, 8)) for _ in range(3))
    out = dilated_attention(q, k, v, patterns=[(16, 2)], backend=backend)
    assert out.shape == (2, 64, 1, 8)
    assert np.all(out[:, 1::2] == 0) and np.all(out[:, 0::2] != 0)
    single = dilated_attention(q[1], k[1], v[1], patterns=[(16, 2)], backend=backend)
    np.testing.assert_array_equal(out[1], single)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_magnitude_inputs_give_no_nan(backend):
    cfg = random_config(5)
    q, k, v = random_qkv(cfg, 5, dtype=np.float32, magnitude=300.0)
    out = run(cfg, q, k, v, backend)
    assert np.all(np.isfinite(out))
    # scores reach ~3e5: their float32 rounding (~2e-2 absolute) bounds the attainable accuracy
    assert rel_err(out, reference(cfg, q, k, v)) < 1e-2


def test_backends_agree_in_float32():
    cfg = random_config(42)
    q, k, v = random_qkv(cfg, 42, dtype=np.float32)
    assert rel_err(run(cfg, q, k, v, "numpy"), run(cfg, q, k, v, "torch")) < 1e-5


def test_natural_order_with_grid_equals_flat_sequence():
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((384, 2, 16)) for _ in range(3))
    flat = dilated_attention(q, k, v, patterns=[(96, 2)])
    gridded = dilated_attention(q, k, v, patterns=[(96, 2)], grid=(16, 24), ordering="natural")
    np.testing.assert_array_equal(flat, gridded)


def test_hilbert_order_changes_the_result_on_a_grid():
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((256, 2, 16)) for _ in range(3))
    nat = dilated_attention(q, k, v, patterns=[(64, 1)], grid=(16, 16))
    hil = dilated_attention(q, k, v, patterns=[(64, 1)], grid=(16, 16), ordering="hilbert")
    assert rel_err(hil, nat) > 1e-3


@pytest.mark.parametrize("seed", range(6))
def test_sampled_row_reference_matches_dense(seed):
    cfg = random_config(seed + 50)
    q, k, v = random_qkv(cfg, seed)
    perm = serialization_order(cfg["grid"], cfg["ordering"])
    inv = np.argsort(perm)
    rows = np.random.default_rng(seed).choice(len(perm), 17, replace=False)
    arrays = {"q": q, "k": k, "v": v}
    got = reference_rows(rows, source=lambda name, idx: arrays[name][idx], perm=perm, inverse=inv,
                         heads=cfg["heads"], patterns=[type("P", (), {"segment": w, "dilation": r, "selected": w // r})
                                                       for w, r in cfg["patterns"]],
                         causal=cfg["causal"], scale=1 / math.sqrt(cfg["head_dim"]))
    assert rel_err(got, reference(cfg, q, k, v)[rows]) < 1e-12


def test_counter_based_inputs_depend_only_on_position():
    full = counter_qkv(9, np.arange(1000), 4, 16, np.float64)
    part = counter_qkv(9, np.array([999, 3, 500]), 4, 16, np.float64)
    for a, b in zip(full, part):
        np.testing.assert_array_equal(a[[999, 3, 500]], b)
    other = counter_qkv(10, np.arange(1000), 4, 16, np.float64)
    assert not np.allclose(full[0], other[0])
    assert not np.allclose(full[0], full[1])
    z = full[0].ravel()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02


@pytest.mark.parametrize("kwargs, param", [
    (dict(patterns=[(100, 1)]), "patterns[0]"),
    (dict(patterns=[(64, 3)]), "patterns[0]"),
    (dict(patterns=[]), "patterns"),
    (dict(patterns=[(64, 1)], grid=(10, 10)), "grid"),
    (dict(patterns=[(64, 1)], ordering="zorder"), "ordering"),
    (dict(patterns=[(64, 1)], backend="fortran"), "backend"),
])
def test_invalid_problems_name_the_parameter(kwargs, param):
    q = np.zeros((256, 2, 8))
    with pytest.raises(ConfigError) as info:
        dilated_attention(q, q, q, **kwargs)
    assert info.value.param == param


# --- API misuse: a TypeError or ValueError naming the argument, before any work -------------------------------------

def _qkv(d: int = 8, dtype=np.float32):
    rng = np.random.default_rng(3)
    return [rng.standard_normal((64, 2, d)).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("change, error, words", [
    (lambda a: {**a, "q": a["q"][..., :0], "k": a["k"][..., :0]}, ValueError, "q has shape (64, 2, 0)"),
    (lambda a: {**a, "v": a["v"][..., :0]}, ValueError, "v has shape (64, 2, 0)"),
    (lambda a: {**a, "q": a["q"].astype(np.complex64)}, TypeError, "q: has complex dtype"),
    (lambda a: {**a, "k": a["k"] > 0}, TypeError, "k: has boolean dtype"),
    (lambda a: {**a, "scale": 0}, ValueError, "scale: expected a finite number > 0"),
    (lambda a: {**a, "scale": -0.5}, ValueError, "scale: expected a finite number > 0"),
    (lambda a: {**a, "scale": float("nan")}, ValueError, "scale: expected a finite number > 0"),
    (lambda a: {**a, "scale": float("inf")}, ValueError, "scale: expected a finite number > 0"),
    (lambda a: {**a, "scale": "0.1"}, TypeError, "scale: expected a number or None"),
    (lambda a: {**a, "causal": "yes"}, TypeError, "causal: expected True or False, got 'yes'"),
    (lambda a: {**a, "causal": 1}, TypeError, "causal: expected True or False"),
])
def test_api_misuse_names_the_argument(change, error, words):
    q, k, v = _qkv()
    args = change({"q": q, "k": k, "v": v, "patterns": [(16, 1)]})
    with pytest.raises(error) as info:
        dilated_attention(**args)
    assert words in str(info.value)


@pytest.mark.parametrize("tensor", ["q", "k", "v"])
def test_a_torch_tensor_mixed_with_numpy_arrays_is_a_typeerror(tensor):
    torch = pytest.importorskip("torch")
    args = dict(zip("qkv", _qkv()))
    args[tensor] = torch.from_numpy(args[tensor])
    with pytest.raises(TypeError) as info:
        dilated_attention(**args, patterns=[(16, 1)], backend="torch")
    message = str(info.value)
    assert message.startswith(next(n for n in "qkv" if n != tensor) + ": is a numpy.ndarray, but ")
    assert "same kind" in message


def test_boolean_tensors_are_refused_and_16_bit_tensors_accepted():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in _qkv())
    with pytest.raises(TypeError, match="q: has boolean dtype"):
        dilated_attention(q > 0, k, v, patterns=[(16, 1)], backend="torch")
    out = dilated_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), patterns=[(16, 1)], backend="torch")
    ref = dilated_attention(*(x.bfloat16().float() for x in (q, k, v)), patterns=[(16, 1)], backend="torch")
    assert torch.equal(out, ref)
