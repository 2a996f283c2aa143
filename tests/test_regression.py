"""Regression checks (docs/studies.md, "Regression checks"): references, ``report --check``, the perflog and its
history, ``report --json``, and the shipped ReFrame check run with ReFrame's local launcher."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hilbert_hpc.cli import main
from hilbert_hpc.errors import UserError
from hilbert_hpc.study.perflog import HEADER, append_perflog, read_perflog
from hilbert_hpc.study.regression import Figure, Reference, check, read_references

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "jobs" / "regression_cpu.toml"


def _loosened(text: str) -> str:
    """A saved references text with the time and rate bounds widened to what a busy CI machine keeps to
    (a time up to 4x, a rate down to a quarter)."""
    text = text.replace(', -0.1, 0.1, "s"]', ', false, 3.0, "s"]')
    return text.replace(', -0.1, 0.1, "TFLOP/s"]', ', -0.75, false, "TFLOP/s"]')


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ):
    """The regression job run twice on one rank: as it is, then with every attention call slowed by 50 ms."""
    tmp = tmp_path_factory.mktemp("regression")
    assert main(["run", str(JOB), "-o", str(tmp / "first.h5")]) == 0
    from hilbert_hpc.backends.numpy_backend import NumpyBackend

    original = NumpyBackend.serialized_attention

    def slowed(self, *args, **kwargs):
        time.sleep(0.05)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NumpyBackend, "serialized_attention", slowed)
        assert main(["run", str(JOB), "-o", str(tmp / "slowed.h5")]) == 0
    return tmp


def test_a_run_passes_its_references_and_a_slowed_run_fails_them(runs, capsys):
    """References saved from the first run (bounds widened) pass a check of that run and fail the slowed one,
    exit 1, naming the figure; the perflog holds both runs' lines, with their verdicts, in order."""
    refs, log = runs / "refs.toml", runs / "perflog.txt"
    assert main(["report", str(runs / "first.h5"), "--save-references", str(refs), "--system", "ci"]) == 0
    assert refs.read_text().startswith("# hilbert-hpc references")
    refs.write_text(_loosened(refs.read_text()))
    capsys.readouterr()
    assert main(["report", str(runs / "first.h5"), "--check", str(refs), "--system", "ci",
                 "--perflog", str(log)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"6 figure\(s\) checked: 6 passed, 0 failed", out), out
    assert main(["report", str(runs / "slowed.h5"), "--check", str(refs), "--system", "ci",
                 "--perflog", str(log)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"0000-grid32x32 .*attention_s .*FAIL", out) and "2 passed, 4 failed" in out, out
    entries = read_perflog(log)
    assert log.read_text().splitlines()[0] == HEADER and len(entries) == 12
    times = [e for e in entries if e.figure == "attention_s" and e.case == "0000-grid32x32"]
    assert [e.result for e in times] == ["pass", "fail"] and times[1].value > 10 * times[0].value
    assert {e.system for e in entries} == {"ci"} and {e.job for e in entries} == {"regression_cpu"}


def test_the_history_of_a_perflog_is_a_table_and_a_plot(runs, tmp_path, capsys):
    """``report --history`` prints every run of a figure, oldest first, and plots it; a figure the perflog
    lacks is one clear error."""
    log = tmp_path / "perflog.txt"
    for name in ("first.h5", "slowed.h5"):
        assert main(["report", str(runs / name), "--perflog", str(log), "--system", "ci"]) == 0
    capsys.readouterr()
    assert main(["report", "--history", str(log), "--figure", "attention_s", "--plot", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if " attention_s " in line]
    assert len(rows) == 4 and (tmp_path / "p" / "history_attention_s.png").stat().st_size > 0
    assert main(["report", "--history", str(log), "--figure", "nope"]) == 2
    assert "has no figure 'nope'" in capsys.readouterr().err


def test_report_json_holds_every_case_with_its_figures(runs, capsys):
    """``report --json`` prints only JSON: each case, its accuracy verdict and figures with their ranges."""
    capsys.readouterr()
    assert main(["report", str(runs / "first.h5"), "--json", "--system", "x"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["system"] == "x" and [c["case"] for c in doc["cases"]] == ["0000-grid32x32", "0001-grid32x32"]
    for case in doc["cases"]:
        t = case["figures"]["attention_s"]
        assert case["within_tolerance"] and t["min"] <= t["value"] <= t["max"] and t["unit"] == "s"


def test_a_figure_whose_repeats_straddle_a_threshold_says_so():
    ref = Reference(1.0, -0.1, 0.1, "s")
    inside = Figure("c", "n", "attention_s", 1.05, 0.95, 1.2, "s")
    outside = Figure("c", "n", "attention_s", 1.15, 1.05, 1.3, "s")
    clear = Figure("c", "n", "attention_s", 1.5, 1.4, 1.6, "s")
    verdicts = check([inside, outside, clear], {"c": {"attention_s": ref}})
    assert [(v.result, v.note) for v in verdicts] == [
        ("pass", "the repeats straddle a threshold"), ("fail", "the repeats straddle a threshold: some repeats pass"),
        ("fail", "")]
    unbounded = Reference(2.0, None, 9.0, "1")
    assert unbounded.bounds() == (float("-inf"), 20.0)


@pytest.mark.parametrize("text,message", [
    (None, "does not exist"),
    ("[references", "is not valid TOML"),
    ("x = 1", "has no [references"),
    ('[references.other.c]\nattention_s = [1.0, -0.1, 0.1, "s"]', "no references for system 'ci'"),
    ('[references.ci.c]\nspeed = [1.0, -0.1, 0.1, "s"]', "unknown figure"),
    ('[references.ci.c]\nattention_s = [1.0, -0.1]', "a reference is [value, lower, upper"),
    ('[references.ci.c]\nattention_s = ["a", -0.1, 0.1, "s"]', "must be a number"),
])
def test_a_bad_references_file_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "refs.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        read_references(path, "ci")


def test_references_of_system_star_stand_in_and_no_matching_case_is_refused(runs, tmp_path, capsys):
    refs = tmp_path / "refs.toml"
    refs.write_text('[references."*".other]\nattention_s = [1.0, -0.1, 0.1, "s"]\n')
    assert read_references(refs, "anything") == {"other": {"attention_s": Reference(1.0, -0.1, 0.1, "s")}}
    assert main(["report", str(runs / "first.h5"), "--check", str(refs)]) == 2
    assert "name no case and figure of these results" in capsys.readouterr().err


def test_saved_references_never_replace_a_file_report_did_not_write(runs, tmp_path, capsys):
    mine = tmp_path / "notes.toml"
    mine.write_text("my notes\n")
    assert main(["report", str(runs / "first.h5"), "--save-references", str(mine)]) == 2
    assert mine.read_text() == "my notes\n" and "not replaced" in capsys.readouterr().err
    refs = tmp_path / "refs.toml"
    assert main(["report", str(runs / "first.h5"), "--save-references", str(refs)]) == 0
    assert main(["report", str(runs / "first.h5"), "--save-references", str(refs)]) == 2
    assert main(["report", str(runs / "first.h5"), "--save-references", str(refs), "--overwrite"]) == 0


def test_a_perflog_refuses_a_file_that_is_not_one(tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("something else\n")
    with pytest.raises(UserError, match="is not a hilbert-hpc perflog"):
        append_perflog(other, ["a|b"])
    assert other.read_text() == "something else\n"


def _append_many(path: str, writer: int) -> None:
    for block in range(20):
        append_perflog(path, [f"{writer}|{block}|{i}|" + "x" * 2000 for i in range(25)])


def test_concurrent_appends_never_interleave(tmp_path):
    """Four processes append 20 blocks of 25 long lines each at once: every block stays whole, in order."""
    path = tmp_path / "perflog.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert lines[0] == HEADER and len(lines) == 1 + 4 * 20 * 25
    body = [line.split("|")[:3] for line in lines[1:]]
    for start in range(0, len(body), 25):
        block = body[start:start + 25]
        assert len({(w, b) for w, b, _ in block}) == 1 and [int(i) for *_, i in block] == list(range(25))


def test_the_shipped_reframe_check_runs_with_the_local_launcher(tmp_path):
    """reframe/hilbert_hpc_check.py under ReFrame (reframe/settings.py: this machine, local launcher): the
    job runs, every case passes its sanity check and reports its figures against the example references."""
    pytest.importorskip("reframe")
    from importlib.metadata import entry_points

    (command,) = [e for e in entry_points(group="console_scripts") if e.name == "reframe"]   # its `reframe`
    module, function = command.value.split(":")
    reframe = [sys.executable, "-c", f"import sys; from {module} import {function}; sys.argv[0] = 'reframe'; "
                                     f"sys.exit({function}())"]
    done = subprocess.run([*reframe, "-C", str(ROOT / "reframe" / "settings.py"), "-c",
                           str(ROOT / "reframe" / "hilbert_hpc_check.py"), "-r", "--prefix", str(tmp_path / "rf"),
                           "-S", f"python={sys.executable}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ran 1/1 test case(s)" in done.stdout and "0 failure(s)" in done.stdout, done.stdout
    assert re.search(r"P: 0000-grid32x32\.attention_s: [0-9.e-]+ s \(r:0\.002", done.stdout), done.stdout


def test_a_strong_scaling_case_has_its_speedup_and_efficiency_with_their_ranges():
    """The scaling table's speedup [min, max] and the efficiency (speedup x p0 / P) with the same range."""
    from hilbert_hpc.study.regression import figures_of_merit

    case = {"case": "c2", "name": "n", "attention_s": 0.5, "attention_min_s": 0.4, "attention_max_s": 0.6}
    base = dict(case, case="c1")
    scaling = [{"case": "c1", "speedup": 1.0, "efficiency": 1.0, "speedup_min": 0.8, "speedup_max": 1.2, "noise": ""},
               {"case": "c2", "speedup": 1.6, "efficiency": 0.8, "speedup_min": 1.4, "speedup_max": 1.8,
                "noise": "resolved"}]
    figures = {(f.case, f.figure): f for f in figures_of_merit({"cases": [base, case], "strong_scaling": scaling})}
    assert ("c1", "speedup") not in figures                  # the base of its series has none
    speedup, efficiency = figures["c2", "speedup"], figures["c2", "efficiency"]
    assert (speedup.value, speedup.low, speedup.high) == (1.6, 1.4, 1.8)
    assert (efficiency.value, efficiency.low, efficiency.high) == pytest.approx((0.8, 0.7, 0.9))
    assert (figures["c2", "attention_s"].low, figures["c2", "attention_s"].high) == (0.4, 0.6)


def test_a_failed_append_leaves_the_perflog_as_it_was(tmp_path, monkeypatch):
    """A write that fails part way (a full disk) is cut back off: the perflog keeps its earlier lines whole."""
    path = tmp_path / "logs" / "perflog.txt"
    append_perflog(path, ["2026|s|j|c|n|attention_s|1.0|s||||"])
    before = path.read_text()

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text):
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.handle, name)

    from contextlib import contextmanager

    import hilbert_hpc.study.perflog as perflog

    real = perflog._locked

    @contextmanager
    def locked(p):
        with real(p) as handle:
            yield FullDisk(handle)

    monkeypatch.setattr(perflog, "_locked", locked)
    with pytest.raises(UserError, match="No space left on device; the perflog is left as it was"):
        append_perflog(path, ["2027|s|j|c|n|attention_s|2.0|s||||" + "x" * 100])
    assert path.read_text() == before and len(read_perflog(path)) == 1
