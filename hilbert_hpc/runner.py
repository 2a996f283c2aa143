"""Runs the cases of a job: inputs, timed repeats by phase, accuracy, results file, summary table."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .backends import get_backend
from .inputs import random_rows
from .jobfile import Case, Job
from .ordering import inverse_order
from .attention import problem_order
from .patterns import useful_flops
from .provenance import provenance
from .reference import reference_rows
from .results import ResultsFile
from .table import SummaryTable

PHASES = ("serialize", "attention", "unserialize", "total")

UNITS = {"tokens_per_s": "1/s", "attention_tokens_per_s": "1/s", "useful_tflops": "TFLOP/s",
         "useful_flops": "FLOP", "median_attention_s": "s", "median_total_s": "s"}


def case_inputs(case: Case, seed: int, batch_index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V of one batch element in natural order (counter-based, see inputs.py)."""
    positions = batch_index * case.tokens + np.arange(case.tokens)
    return tuple(random_rows(seed, t, positions, case.heads, case.head_dim, case.dtype) for t in ("q", "k", "v"))


def measure_accuracy(case: Case, seed: int, rows: int, output: np.ndarray, perm: np.ndarray,
                     inverse: np.ndarray) -> dict[str, float]:
    """Compare sampled output rows of batch element 0 with the float64 reference."""
    if rows == 0:
        return {"rows": 0, "max_abs_err": np.nan, "max_rel_err": np.nan, "rel_l2_err": np.nan}
    picked = np.sort(np.random.default_rng(seed).choice(case.tokens, min(rows, case.tokens), replace=False))

    def source(name: str, idx: np.ndarray) -> np.ndarray:
        return random_rows(seed, name, idx, case.heads, case.head_dim, case.dtype).astype(np.float64)

    ref = reference_rows(picked, source=source, perm=perm, inverse=inverse, heads=case.heads,
                         patterns=case.patterns, causal=case.causal, scale=case.softmax_scale)
    got = output[picked].astype(np.float64)
    diff = np.abs(got - ref)
    scale = max(float(np.abs(ref).max()), np.finfo(np.float64).tiny)
    return {"rows": len(picked), "max_abs_err": float(diff.max()), "max_rel_err": float(diff.max() / scale),
            "rel_l2_err": float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), np.finfo(float).tiny))}


def run_case(case: Case, job: Job) -> dict[str, Any]:
    """Run one case on this process: warm-up, timed repeats, accuracy; returns the record to store."""
    be = get_backend(case.backend)
    t0 = time.perf_counter()
    perm = np.asarray(problem_order(case.grid, case.ordering, case.segment))
    inverse = inverse_order(perm)
    order_s = time.perf_counter() - t0
    timings = {phase: [] for phase in PHASES}
    outputs = []
    inputs = [case_inputs(case, job.seed, b) for b in range(case.batch)]
    for rep in range(job.warmup + job.repeats):
        phase_s = dict.fromkeys(PHASES, 0.0)
        outputs = []
        for q, k, v in inputs:
            t0 = time.perf_counter()
            qs, ks, vs = (be.to_device(x[perm], case.dtype) for x in (q, k, v))
            be.synchronize()
            t1 = time.perf_counter()
            out_s = be.serialized_attention(qs, ks, vs, case.patterns, case.causal, case.softmax_scale)
            be.synchronize()
            t2 = time.perf_counter()
            outputs.append(be.to_numpy(out_s)[inverse])
            t3 = time.perf_counter()
            phase_s["serialize"] += t1 - t0
            phase_s["attention"] += t2 - t1
            phase_s["unserialize"] += t3 - t2
            phase_s["total"] += t3 - t0
        if rep >= job.warmup:
            for phase, value in phase_s.items():
                timings[phase].append(value)
    accuracy = measure_accuracy(case, job.seed, job.accuracy_rows, outputs[0], perm, inverse)
    flops = useful_flops(case.tokens, case.heads, case.head_dim, case.patterns, case.causal, case.batch)
    att = float(np.median(timings["attention"]))
    tot = float(np.median(timings["total"]))
    tokens = case.tokens * case.batch
    metrics = {"tokens_per_s": tokens / tot, "attention_tokens_per_s": tokens / att,
               "useful_tflops": flops / att / 1e12, "useful_flops": float(flops),
               "median_attention_s": att, "median_total_s": tot}
    return {
        "timings": {phase: np.asarray(values)[None, :] for phase, values in timings.items()},
        "metrics": metrics,
        "units": UNITS,
        "accuracy": accuracy,
        "attrs": {"ranks": 1, "order_s": order_s},
        "output": np.stack(outputs).astype(case.dtype) if job.save_output else None,
    }


def run_job(job: Job, output: str | None = None, stream: TextIO = sys.stdout) -> Path:
    """Run every case of ``job``, write the results file and print the summary table."""
    path = Path(output or job.output)
    table = SummaryTable(stream)
    results = ResultsFile(path, job, provenance())
    try:
        print(f"hilbert-hpc: job {job.name!r}, {len(job.cases)} case(s), results -> {path}", file=stream)
        table.header()
        for case in job.cases:
            record = run_case(case, job)
            results.write_case(case, record)
            table.row(case, record)
    finally:
        results.close()
    return path
