"""The float32 path's errors on one GPU against float64, on random and adversarial inputs (issue 39's budget).

For each case of tests/test_float32_error_budget.py, causal and not: the output and the gradients of
``hilbert_hpc.nn.dilated_attention`` on float32 CUDA tensors (or ``--device cpu``) against the float64 CPU
computation of the same (float32) inputs, as max |err| / max |ref|, beside the largest |score| of the case and
u max |score| (u = 2^-24, the unit roundoff of float32: a score rounded to float32 carries an absolute error up to
u |s|, which the exponential turns into a relative error of the probability) and the budget
(``precision.float32_error_budget``: 1e-6 / 2e-6 plus 2 u max |score|). Prints one line per case; exits 1 where an
error exceeds the budget (the test asserts the same).

    python tests/scripts/fp32_error_budget.py [--device cpu] [--case random] [--case large-scores] [--case long-segment]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_hpc.core.precision import FLOAT32_UNIT_ROUNDOFF, float32_error_budget  # noqa: E402
from test_float32_error_budget import CASES, errors  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases (default: all)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the float32 path runs")
    args = parser.parse_args()
    over = 0
    for case in args.case or list(CASES):
        for causal in (False, True):
            got, largest = errors(args.device, *CASES[case], causal)
            budget = float32_error_budget(largest)
            bad = [k for k in got if not got[k] <= budget[k]]
            over += bool(bad)
            print(f"{case:13s} {'causal' if causal else 'full  '} max|s| {largest:6.1f} (u max|s| "
                  f"{FLOAT32_UNIT_ROUNDOFF * largest:.1e}): "
                  + " ".join(f"{k} {v:.2e} (budget {budget[k]:.1e})" for k, v in got.items())
                  + (f"  over the budget: {', '.join(bad)}" if bad else ""), flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
