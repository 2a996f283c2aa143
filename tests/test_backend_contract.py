"""One backend contract and one setup per case: every backend is a Backend, the study asks it and nothing else,
the setup is made once per case, and plan counts the kernel that run records."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import h5py
import pytest

from hilbert_hpc.backends import BACKENDS, Backend, check_backend, find_backend
from hilbert_hpc.kernels.selection import KernelChoice
from hilbert_hpc.backends.base import Backend as Base
from hilbert_hpc.backends.memory import BackendMemory
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.study.jobfile import Case, load_job

from jobtext import JobSpec

PACKAGE = Path(__file__).resolve().parents[1] / "hilbert_hpc"
#: what every backend must fill in itself (the base class raises NotImplementedError)
REQUIRED = ("to_device", "to_numpy", "synchronize", "serialized_attention")
#: what a backend answered about its memory before its memory description (``Backend.memory``) did
MEMORY_METHODS = ("output_itemsize", "workspace_bytes", "plan_on_gpu", "gradient_bytes", "backward_workspace_bytes")


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_is_a_backend_instance_that_fills_in_the_contract(name):
    be = find_backend(name)
    assert isinstance(be, Backend) and type(be) is not Backend
    assert be.name == name and be.dtypes
    for method in REQUIRED:
        assert getattr(type(be), method) is not getattr(Base, method), f"{name} does not implement {method}"
    choice = be.kernel_choice(64, "float32", gpu_here=False)
    # the fused-kernel backends choose a kernel (the registry's); the others have none of their own
    assert isinstance(choice, KernelChoice) if name in ("cuda", "cuda-fp32") else choice is None
    # what it holds on a rank is its memory description's, which the plan's memory model asks
    assert isinstance(be.memory, BackendMemory)
    assert not [m for m in MEMORY_METHODS if hasattr(be, m)], f"{name} answers memory itself"


def test_the_dtype_table_is_the_backends_own():
    """The pairs a job may ask for are exactly the backends' dtypes."""
    for name, cls in BACKENDS.items():
        for dtype in ("float64", "float32", "bfloat16", "float16"):
            if dtype in cls.dtypes:
                check_backend(dtype, name, "dtype")
            else:
                with pytest.raises(ConfigError, match=f"backend {name!r} does not compute in {dtype}"):
                    check_backend(dtype, name, "dtype")


def _probes(tree: ast.AST) -> list[str]:
    """hasattr(...) anywhere, and getattr(...) on something named like a backend or kernel provider."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if node.func.id == "hasattr" or any(w in target for w in ("be", "backend", "kernels")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "study").glob("*.py")) + sorted((PACKAGE / "distributed").glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_study_and_the_ring_ask_the_contract_and_probe_nothing(path):
    assert not _probes(ast.parse(path.read_text())), path


JOB = JobSpec({"name": "setup", "repeats": 1, "warmup": 0, "accuracy_rows": 8},
              defaults={"heads": 2, "head_dim": 8, "backend": "numpy"},
              cases=[{"name": "a", "grid": [256], "patterns": [[64, 1], [256, 4]],
                      "sweep": {"causal": [False, True]}}])


def test_the_setup_is_made_once_per_case_and_read_by_the_results(tmp_path, monkeypatch):
    """run_job checks each case once (its setup), the measurement, the transport and the results read it."""
    from hilbert_hpc.distributed import transports
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study import runner, setup

    made, chosen = [], []
    real_check, real_choose = setup.check_case, transports.choose_transport

    def counting(case, ranks=None):
        made.append(case.case_id)
        return real_check(case, ranks)

    monkeypatch.setattr(runner, "check_case", counting)
    monkeypatch.setattr(setup, "choose_transport", lambda *a: chosen.append(a) or real_choose(*a))
    (tmp_path / "job.toml").write_text(JOB.text())
    job = load_job(tmp_path / "job.toml", world_size=1)
    path = runner.run_job(job, str(tmp_path / "r.h5"), comm=SingleProcessComm(), stream=io.StringIO(),
                          progress=io.StringIO())
    assert sorted(made) == sorted(c.case_id for c in job.cases)
    assert not chosen                                      # one rank: no transport to decide
    with h5py.File(path) as f:
        for g in f["cases"].values():
            assert (g.attrs["kernel"], g.attrs["transport"]) == ("none", "none")
            assert g.attrs["transport_reason"] == "single rank: no communication"


def test_the_transport_is_decided_once_with_its_reason(monkeypatch):
    """cuda-awareness is asked once per case: the refusal and the transport come from the same answer."""
    from hilbert_hpc.distributed import cuda_aware
    from hilbert_hpc.distributed.transports import choose_transport

    asked = []
    monkeypatch.setattr(cuda_aware, "cuda_aware_support", lambda: asked.append(1) or (False, "no evidence"))
    choice = choose_transport("cuda-aware", True)
    assert (choice.name, choice.cuda_aware, len(asked)) == ("cuda-aware", (False, "no evidence"), 1)
    assert choose_transport("auto", True).reason == "auto: staged (no evidence)"
    assert choose_transport("auto", False).name == "host" and len(asked) == 2


def _cuda_case(head_dim: int, dtype: str = "bfloat16", **kw) -> Case:
    return Case(case_id=f"0000-d{head_dim}", name="c", grid=(4096,), patterns=(Pattern(1024, 1),), heads=8,
                head_dim=head_dim, backend="cuda", dtype=dtype, **kw)


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU seen by the kernel selection (compute capability patched where the kernels ask it), usable."""
    pytest.importorskip("cupy")
    from hilbert_hpc.backends import base
    from hilbert_hpc.kernels import program

    monkeypatch.setattr(base, "gpu_unusable", lambda: None)
    monkeypatch.setattr(program, "shared_limit", lambda: 227 * 1024)
    monkeypatch.delenv("HILBERT_HPC_HALF_KERNEL", raising=False)

    def set_cc(cc: int) -> None:
        monkeypatch.setattr(program, "compute_capability", lambda: cc)

    set_cc(90)
    return set_cc


@pytest.mark.parametrize("head_dim, variant, scratch", [(64, "tma16", True), (96, "tma16", True),
                                                        (96, "wgmma16", False)])
def test_plan_counts_the_kernel_run_records(hopper, monkeypatch, head_dim, variant, scratch):
    """The kernel of plan's memory is the results' ``kernel``: tma16 (with its float32 scratch), or wgmma16
    forced (none); off Hopper mma16, and no scratch."""
    from hilbert_hpc.study.plan import estimate
    from hilbert_hpc.study.setup import check_case, plan_setup

    if variant != "tma16":
        monkeypatch.setenv("HILBERT_HPC_HALF_KERNEL", variant)
    case = _cuda_case(head_dim)
    run_setup, planned = check_case(case), plan_setup(case)
    assert run_setup.kernel.name == planned.kernel.name == variant and planned.decided
    shard, heads = case.tokens, case.heads
    base = estimate(case, setup=run_setup).memory_bytes
    assert base == estimate(case).memory_bytes
    qkvo = shard * heads * head_dim * 2 * 4
    extra = shard * (heads // 2) * head_dim * 4 if scratch else 0
    assert base == qkvo + shard * heads * 4 + extra
    monkeypatch.delenv("HILBERT_HPC_HALF_KERNEL", raising=False)
    hopper(80)
    assert plan_setup(case).kernel.name == "mma16"
    assert estimate(case).memory_bytes == qkvo + shard * heads * 4


def test_plan_without_a_gpu_counts_the_largest_choice(monkeypatch):
    """On a login node the kernel is unknown: tma16's scratch is counted where tma16 may run."""
    from hilbert_hpc.backends import base
    from hilbert_hpc.study.plan import estimate
    from hilbert_hpc.study.setup import plan_setup

    monkeypatch.setattr(base, "gpu_unusable", lambda: "CUDA sees no device")
    for head_dim in (32, 64, 96, 128):             # tma16 has every head dim
        case = _cuda_case(head_dim)
        assert not plan_setup(case).decided
        extra = case.tokens * 4 * head_dim * 4
        assert estimate(case).memory_bytes == case.tokens * 8 * head_dim * 2 * 4 + case.tokens * 8 * 4 + extra


def test_a_gpu_backend_without_a_gpu_is_refused_in_one_line(monkeypatch):
    from hilbert_hpc.backends import base, require_usable

    pytest.importorskip("cupy")
    monkeypatch.setattr(base, "gpu_unusable", lambda: "CUDA sees no device")
    with pytest.raises(ConfigError, match=r"backend 'cupy' needs an NVIDIA GPU; none is usable here \(CUDA sees"):
        require_usable("cupy")


def test_plan_for_a_gpu_model_counts_the_kernel_run_chooses_there(monkeypatch):
    """``plan --gpu MODEL``: the kernel is the one of that model's compute capability (tma16's scratch on an
    H100, none with mma16 on an A100), whatever this machine has."""
    from hilbert_hpc.backends import base
    from hilbert_hpc.study.plan import estimate, gpu_model
    from hilbert_hpc.study.setup import plan_setup

    monkeypatch.setattr(base, "gpu_unusable", lambda: "CUDA sees no device")
    monkeypatch.delenv("HILBERT_HPC_HALF_KERNEL", raising=False)
    case = _cuda_case(64)
    hopper, ampere = plan_setup(case, gpu_model("H100").cc), plan_setup(case, gpu_model("a100-80gb").cc)
    assert (hopper.kernel.name, ampere.kernel.name) == ("tma16", "mma16")
    scratch = case.tokens * (case.heads // 2) * case.head_dim * 4
    assert estimate(case, setup=hopper).memory_bytes - estimate(case, setup=ampere).memory_bytes == scratch
    assert plan_setup(case, gpu_model("V100-16GB").cc).kernel is None      # run refuses bf16 there
