"""The float32 path's error budget (docs/semantics.md section 9, ``precision.float32_error_budget``): the output
and gradients of ``hilbert_hpc.nn`` on float32 tensors against the float64 computation of the same float32
inputs, max |err| / max |ref|, on random inputs and on adversarial ones (scores up to ~100, one segment of
thousands of keys), causal and not: on the CPU, and on a GPU's float32 kernels (split-TF32 forward and backward)
where one runs them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hilbert_hpc import nn as hnn  # noqa: E402
from hilbert_hpc.core.precision import float32_error_budget  # noqa: E402

#: name -> (N, H, D, patterns, factor of Q and K); tests/scripts/fp32_error_budget.py prints the same cases' errors
CASES = {
    "random": (4096, 4, 64, [(512, 1), (1024, 2), (4096, 4)], 1.0),
    "large-scores": (2048, 2, 64, [(1024, 1), (2048, 2)], 4.0),       # scores up to ~94
    "long-segment": (8192, 1, 128, [(8192, 1)], 1.0),                 # 8,192 keys a query
}


def errors(device: str, n: int, heads: int, d: int, patterns: list, factor: float,
           causal: bool) -> tuple[dict, float]:
    """(max |err| / max |ref| of the output and the three gradients on ``device`` in float32 against float64 on
    the CPU, the largest |score| of any pair): the inputs are float32 values, so both see the same numbers."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, dout = (torch.randn((n, heads, d), generator=gen, dtype=torch.float64) for _ in range(4))
    exact = [x.float().double() for x in (q * factor, k * factor, v, dout)]
    largest = max(float((exact[0][:, h] @ exact[1][:, h].T).abs().max()) for h in range(heads)) * d ** -0.5
    results = {}
    for where, dtype in ((device, torch.float32), ("cpu", torch.float64)):
        xs = [x.to(where, dtype).requires_grad_(True) for x in exact[:3]]
        out = hnn.dilated_attention(*xs, patterns=patterns, causal=causal)
        out.backward(exact[3].to(where, dtype))
        results[dtype] = [t.detach().double().cpu() for t in (out, *(x.grad for x in xs))]
    names = ("output", "dq", "dk", "dv")
    return ({name: float((g - w).abs().max() / w.abs().max())
             for name, g, w in zip(names, results[torch.float32], results[torch.float64])}, largest)


def over_budget(got: dict, largest: float) -> dict:
    """The errors of ``got`` above the budget of scores up to ``largest``."""
    budget = float32_error_budget(largest)
    return {name: (err, budget[name]) for name, err in got.items() if not err <= budget[name]}


def test_the_budget_grows_with_the_largest_score_and_the_check_can_fail():
    """The budget is 1e-6 (output) / 2e-6 (gradients) plus two float32 roundings of the largest score; an error of
    a bfloat16 output (2^-9 relative steps) is far over it, so the check can fail."""
    assert float32_error_budget(0.0) == {"output": 1e-6, "dq": 2e-6, "dk": 2e-6, "dv": 2e-6}
    b = float32_error_budget(-100.0)
    assert b["output"] == pytest.approx(1e-6 + 200 * 2.0 ** -24) and b["dk"] == pytest.approx(2e-6 + 200 * 2.0 ** -24)
    assert over_budget({"output": 2.0 ** -9, "dq": 1e-7, "dk": 1e-7, "dv": 1e-7}, 6.0).keys() == {"output"}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_errors_on_the_cpu_are_within_the_budget(case, causal):
    got, largest = errors("cpu", *CASES[case], causal)
    assert not over_budget(got, largest), (got, largest)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for torch")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_errors_of_the_gpu_kernels_are_within_the_budget(case, causal):
    pytest.importorskip("cupy")
    got, largest = errors("cuda", *CASES[case], causal)
    assert not over_budget(got, largest), (got, largest)
