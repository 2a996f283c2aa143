"""What plan and run say about backends that cannot run here, sizes without a unit, and the rates of --from."""

from __future__ import annotations

import sys

import h5py
import pytest

from hilbert_hpc.errors import ConfigError

from jobtext import QUICK, JobSpec

#: one NumPy case and one case of the PyTorch peer, the peer optional
PEER_JOB = JobSpec({"name": "peer", **QUICK, "optional_backends": ["torch"]},
                   defaults={"heads": 2, "head_dim": 8, "dtype": "float32", "ranks": 1},
                   cases=[{"name": "ours", "tokens": 256, "patterns": [[64, 1], [256, 4]], "backend": "numpy"},
                          {"name": "peer", "tokens": 256, "patterns": [[64, 1], [256, 4]], "backend": "torch"}])


@pytest.fixture
def no_torch(monkeypatch):
    """torch cannot be imported (``import torch`` raises ImportError), as on a machine without it."""
    monkeypatch.setitem(sys.modules, "torch", None)


# --- optional_backends = ["torch"] where torch is missing -------------------------------------------------------------

def test_the_torch_peer_is_unusable_where_torch_does_not_import(no_torch):
    from hilbert_hpc.backends import find_backend, require_usable

    reason = find_backend("torch").usable()
    assert reason is not None and reason.startswith("needs torch, which cannot be imported here")
    with pytest.raises(ConfigError) as info:
        require_usable("torch", "0001-peer.backend")
    assert info.value.param == "0001-peer.backend" and info.value.message == f"backend 'torch' {reason}"


def test_run_leaves_the_optional_peers_cases_out_where_torch_is_missing(tmp_path, capsys, no_torch):
    from hilbert_hpc.cli import main

    (tmp_path / "job.toml").write_text(PEER_JOB.text())
    assert main(["run", str(tmp_path / "job.toml"), "-o", str(tmp_path / "r.h5")]) == 0
    err = capsys.readouterr().err
    assert "note: backend 'torch' cannot run here (needs torch, which cannot be imported here" in err
    assert "its 1 case(s) are left out (job.optional_backends)" in err and "error" not in err
    with h5py.File(tmp_path / "r.h5") as f:
        assert [g.attrs["backend"] for g in f["cases"].values()] == ["numpy"]


def test_plan_of_the_peer_without_torch_says_why_and_not_no_gpu(tmp_path, capsys, no_torch):
    from hilbert_hpc.cli import main

    (tmp_path / "job.toml").write_text(PEER_JOB.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "1", "--host-memory", "16GiB"]) == 0
    captured = capsys.readouterr()
    assert "GPU" not in captured.err, captured.err
    assert "hilbert-hpc: note: backend 'torch' needs torch, which cannot be imported here" in captured.err
    assert "run leaves them out where it cannot run (job.optional_backends)" in captured.err
    rows = [line.split() for line in captured.out.splitlines() if line.startswith("000")]
    assert [(r[1], r[2], r[-1]) for r in rows] == [("numpy", "float32", "yes"), ("torch", "float32", "yes")]


def test_plan_of_a_cpu_job_with_the_peer_has_no_note(tmp_path, capsys):
    pytest.importorskip("torch")
    from hilbert_hpc.cli import main

    (tmp_path / "job.toml").write_text(PEER_JOB.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "1"]) == 0
    assert capsys.readouterr().err == ""


# --- GPU-only jobs on a CPU machine -----------------------------------------------------------------------------------

GPU_JOB = JobSpec({"name": "gpu", **QUICK}, defaults={"heads": 2, "head_dim": 32, "dtype": "float32", "ranks": 1},
                  cases=[{"name": "c", "tokens": 4096, "patterns": [[1024, 1]], "backend": "cuda-fp32"}])


@pytest.mark.parametrize("cupy", ["missing", "no device"])
def test_run_of_a_gpu_case_here_says_it_needs_an_nvidia_gpu(tmp_path, capsys, monkeypatch, cupy):
    """Without CuPy, or with CuPy and no CUDA device: the case needs an NVIDIA GPU (and CuPy), as bandwidth says."""
    from hilbert_hpc.backends import base
    from hilbert_hpc.cli import main

    if cupy == "missing":
        monkeypatch.setitem(sys.modules, "cupy", None)
    else:
        pytest.importorskip("cupy")
        if base.gpu_unusable() is None:
            monkeypatch.setattr(base, "gpu_unusable", lambda: "CUDA sees no device")
    (tmp_path / "job.toml").write_text(GPU_JOB.text())
    assert main(["run", str(tmp_path / "job.toml"), "-o", str(tmp_path / "r.h5")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hilbert-hpc: error: 0000-c.backend: backend 'cuda-fp32' needs an NVIDIA GPU; none is "
                          "usable here (") and err.count("\n") == 1, err
    if cupy == "missing":
        assert "(CuPy is not installed: " in err
    assert not (tmp_path / "r.h5").exists()


def test_plan_of_a_gpu_job_here_notes_the_gpu_per_backend(tmp_path, capsys, monkeypatch):
    from hilbert_hpc.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)
    (tmp_path / "job.toml").write_text(GPU_JOB.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "1"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("hilbert-hpc: note: backend 'cuda-fp32' needs an NVIDIA GPU; none is usable here (CuPy is "
                          "not installed: ") and err.count("\n") == 1, err
    assert "its 1 case(s) were checked for their distribution over the ranks only" in err


# --- the plan table tells the cases of one job apart ------------------------------------------------------------------

def test_plan_rows_show_backend_and_dtype(tmp_path, capsys, monkeypatch):
    """Cases of one name (a sweep) differ in their row by backend and dtype."""
    from hilbert_hpc.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)
    pairs = [("cuda", "bfloat16"), ("cuda-fp32", "float32"), ("numpy", "float32"), ("numpy", "float64")]
    spec = JobSpec({"name": "alike"}, defaults={"heads": 2, "head_dim": 32, "ranks": 1},
                   cases=[{"name": "longnet-4m", "tokens": 4096, "patterns": [[1024, 1]], "backend": backend,
                           "dtype": dtype} for backend, dtype in pairs])
    (tmp_path / "job.toml").write_text(spec.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "1"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("case"))
    assert head.split()[:3] == ["case", "backend", "dtype"]
    rows = [tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("000")]
    assert rows == pairs


# --- sizes without a unit ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--device-memory", "--host-memory"])
def test_a_memory_size_without_a_unit_below_1_mib_is_refused(tmp_path, capsys, flag):
    from hilbert_hpc.cli import main

    (tmp_path / "job.toml").write_text(GPU_JOB.text())
    assert main(["plan", str(tmp_path / "job.toml"), "-n", "1", flag, "80"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"hilbert-hpc: error: {flag}: '80' has no unit, so it is 80 bytes: give the unit, "
                            f"e.g. 80GiB (a number alone is bytes, at least 1 MiB)\n")


def test_sizes_with_a_unit_or_of_at_least_1_mib_are_taken():
    from hilbert_hpc.study.plan import parse_size

    assert parse_size("80B") == 80 and parse_size("80 KiB") == 80 << 10
    assert parse_size(str(1 << 20)) == 1 << 20 and parse_size("80", "--max-bytes", unitless_min=1) == 80
    with pytest.raises(ConfigError, match="has no unit"):
        parse_size(str((1 << 20) - 1), "--host-memory")


# --- plan --project --from: what the files do not give ----------------------------------------------------------------

SMALL = JobSpec({"name": "small", "repeats": 2, "warmup": 0},
                defaults={"heads": 2, "backend": "numpy", "dtype": "float32", "ranks": 1},
                cases=[{"name": "s", "tokens": 256, "patterns": [[64, 1], [256, 4]], "head_dim": 8},
                       {"name": "t", "tokens": 256, "patterns": [[64, 1], [256, 4]], "head_dim": 16}])


@pytest.fixture(scope="module")
def small_results(tmp_path_factory):
    """A folder with SMALL's job file and a results file of its two cases."""
    from hilbert_hpc.cli import main

    tmp = tmp_path_factory.mktemp("from")
    (tmp / "small.toml").write_text(SMALL.text())
    assert main(["run", str(tmp / "small.toml"), "-o", str(tmp / "small.h5")]) == 0
    return tmp


def test_project_from_a_damaged_case_says_the_built_in_rate_stands_in(small_results, tmp_path, capsys):
    """The case of D = 16 is cut off in the file: its rate is the built-in one, and notes say so."""
    import shutil

    from hilbert_hpc.cli import main

    damaged = tmp_path / "damaged.h5"
    shutil.copy(small_results / "small.h5", damaged)
    with h5py.File(damaged, "a") as f:
        (group,) = [g for g in f["cases"].values() if g.attrs["head_dim"] == 16]
        group.attrs["complete"] = False
    capsys.readouterr()
    assert main(["plan", str(small_results / "small.toml"), "--project", "1,2", "--from", str(damaged)]) == 0
    captured = capsys.readouterr()
    notes = captured.err.splitlines()
    assert all(line.startswith("hilbert-hpc: note: ") for line in notes), captured.err
    assert len(notes) == 5, notes
    assert f"{str(damaged)!r}: 1 incomplete case(s) skipped" in notes[0]
    assert notes[1].startswith("hilbert-hpc: note: case 0001-t: no 1-rank result of backend 'numpy', float32, D = 16, "
                               "not causal in the --from files: its rate is the built-in one (docs/performance.md")
    # on 2 GPUs the (256, 4) pattern is gathered over the host transport: no bandwidth file or 2-rank case gives
    # its figures, nor any file the launch's
    assert notes[2].startswith("hilbert-hpc: note: no bandwidth file of transport 'host' in the --from files: its "
                               "latency alpha is the built-in one (placeholder, not measured")
    assert notes[3].startswith("hilbert-hpc: note: no bandwidth file or 2-rank result of transport 'host' in the "
                               "--from files: its bandwidth B is the built-in one (placeholder, not measured")
    assert notes[4].startswith("hilbert-hpc: note: no multi-rank gather result of backend 'numpy' in the --from "
                               "files: the fixed cost of its gathered pattern's launch is the built-in one "
                               "(placeholder, not measured for backend 'numpy'")
    assert f"({damaged}, case 0000-s, medians of 2)" in captured.out


def test_project_from_files_that_give_every_rate_has_no_rate_note(small_results, capsys):
    from hilbert_hpc.cli import main

    for bandwidth in (["--bandwidth-gbs", "100"], []):       # one GPU needs no ring bandwidth
        assert main(["plan", str(small_results / "small.toml"), "--project", "1", "--from",
                     str(small_results / "small.h5"), *bandwidth]) == 0
        assert capsys.readouterr().err == ""
