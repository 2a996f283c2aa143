"""Misuse of the Python APIs (``hilbert_hpc.dilated_attention`` on arrays, ``hilbert_hpc.nn`` on torch tensors):
each mistake is a ValueError or TypeError naming the argument, the same in both APIs and whatever came before."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hilbert_hpc import ConfigError, dilated_attention, serialization_order

APIS = ["numpy", "nn"]


def api(name: str):
    """The attention function of one API and the conversion of NumPy arrays to its inputs."""
    if name == "numpy":
        return dilated_attention, np.asarray
    torch = pytest.importorskip("torch")
    from hilbert_hpc import nn

    return nn.dilated_attention, torch.from_numpy


def arrays(*shape: int, dtype=np.float64, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def refusal(name: str, q, k, v, **kwargs) -> pytest.ExceptionInfo:
    fn, convert = api(name)
    with pytest.raises((TypeError, ValueError)) as info:
        fn(convert(q), convert(k), convert(v), **kwargs)
    return info


# --- shapes -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("unbatched", ["k", "v"])
def test_a_batched_q_with_an_unbatched_k_or_v_names_it(name, unbatched):
    q, k, v = arrays(2, 64, 2, 8)
    args = dict(q=q, k=k, v=v)
    args[unbatched] = args[unbatched][0]
    info = refusal(name, **args, patterns=[(16, 1)])
    assert info.type is ConfigError and info.value.param == unbatched
    assert str(info.value) == (f"{unbatched}: {unbatched} has shape (64, 2, 8), but q has shape (2, 64, 2, 8): q, k "
                               f"and v take one layout, all (N, H, D) or all (B, N, H, D)")


@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("shape, words", [((0, 64, 2, 8), "an empty batch (B = 0)"),
                                          ((0, 2, 8), "no tokens (N = 0)"),
                                          ((2, 0, 2, 8), "no tokens (N = 0)"),
                                          ((64, 0, 8), "no heads (H = 0)")])
def test_an_empty_batch_sequence_or_head_axis_names_q(name, shape, words):
    info = refusal(name, *arrays(*shape), patterns=[(16, 1)])
    assert info.type is ConfigError and info.value.param == "q"
    assert str(info.value) == f"q: q has shape {shape}, with {words}: it needs at least one"


@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("batched", [False, True])
def test_a_bhnd_layout_is_told_the_layout_it_is_read_in(name, batched):
    """(B, H, N, D) = (1, 8, 256, 16) read as (B, N, H, D): 8 tokens of 256 heads."""
    shape = (1, 8, 256, 16) if batched else (8, 256, 16)
    info = refusal(name, *arrays(*shape), patterns=[(256, 1)])
    assert info.type is ConfigError and info.value.param == "patterns[0]"
    layout, axes, swap = ("(B, N, H, D)", "axis 1", "(B, H, N, D)") if batched else ("(N, H, D)", "axis 0", "(H, N, D)")
    assert str(info.value) == (f"patterns[0]: segment length 256 does not divide the sequence length 8 (N, {axes} "
                               f"of q: q, k and v take the layout {layout}; for q, k, v laid out {swap}, swap their "
                               f"head and token axes)")


@pytest.mark.parametrize("name", APIS)
def test_a_sequence_the_segments_do_not_divide_names_the_layout_without_a_swap_hint(name):
    info = refusal(name, *arrays(96, 3, 8), patterns=[(64, 1)])
    assert str(info.value) == ("patterns[0]: segment length 64 does not divide the sequence length 96 (N, axis 0 of q: "
                               "q, k and v take the layout (N, H, D))")


# --- scale ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("scale", [10 ** 400, -10 ** 400], ids=["1e400", "-1e400"])
def test_a_scale_beyond_float_range_is_a_valueerror_naming_scale(name, scale):
    info = refusal(name, *arrays(64, 2, 8), patterns=[(16, 1)], scale=scale)
    assert info.type is ValueError
    assert str(info.value) == ("scale: expected a finite number > 0 (or None for 1/sqrt(D)), got an integer of "
                               "401 digits")


@pytest.mark.parametrize("name", APIS)
def test_an_integer_scale_is_the_float_scale(name):
    fn, convert = api(name)
    q, k, v = (convert(x) for x in arrays(64, 2, 8))
    assert np.array_equal(np.asarray(fn(q, k, v, patterns=[(16, 1)], scale=2)),
                          np.asarray(fn(q, k, v, patterns=[(16, 1)], scale=2.0)))


# --- segment of the hilbert-segment ordering --------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("segment, ordering, message", [
    (2.5, "hilbert-segment", "expected a positive integer, got 2.5"),
    (4.0, "hilbert-segment", "expected a positive integer, got 4.0"),
    (0, "hilbert-segment", "expected a positive integer, got 0"),
    (True, "hilbert-segment", "expected a positive integer, got True"),
    (24, "hilbert-segment", "segment 24 does not divide the sequence length 64"),
    (4, "natural", "only applies to ordering=\"hilbert-segment\", not \"natural\""),
    (4, "hilbert", "only applies to ordering=\"hilbert-segment\", not \"hilbert\""),
])
def test_a_segment_that_is_not_a_block_length_names_segment(name, segment, ordering, message):
    info = refusal(name, *arrays(64, 2, 8), patterns=[(16, 1)], ordering=ordering, segment=segment)
    assert info.type is ConfigError and info.value.param == "segment"
    assert info.value.message == message


def test_the_module_refuses_a_fractional_segment_when_built():
    nn = pytest.importorskip("hilbert_hpc.nn")
    with pytest.raises(ConfigError, match=r"^segment: expected a positive integer, got 2\.5$"):
        nn.DilatedAttention(patterns=[(16, 1)], ordering="hilbert-segment", segment=2.5)


@pytest.mark.parametrize("name", APIS)
def test_a_numpy_integer_segment_is_the_int_segment(name):
    fn, convert = api(name)
    q, k, v = (convert(x) for x in arrays(64, 2, 8))
    kwargs = dict(patterns=[(16, 1)], ordering="hilbert-segment")
    assert np.array_equal(np.asarray(fn(q, k, v, segment=np.int64(4), **kwargs)),
                          np.asarray(fn(q, k, v, segment=4, **kwargs)))


@pytest.mark.parametrize("grid, segment", [((8.5, 8), None), ((8.0, 8), None), ((True, 64), None), (64, 2.5)])
def test_serialization_order_refuses_what_it_would_truncate(grid, segment):
    with pytest.raises(ValueError, match="grid|segment"):
        serialization_order(grid, "hilbert-segment" if segment else "hilbert", segment=segment)


# --- answers do not depend on call history ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("valid, invalid, param", [
    (dict(patterns=[(32, 1)]), dict(patterns=[(32.0, 1)]), "patterns[0]"),
    (dict(patterns=[(32, 1)], grid=(8, 8)), dict(patterns=[(32, 1)], grid=(8.0, 8)), "grid"),
    (dict(patterns=[(32, 1)], ordering="hilbert-segment", segment=4),
     dict(patterns=[(32, 1)], ordering="hilbert-segment", segment=4.0), "segment"),
])
def test_a_refused_argument_is_refused_after_an_equal_valid_one(name, valid, invalid, param):
    fn, convert = api(name)
    q, k, v = (convert(x) for x in arrays(64, 2, 8))
    for before in (None, valid):
        if before is not None:
            fn(q, k, v, **before)
        with pytest.raises(ConfigError) as info:
            fn(q, k, v, **invalid)
        assert info.value.param == param


# --- dtypes -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
@pytest.mark.parametrize("odd", ["k", "v"])
def test_mixed_dtypes_are_a_typeerror_naming_both(name, odd):
    q, k, v = arrays(64, 2, 8, dtype=np.float32)
    args = dict(q=q, k=k, v=v)
    args[odd] = args[odd].astype(np.float64)
    info = refusal(name, **args, patterns=[(16, 1)])
    assert info.type is TypeError
    assert str(info.value) == (f"{odd}: has dtype float64, but q has float32: pass q, k and v in one dtype "
                               f"(convert them first, for example all to float32)")


def test_mixed_torch_dtypes_name_the_torch_dtypes():
    torch = pytest.importorskip("torch")
    from hilbert_hpc import nn

    q, k, v = (torch.from_numpy(x) for x in arrays(64, 2, 8))
    with pytest.raises(TypeError, match=r"^k: has dtype bfloat16, but q has float64: pass q, k and v in one dtype"):
        nn.dilated_attention(q, k.bfloat16(), v, patterns=[(16, 1)])


# --- the hilbert ordering of a 1-D sequence ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", APIS)
def test_hilbert_without_a_grid_warns_that_it_is_the_natural_order(name):
    fn, convert = api(name)
    q, k, v = (convert(x) for x in arrays(64, 2, 8))
    with pytest.warns(UserWarning) as record:
        out = fn(q, k, v, patterns=[(16, 1)], ordering="hilbert")
    assert len(record) == 1 and record[0].filename == __file__
    assert str(record[0].message) == ("grid: ordering=\"hilbert\" without a grid orders the 1-D grid (64,), whose "
                                      "Hilbert curve is the natural order; pass grid= the tokens' shape (for example "
                                      "(rows, columns)), or grid=(64,) to say that the natural order is meant")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explicit = fn(q, k, v, patterns=[(16, 1)], ordering="hilbert", grid=(64,))
        natural = fn(q, k, v, patterns=[(16, 1)])
    assert np.array_equal(np.asarray(out), np.asarray(explicit))
    assert np.array_equal(np.asarray(out), np.asarray(natural))
