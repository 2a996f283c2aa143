"""The memory model plan, run and the projection share (``study.memory.MemoryModel``): its totals are the ones the
plan code gave before it, for every case of every job file; its terms add up; the backends' memory descriptions."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from hilbert_hpc.backends import BACKENDS, base
from hilbert_hpc.backends.memory import RankShape
from hilbert_hpc.errors import JobFileError

from jobtext import QUICK, JobSpec

ROOT = Path(__file__).resolve().parents[1]
#: per "world size:job:case id": [memory per rank, without the gradient check, planned for an A100 (cc 8.0), the
#: Q/K/V/O floor, the forward+backward part (dO, gradients, delta, backward working memory, ring accumulators,
#: check), bytes sent, counted on a GPU for this machine, for GPU nodes]. Written by the plan code of commit
#: f9d6ac9 (``plan.estimate`` and ``plan.backward_bytes`` before the model) as :func:`plan_everywhere_alike` sets it;
#: after a deliberate change of a job file or of the model, rewrite it: ``python tests/test_memory_model.py``.
TOTALS = Path(__file__).with_name("memory_totals.json")
#: the world sizes the jobs are planned for (a job whose cases need more ranks is left out at the smaller one)
WORLD_SIZES = (8, 64)


def plan_everywhere_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same plan on any machine: no backend runs here (each case planned as on a login node, the kernels of
    the GPU nodes'), four cores, no kernel override."""
    monkeypatch.setattr(base, "gpu_unusable", lambda: "no device")
    for cls in BACKENDS.values():
        monkeypatch.setattr(cls, "usable", lambda self: "not planned here")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for name in ("HILBERT_HPC_HALF_KERNEL", "HILBERT_HPC_FP32_KERNEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def planned_everywhere(monkeypatch):
    """:func:`plan_everywhere_alike` for a test."""
    plan_everywhere_alike(monkeypatch)


def job_cases():
    """(key, job, case) of every case of every job file of jobs/ (max-length searches aside) on ``WORLD_SIZES``."""
    from hilbert_hpc.study.jobfile import load_job

    for path in sorted((ROOT / "jobs").glob("*.toml")):
        if "search" in tomllib.loads(path.read_text()):              # a maxlen search, not a job
            continue
        for world in WORLD_SIZES:
            try:
                job = load_job(path, world_size=world)
            except JobFileError:                                    # a case needs more ranks
                continue
            for case in job.cases:
                yield f"{world}:{path.stem}:{case.case_id}", job, case


def model_row(job, case) -> list[int]:
    """What :data:`TOTALS` holds for ``case``, from the memory model."""
    from hilbert_hpc.study.memory import MemoryModel
    from hilbert_hpc.study.plan import estimate
    from hilbert_hpc.study.setup import plan_setup

    setup = plan_setup(case)
    model = MemoryModel(setup, job.accuracy_rows)
    est = estimate(case, None, setup, job.accuracy_rows)
    assert est.memory_bytes == model.total() and est.floor_bytes == model.qkvo()
    terms = model.terms()
    backward = sum(terms[name] for name in ("dO", "dQ/dK/dV", "delta", "bwd work", "ring acc", "check"))
    return [model.total(), MemoryModel(setup, 0).total(), MemoryModel(plan_setup(case, 80), job.accuracy_rows).total(),
            model.qkvo(), backward, est.sent_bytes, int(model.on_gpu(None)), int(model.on_gpu(True))]


def test_the_model_gives_the_totals_of_the_plan_code_before_it_for_every_job_case(planned_everywhere):
    expected = json.loads(TOTALS.read_text())
    got = {key: model_row(job, case) for key, job, case in job_cases()}
    gone = sorted(set(expected) - set(got))       # job files added later have no expected totals: only the old ones
    assert not gone, f"cases of the recorded totals are gone ({gone[:3]}...): rewrite tests/memory_totals.json"
    wrong = {key: (got[key], want) for key, want in expected.items() if got[key] != want}
    assert not wrong, f"{len(wrong)} case(s) differ (got, expected): {dict(list(wrong.items())[:5])}"


def test_the_terms_add_up_and_a_forward_case_holds_no_backward(planned_everywhere):
    from hilbert_hpc.study.memory import MemoryModel
    from hilbert_hpc.study.setup import plan_setup

    seen = set()
    for _, job, case in job_cases():
        if (case.backend, case.pass_) in seen:
            continue
        seen.add((case.backend, case.pass_))
        model = MemoryModel(plan_setup(case), job.accuracy_rows)
        terms = model.terms()
        assert sum(terms.values()) == model.total() and terms["Q/K/V/O"] == model.qkvo() > 0
        if case.pass_ == "forward":
            assert not any(terms[n] for n in ("dO", "dQ/dK/dV", "delta", "bwd work", "ring acc", "check"))
        else:
            assert terms["dO"] > 0 and terms["dQ/dK/dV"] > 0
    assert len(seen) > 6


def test_the_descriptions_differ_where_the_backends_do():
    """The NumPy tiles per core, CuPy's one set, the fused kernels' 16-bit output and tma16's scratch, the peers'
    gathered copies, FlashAttention-4 always on a GPU."""
    from hilbert_hpc.kernels.selection import choose

    shape = RankShape(shard=4096, heads=8, head_dim=64, itemsize=2, patterns=(), kernel=None)
    mem = {name: cls.memory for name, cls in BACKENDS.items()}
    qkvo16 = 4096 * 8 * 64 * 2 * 4
    assert mem["cuda"].qkvo_bytes(shape) == qkvo16 and mem["numpy"].qkvo_bytes(shape) == 4096 * 8 * 64 * (6 + 4)
    tma16 = choose("bfloat16", 64, cc=90, override="tma16")
    assert mem["cuda"].workspace_bytes(RankShape(4096, 8, 64, 2, (), kernel=tma16)) == 4096 * 4 * 64 * 4
    assert mem["cuda-fp32"].workspace_bytes(RankShape(4096, 8, 64, 4, (), kernel=tma16)) == 0
    assert mem["torch"].workspace_bytes(shape) == mem["flash"].workspace_bytes(shape) > mem["torch"].qkvo_bytes(shape)
    assert mem["flash"].counted_on_gpu(BACKENDS["flash"](), None) and mem["torch"].counted_on_gpu(BACKENDS["torch"](),
                                                                                                   True)
    assert not mem["numpy"].counted_on_gpu(BACKENDS["numpy"](), True)


#: a NumPy forward+backward case on two ranks with a ring pattern and a gathered one
BREAKDOWN_JOB = JobSpec({"name": "terms", **QUICK},
                        defaults={"heads": 2, "head_dim": 8, "backend": "numpy", "dtype": "float64", "ranks": 2,
                                  "pass": "forward+backward"},
                        cases=[{"name": "both", "tokens": 4096, "patterns": [[64, 1], [4096, 4]],
                                "sweep": {"long_schedule": ["ring", "gather"]}}])


def test_plan_breakdown_lists_each_cases_terms_adding_up_to_its_memory(tmp_path, capsys):
    """``plan --breakdown``: under each case its memory terms, their sum the table's mem/rank; refused with
    --project (one line)."""
    from hilbert_hpc.cli import main

    (tmp_path / "job.toml").write_text(BREAKDOWN_JOB.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "2", "--breakdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [(i, line.split()) for i, line in enumerate(lines) if line.startswith("000")]
    assert len(rows) == 2
    for (i, row), long in zip(rows, ("ring", "gather")):
        unit, terms = lines[i + 1].split("memory ", 1)[1].split(": ", 1)
        parts, total = terms.split(" = ")
        sizes = {name: float(size) for name, size in (p.rsplit(" ", 1) for p in parts.split(" + "))}
        assert unit == "MiB" and float(row[5]) * 1024 == pytest.approx(float(total), abs=1)
        assert sum(sizes.values()) == pytest.approx(float(total), abs=1e-2)
        assert {"Q/K/V/O", "lse", "work", "dO", "dQ/dK/dV", "delta", "check"} <= set(sizes)
        assert ("ring" in sizes and "ring acc" in sizes) == (long == "ring")
        assert ("gathered" in sizes) == (long == "gather")
    assert main(["plan", str(tmp_path / "job.toml"), "--project", "2", "--breakdown"]) == 2
    assert capsys.readouterr().err.strip() == ("hilbert-hpc: error: --breakdown: applies to the table of -n, not to "
                                               "--project")


def write_totals() -> None:
    """Rewrite :data:`TOTALS` from the model (after a deliberate change of a job file or of the model)."""
    mp = pytest.MonkeyPatch()
    plan_everywhere_alike(mp)
    try:
        rows = {key: model_row(job, case) for key, job, case in job_cases()}
    finally:
        mp.undo()
    TOTALS.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in rows.items()) + "\n}\n")


if __name__ == "__main__":
    write_totals()
