"""The float32 path's errors on one GPU against float64, on random and adversarial inputs (issue 39's budget).

For each case, causal and not: the output and the gradients of ``hilbert_hpc.nn.dilated_attention`` on float32
CUDA tensors against the float64 CPU computation of the same (float32) inputs, as max |err| / max |ref|, beside
the largest |score| of the case and u max |score| (u = 2^-24, the unit roundoff of float32: a score rounded to
float32 carries an absolute error up to u |s|, which the exponential turns into a relative error of the
probability). Prints one line per case; exits 1 where an error exceeds the budget (output 1e-6, gradients 2e-6).

    python tests/scripts/fp32_error_budget.py [--case random] [--case large-scores] [--case long-segment]
"""

from __future__ import annotations

import argparse
import sys

import torch

from hilbert_hpc import nn as hnn

#: max |err| / max |ref| of the float32 output and of each gradient
BUDGET = {"output": 1e-6, "dq": 2e-6, "dk": 2e-6, "dv": 2e-6}
#: name -> (N, H, D, patterns, factor of Q and K)
CASES = {
    "random": (4096, 4, 64, [(512, 1), (1024, 2), (4096, 4)], 1.0),
    "large-scores": (2048, 2, 64, [(1024, 1), (2048, 2)], 4.0),
    "long-segment": (8192, 1, 128, [(8192, 1)], 1.0),
}
UNIT_ROUNDOFF = 2.0 ** -24


def errors(case: str, causal: bool) -> tuple[dict, float]:
    """(max |err| / max |ref| of the output and the gradients, the largest |score|) of ``case``."""
    n, heads, d, patterns, factor = CASES[case]
    gen = torch.Generator().manual_seed(11)
    q, k, v, dout = (torch.randn((n, heads, d), generator=gen, dtype=torch.float64) for _ in range(4))
    exact = [x.float().double() for x in (q * factor, k * factor, v, dout)]   # the float32 inputs, exactly
    largest = float(max((exact[0][:, h] @ exact[1][:, h].T).abs().max() for h in range(heads))) * d ** -0.5
    results = {}
    for device, dtype in (("cuda", torch.float32), ("cpu", torch.float64)):
        xs = [x.to(device, dtype).requires_grad_(True) for x in exact[:3]]
        out = hnn.dilated_attention(*xs, patterns=patterns, causal=causal)
        out.backward(exact[3].to(device, dtype))
        results[device] = [t.detach().double().cpu() for t in (out, *(x.grad for x in xs))]
    return ({name: float((g - w).abs().max() / w.abs().max())
             for name, g, w in zip(BUDGET, results["cuda"], results["cpu"])}, largest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: all)")
    args = parser.parse_args()
    over = 0
    for case in args.case or list(CASES):
        for causal in (False, True):
            got, largest = errors(case, causal)
            bad = [k for k in BUDGET if got[k] > BUDGET[k]]
            over += bool(bad)
            print(f"{case:13s} {'causal' if causal else 'full  '} max|s| {largest:6.1f} (u max|s| "
                  f"{UNIT_ROUNDOFF * largest:.1e}): " + " ".join(f"{k} {v:.2e}" for k, v in got.items())
                  + (f"  over the budget: {', '.join(bad)}" if bad else ""), flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
