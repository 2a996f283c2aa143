"""Results are never lost or mixed: output ownership, the lock, trusted resume, one-line I/O errors.

Every refusal is checked for one line on stderr, exit code 2, no traceback,
and not one byte changed in the files that were there before. A single-process command runs inside the test
process (``run``); runs that are signalled, killed or stopped, several ranks and a changed environment keep a
process of their own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from clirun import run_in_process
from jobtext import DROP, QUICK, JobSpec

ROOT = Path(__file__).resolve().parents[1]

OWN_JOB = JobSpec({"name": "own", **QUICK, "save_output": True},
                  defaults={"heads": 2, "head_dim": 8, "dtype": "float64"},
                  cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 4]],
                          "sweep": {"scale": [0.1, 0.2, 0.3, 0.4]}}])
JOB = OWN_JOB.text()

#: four cases of about a second each: a test that reads the first one's line acts (signals the run, or stops it
#: with SIGSTOP) while the second one works
SLOW_JOB = OWN_JOB.but(repeats=4, case={"grid": [192, 192], "patterns": [[96, 1], [1152, 4], [36864, 16]]}).text()


def _env(**extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMP_NUM_THREADS="1", **extra)


def run(args: list[str], cwd: Path, mpi: int = 0, **env: str) -> subprocess.CompletedProcess:
    """``hilbert-hpc ARGS`` in ``cwd``: in this process, or under ``mpiexec -n MPI`` or with ``env`` added in a
    process of its own."""
    if not mpi and not env:
        return run_in_process(args, cwd)
    cmd = [sys.executable, "-m", "hilbert_hpc", *args]
    if mpi:
        cmd = ["mpiexec", "-n", str(mpi), "--oversubscribe", *cmd]
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=600)


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def stopped_in_its_second_case(proc: subprocess.Popen):
    """``proc`` (a run of SLOW_JOB) held with SIGSTOP once its first case is done, so that it still owns its
    file, however long the caller takes; continued (SIGCONT) afterwards."""
    for line in proc.stdout:
        if line.startswith("0000-g"):           # the run is working on its second case
            proc.send_signal(signal.SIGSTOP)
            break
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGCONT)


def one_error_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    """The run failed with exit 2 and exactly one line of ours on stderr (the launcher may add its banner)."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    ours = [line for line in res.stderr.splitlines() if line.startswith("hilbert-hpc")]
    assert len(ours) == 1, res.stderr
    for needle in needles:
        assert needle in ours[0], ours[0]
    return ours[0]


def digest(*paths: Path) -> dict[str, str]:
    """SHA-256 of every file under ``paths`` (what must not change)."""
    out = {}
    for p in paths:
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p] if p.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def complete_cases(path: Path) -> list[str]:
    """The complete cases, read the way report and resume read them (an unreadable case is not complete)."""
    from hilbert_hpc.study.results_read import case_groups

    for _ in range(100):            # a killed run's ranks may still hold HDF5's lock for a moment
        try:
            f = h5py.File(path, "r")
            break
        except BlockingIOError:
            time.sleep(0.2)
    with f:
        return sorted(cid for cid, g, _ in case_groups(f["cases"]) if g is not None and g.attrs.get("complete"))


def outputs(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {cid: g["output"][...] for cid, g in f["cases"].items()}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "job.toml").write_text(JOB)
    return tmp_path / "job.toml"


@pytest.fixture
def done(tmp_path: Path, job: Path) -> Path:
    """A complete results file of JOB."""
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 0, res.stderr
    return tmp_path / "r.h5"


# 1. own the file before touching it ---------------------------------------------------------------------------

@pytest.mark.parametrize("first,second", [([], []), ([], ["--resume"]), (["--resume"], []),
                                          (["--overwrite"], ["--overwrite"])])
def test_a_second_run_on_a_file_in_use_is_refused_and_the_first_is_unharmed(tmp_path, first, second):
    (tmp_path / "job.toml").write_text(SLOW_JOB)
    a = start(["run", "job.toml", "-o", "c.h5", *first], tmp_path)
    with stopped_in_its_second_case(a):
        b = run(["run", "job.toml", "-o", "c.h5", *second], tmp_path)
    out, err = a.communicate(timeout=600)
    one_error_line(b, "'c.h5' is in use by another run", f"pid {a.pid}")
    assert a.returncode == 0, err
    assert complete_cases(tmp_path / "c.h5") == [f"000{i}-g" for i in range(4)]
    assert not (tmp_path / "c.h5.lock").exists()
    assert all(np.isfinite(o).all() for o in outputs(tmp_path / "c.h5").values())


def test_a_second_run_under_mpiexec_is_refused_once(tmp_path):
    (tmp_path / "job.toml").write_text(SLOW_JOB)
    a = start(["run", "job.toml", "-o", "c.h5"], tmp_path)
    with stopped_in_its_second_case(a):
        b = run(["run", "job.toml", "-o", "c.h5"], tmp_path, mpi=2)
    a.communicate(timeout=600)
    one_error_line(b, "in use by another run")
    assert a.returncode == 0 and len(complete_cases(tmp_path / "c.h5")) == 4


def test_existing_results_are_refused_without_a_flag(tmp_path, done):
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5"], tmp_path), "already holds results", "--resume",
                   "--overwrite")
    assert digest(tmp_path) == before


def test_overwrite_replaces_the_file_and_its_parts(tmp_path, done):
    stale = tmp_path / "r.h5.parts" / "9999-old"
    stale.mkdir()
    (stale / "rank00000.h5").write_bytes(b"")
    res = run(["run", "job.toml", "-o", "r.h5", "--overwrite"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert not stale.exists()
    assert complete_cases(tmp_path / "r.h5") == [f"000{i}-g" for i in range(4)]
    with h5py.File(tmp_path / "r.h5") as f:
        assert json.loads(f.attrs["resumes"]) == []


def test_overwrite_keeps_a_parts_folder_with_foreign_files(tmp_path, done):
    (tmp_path / "r.h5.parts" / "notes.txt").write_text("mine")
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--overwrite"], tmp_path), "notes.txt",
                   "not output parts")
    assert digest(tmp_path) == before


def test_resume_and_overwrite_together_are_a_usage_error(tmp_path, job):
    res = run(["run", "job.toml", "-o", "r.h5", "--resume", "--overwrite"], tmp_path)
    assert res.returncode == 2 and "not allowed with" in res.stderr


REFUSED_TARGETS = [
    ("job.toml", "is the job file"),
    ("data.h5", "is the input file of case 0000-g"),
    ("notes.txt", "is not a hilbert-hpc results file"),
    ("foreign.h5", "is not a hilbert-hpc results file"),
    ("folder", "is a folder"),
    ("orphan.h5", "orphan.h5.parts' exists without its results file"),
]


# every target with every flag, but an orphan parts folder with --overwrite: that is the documented way to
# reuse it (tested below)
@pytest.mark.parametrize("target,needle,flag", [
    (target, needle, flag) for target, needle in REFUSED_TARGETS for flag in ([], ["--overwrite"], ["--resume"])
    if not (target == "orphan.h5" and flag == ["--overwrite"])])
def test_outputs_that_are_not_ours_are_refused_with_every_flag(tmp_path, target, needle, flag):
    from hilbert_hpc.distributed.datafile import write_input

    rng = np.random.default_rng(0)
    write_input(tmp_path / "data.h5", *(rng.standard_normal((256, 2, 8)) for _ in range(3)), grid=(16, 16))
    (tmp_path / "job.toml").write_text(OWN_JOB.but(case={"grid": DROP, "input": "data.h5"}).text())
    (tmp_path / "notes.txt").write_text("my notes\n")
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = 1
    (tmp_path / "folder").mkdir()
    (tmp_path / "orphan.h5.parts" / "0000-g").mkdir(parents=True)
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", target, *flag], tmp_path), needle)
    assert digest(tmp_path) == before
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob(".*.tmp-*"))


def test_overwrite_reuses_an_orphan_parts_folder(tmp_path, job):
    (tmp_path / "r.h5.parts" / "0000-g").mkdir(parents=True)
    res = run(["run", "job.toml", "-o", "r.h5", "--overwrite"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(complete_cases(tmp_path / "r.h5")) == 4


def test_a_killed_start_never_leaves_a_half_made_file(tmp_path, job):
    """SIGKILL at any moment: the final name holds nothing or a readable results file."""
    from hilbert_hpc.study.results_read import is_results_file

    for delay in (0.3, 0.6, 0.9, 1.2, 1.5):
        path = tmp_path / f"k{delay}.h5"
        proc = start(["run", "job.toml", "-o", path.name], tmp_path)
        time.sleep(delay)
        proc.kill()
        proc.communicate()
        assert not path.exists() or is_results_file(path), delay
    leftovers = list(tmp_path.glob(".*.tmp-*"))
    for path in tmp_path.glob("k*.h5"):             # a stale lock or temporary file never blocks the resume
        res = run(["run", "job.toml", "-o", path.name, "--resume"], tmp_path)
        assert res.returncode == 0, res.stderr
        assert len(complete_cases(path)) == 4
    assert all(t.name.startswith(".k") for t in leftovers)


KILL_WHILE_NAMING_OWNER = """
import os, signal, sys
from hilbert_hpc.study import parts
from hilbert_hpc.cli import main

def killed(*args, **kwargs):   # the OWNER file written, not yet renamed into place
    os.kill(os.getpid(), signal.SIGKILL)

parts.move_into_place = killed
sys.exit(main(sys.argv[1:]))
"""


def test_killed_while_creating_the_parts_folder_then_resume(tmp_path, job):
    """SIGKILL while the parts folder's OWNER file is renamed into place: the resume is not refused."""
    path = tmp_path / "p.h5"
    proc = subprocess.run([sys.executable, "-c", KILL_WHILE_NAMING_OWNER, "run", "job.toml", "-o", path.name],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    res = run(["run", "job.toml", "-o", path.name, "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(complete_cases(path)) == 4


def test_read_only_folder_gives_one_line(tmp_path, job):
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        one_error_line(run(["run", "job.toml", "-o", "ro/r.h5"], tmp_path), "ro/r.h5", "Read-only file system"
                       if os.geteuid() == 0 else "Permission denied")
        one_error_line(run(["run", "job.toml", "-o", "ro/sub/r.h5"], tmp_path), "cannot create the folder")


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only: a read-only tmpfs for root (which ignores modes), else chmod."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("root without mount permission: no way to make a read-only folder here")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


# 2. case names --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../../../escaped", "2d/32x32", "a..b", "tab\there"])
def test_case_names_that_are_paths_are_refused_before_any_file_is_written(tmp_path, name):
    (tmp_path / "job.toml").write_text(OWN_JOB.but(case={"name": name}).text())
    one_error_line(run(["run", "job.toml", "-o", "out/r.h5"], tmp_path), "cases[0].name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


# 3. resume you can trust ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,needle", [
    ({"name": "other"}, "it holds job 'own', this is job 'other'"),
    ({"defaults": {"head_dim": 4}}, "defaults.head_dim is 8 in the file, 4 here"),
    ({"repeats": 2}, "job.repeats is 1 in the file, 2 here"),
])
def test_resume_of_another_job_is_refused_and_changes_nothing(tmp_path, done, change, needle):
    (tmp_path / "other.toml").write_text(OWN_JOB.but(**change).text())
    before = digest(tmp_path)
    one_error_line(run(["run", "other.toml", "-o", "r.h5", "--resume"], tmp_path), needle)
    assert digest(tmp_path) == before


def test_resume_names_the_parameter_that_differs(tmp_path, done):
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--resume", "--transport", "host"], tmp_path),
                   "case 0000-g has transport = 'auto' in the file, 'host' in this run")
    assert digest(tmp_path) == before


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_resume_on_another_rank_count_is_refused(tmp_path, done):
    before = digest(tmp_path)
    one_error_line(run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path, mpi=2),
                   "case 0000-g has ranks = 1 in the file, 2 in this run")
    assert digest(tmp_path) == before


def test_resume_of_a_foreign_or_unreadable_file_changes_nothing(tmp_path, job):
    (tmp_path / "junk.h5").write_bytes(os.urandom(4096))
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f.attrs["program"] = "something-else"
        f.create_group("cases")
    before = digest(tmp_path)
    for name in ("junk.h5", "foreign.h5"):
        one_error_line(run(["run", "job.toml", "-o", name, "--resume"], tmp_path), "not a hilbert-hpc results file")
    assert digest(tmp_path) == before


def test_resume_reruns_cases_whose_output_parts_are_gone(tmp_path, done):
    full = outputs(done)
    shutil.rmtree(tmp_path / "r.h5.parts" / "0001-g")
    (tmp_path / "r.h5.parts" / "0002-g" / "rank00000.h5").write_bytes(b"not hdf5")
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("skipped") == 2
    assert "case 0001-g: output part r.h5.parts/0001-g/rank00000.h5 is missing; it runs again" in res.stderr
    assert "case 0002-g: output part r.h5.parts/0002-g/rank00000.h5 is unreadable" in res.stderr
    again = outputs(done)
    assert sorted(again) == sorted(full)
    for cid in full:
        assert np.array_equal(full[cid], again[cid]), cid


def test_resume_after_a_whole_parts_folder_is_deleted(tmp_path, done):
    full = outputs(done)
    shutil.rmtree(tmp_path / "r.h5.parts")
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("skipped") == 0
    again = outputs(done)
    assert all(np.array_equal(full[c], again[c]) for c in full)


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_resume_after_damage_in_the_middle_of_the_file(tmp_path, done, where):
    full = outputs(done)
    size = done.stat().st_size
    with open(done, "r+b") as f:
        f.seek(int(size * where))
        f.write(np.random.default_rng(1).bytes(3000))
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    if res.returncode == 2:          # the damage hit the file's root: refused, and left as it was
        one_error_line(res, "not a hilbert-hpc results file")
        return
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert complete_cases(done) == sorted(full)
    again = outputs(done)
    assert all(np.array_equal(full[c], again[c]) for c in full)


# 4. one line for environment and I/O failures -------------------------------------------------------------------

@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of ``size`` on ``folder`` (root with mount permission); None where the machine forbids it."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize("save_output", [True, False])
def test_full_disk_gives_one_line_keeps_complete_cases_and_resumes(tmp_path, save_output):
    spec = OWN_JOB.but(case={"grid": [32, 32], "sweep": {"scale": [i / 10 for i in range(1, 13)]}})
    job = (spec if save_output else spec.but(save_output=False, repeats=40)).text()
    with small_disk(tmp_path / "disk", "600k" if save_output else "64k") as disk:
        if disk is None:
            pytest.skip("no tmpfs here; test_injected_enospc covers the same path")
        (disk / "job.toml").write_text(job)
        reference = run(["run", str(disk / "job.toml"), "-o", str(tmp_path / "ref.h5")], tmp_path)
        assert reference.returncode == 0, reference.stderr
        res = run(["run", "job.toml", "-o", "r.h5"], disk)
        one_error_line(res, "No space left on device", "--resume")
        kept = complete_cases(disk / "r.h5")
        assert 0 < len(kept) < 12
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        res = run(["run", "job.toml", "-o", "r.h5", "--resume"], disk)
        assert res.returncode == 0, res.stderr
        assert res.stdout.count("skipped") == len(kept)
        assert complete_cases(disk / "r.h5") == complete_cases(tmp_path / "ref.h5")
        if save_output:
            full, again = outputs(tmp_path / "ref.h5"), outputs(disk / "r.h5")
            assert all(np.array_equal(full[c], again[c]) for c in full)


def test_injected_enospc_gives_one_line_and_a_resumable_file(tmp_path, job, monkeypatch, capsys):
    """The same path without a tmpfs: the third case's write fails with ENOSPC."""
    from hilbert_hpc import cli
    from hilbert_hpc.study import results

    real = results._write_case
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "_write_case", failing)
    assert cli.main(["run", "job.toml", "-o", "r.h5"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hilbert-hpc")]
    assert err == ["hilbert-hpc: error: output: cannot write results file 'r.h5': No space left on device; its "
                   "complete cases are kept; free some space and continue with --resume"]
    assert complete_cases(tmp_path / "r.h5") == ["0000-g", "0001-g"]
    monkeypatch.setattr(results, "_write_case", real)
    assert cli.main(["run", "job.toml", "-o", "r.h5", "--resume"]) == 0
    assert len(complete_cases(tmp_path / "r.h5")) == 4


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x01binary\x00", "[job]\nname = \"caf\xe9\"\n".encode("latin-1")])
def test_job_files_that_are_not_text_give_one_line(tmp_path, content):
    (tmp_path / "job.toml").write_bytes(content)
    for args in (["run", "job.toml"], ["plan", "job.toml", "-n", "2"]):
        one_error_line(run(args, tmp_path), "job.toml", "UTF-8")
    assert not (tmp_path / "results").exists()


def test_missing_job_file_gives_one_line(tmp_path):
    one_error_line(run(["run", "nope.toml"], tmp_path), "nope.toml", "No such file")


@pytest.mark.parametrize("backend", ["cupy", "cuda-fp32"])
def test_gpu_backend_without_a_usable_gpu_is_refused_before_any_work(tmp_path, job, backend):
    (tmp_path / "job.toml").write_text(OWN_JOB.but(defaults={"dtype": "float32", "backend": backend}).text())
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path, CUDA_VISIBLE_DEVICES="")
    if res.returncode == 2 and "is not available here" in res.stderr:
        one_error_line(res, f"backend {backend!r} is not available here")     # no CuPy at all
    else:
        one_error_line(res, f"backend {backend!r} needs an NVIDIA GPU; none is usable here")
    assert not (tmp_path / "r.h5").exists()


def test_maxlen_without_a_usable_gpu_is_refused_at_once(tmp_path):
    (tmp_path / "s.toml").write_text('[search]\nname = "m"\nbackends = ["cuda-fp32"]\nlocal_patterns = [[2048, 1]]\n'
                                     'global_rows = 0\nstart = 2048\nlimit = 4096\n')
    t0 = time.perf_counter()
    res = run(["maxlen", "s.toml", "-o", "m.h5"], tmp_path, CUDA_VISIBLE_DEVICES="")
    assert time.perf_counter() - t0 < 60
    one_error_line(res, "search.backends")
    assert not (tmp_path / "m.h5").exists()


def test_maxlen_and_bandwidth_outputs_follow_the_same_rules(tmp_path, job):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "s.toml").write_text('[search]\nname = "m"\nbackends = ["numpy"]\nlocal_patterns = [[256, 1]]\n'
                                     'global_rows = 0\nstart = 256\nlimit = 512\nheads = 1\nhead_dim = 8\n')
    before = digest(tmp_path)
    one_error_line(run(["maxlen", "s.toml", "-o", "notes.txt"], tmp_path), "is not a hilbert-hpc max-length file")
    one_error_line(run(["maxlen", "s.toml", "-o", "s.toml"], tmp_path), "is the study file")
    one_error_line(run(["bandwidth", "--max-bytes", "1024", "-o", "notes.txt"], tmp_path),
                   "is not a hilbert-hpc bandwidth file")
    assert digest(tmp_path) == before
    assert run(["bandwidth", "--max-bytes", "1024", "-o", "bw.h5"], tmp_path).returncode == 0
    one_error_line(run(["bandwidth", "--max-bytes", "1024", "-o", "bw.h5"], tmp_path), "--overwrite")
    assert run(["bandwidth", "--max-bytes", "1024", "-o", "bw.h5", "--overwrite"], tmp_path).returncode == 0
    with h5py.File(tmp_path / "bw.h5") as f:
        assert f.attrs["study"] == "bandwidth" and f["bandwidth"].shape[1] == 2


# 5. values ------------------------------------------------------------------------------------------------------

def test_a_non_finite_output_row_that_is_not_sampled_fails_the_tolerance(tmp_path, job, monkeypatch):
    """Finiteness is checked on the whole output, not only on the sampled accuracy rows."""
    from hilbert_hpc.backends.numpy_backend import NumpyBackend
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.runner import run_job

    real = NumpyBackend.serialized_attention

    def poisoned(*args):
        out = real(*args)
        out[7, 1, 3] = np.inf
        return out

    monkeypatch.setattr(NumpyBackend, "serialized_attention", poisoned)
    (tmp_path / "job.toml").write_text(OWN_JOB.but(accuracy_rows=1).text())
    path = run_job(load_job(tmp_path / "job.toml", world_size=1), str(tmp_path / "r.h5"), comm=SingleProcessComm(),
                   stream=open(os.devnull, "w"))
    with h5py.File(path) as f:
        for g in f["cases"].values():
            acc = g["accuracy"].attrs
            assert acc["nonfinite"] == 1 and not acc["within_tolerance"]
            assert np.isfinite(acc["max_rel_err"])              # the sampled row itself was fine


# 6. signals -----------------------------------------------------------------------------------------------------

def test_ctrl_c_stops_at_a_case_boundary_with_75(tmp_path):
    from hilbert_hpc.study.signals import REQUEUE_EXIT

    (tmp_path / "job.toml").write_text(SLOW_JOB)
    proc = start(["run", "job.toml", "-o", "s.h5"], tmp_path)
    for line in proc.stdout:
        if line.startswith("0000-g"):
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == REQUEUE_EXIT, err
    assert "stopping after the current case" in err and "stopped by SIGINT" in err and "Traceback" not in err
    kept = complete_cases(tmp_path / "s.h5")
    assert kept in (["0000-g"], ["0000-g", "0001-g"])
    res = run(["run", "job.toml", "-o", "s.h5", "--resume"], tmp_path)
    assert res.returncode == 0 and res.stdout.count("skipped") == len(kept)


def test_a_second_ctrl_c_stops_at_once():
    from hilbert_hpc.study.signals import StopRequests

    with StopRequests() as stops:
        stops._handler(signal.SIGINT, None)
        assert stops.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            stops._handler(signal.SIGINT, None)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_sigterm_to_mpiexec_keeps_the_complete_cases(tmp_path):
    """Open MPI 5 kills its ranks ~0.25 s after forwarding SIGTERM (docs/studies.md): no boundary stop, but
    every case the file calls complete is intact and --resume finishes the job."""
    (tmp_path / "job.toml").write_text(SLOW_JOB)
    proc = subprocess.Popen(["mpiexec", "-n", "2", "--oversubscribe", sys.executable, "-m", "hilbert_hpc", "run",
                             "job.toml", "-o", "t.h5"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("0000-g"):
            proc.send_signal(signal.SIGTERM)
            break
    proc.communicate(timeout=600)
    assert proc.returncode != 0
    kept = complete_cases(tmp_path / "t.h5")
    assert kept[:1] == ["0000-g"]
    res = run(["run", "job.toml", "-o", "t.h5", "--resume"], tmp_path, mpi=2)
    assert res.returncode == 0, res.stderr
    assert len(complete_cases(tmp_path / "t.h5")) == 4
    assert all(np.isfinite(o).all() for o in outputs(tmp_path / "t.h5").values())


# 7. smaller items -----------------------------------------------------------------------------------------------

def test_cuda_env_output_survives_eval_with_spaces(tmp_path, monkeypatch, capsys):
    from hilbert_hpc import cli
    from hilbert_hpc.distributed import cuda_aware

    odd = str(tmp_path / "a path with spaces" / "lib") + ":$HOME;`x`"
    monkeypatch.setattr(cuda_aware, "recipe_environment", lambda: {"LD_PRELOAD": odd, "UCX_MODULE_DIR": odd})
    assert cli.main(["cuda-env"]) == 0
    script = capsys.readouterr().out
    res = subprocess.run(["bash", "-c", f'{script}\nprintf "%s\\n" "$LD_PRELOAD"'], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == odd


def test_accuracy_rows_above_n_is_stated(tmp_path):
    (tmp_path / "job.toml").write_text(OWN_JOB.but(accuracy_rows=1000).text())
    res = run(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "256 tokens, fewer than accuracy_rows = 1000" in res.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        assert all(g["accuracy"].attrs["rows"] == 256 for g in f["cases"].values())


def _break_case_list(path: Path) -> None:
    """Corrupt the signature of the symbol-table node that lists /cases (the root still opens)."""
    from hilbert_hpc.study.results_read import is_results_file

    data = path.read_bytes()
    at = data.find(b"SNOD")
    while at >= 0:
        broken = data[:at] + b"XXXX" + data[at + 4:]
        path.write_bytes(broken)
        if is_results_file(path):
            with h5py.File(path, "r") as f:
                try:
                    list(f["cases"])
                except RuntimeError:
                    return
        at = data.find(b"SNOD", at + 1)
    path.write_bytes(data)
    pytest.fail("no symbol-table node of /cases found")


def test_a_damaged_list_of_cases_gives_report_one_line_and_resume_reruns(tmp_path, done):
    full = outputs(done)
    _break_case_list(done)
    res = run(["report", "r.h5"], tmp_path)
    one_error_line(res, "the list of its cases cannot be read")
    res = run(["run", "job.toml", "-o", "r.h5", "--resume"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    again = outputs(done)
    assert sorted(again) == sorted(full) and all(np.array_equal(full[c], again[c]) for c in full)
    assert run(["report", "r.h5"], tmp_path).returncode == 0
