"""The results record (hilbert_hpc/study/record.py): documented field by field, and the one definition that the
writer and report's reader use."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest

from hilbert_hpc.study import record as rec
from clirun import run_in_process
from jobtext import JobSpec

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"

TINY = JobSpec({"name": "record", "repeats": 2, "warmup": 0, "accuracy_rows": 4},
               defaults={"heads": 2, "head_dim": 8, "dtype": "float32", "backend": "numpy"},
               cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 4]]}])


def documented_rows() -> list[tuple[str, ...]]:
    """The rows of the record table of docs/results.md."""
    text = DOC.read_text()
    found = re.search(r"<!-- record table: begin -->\n(.*?)<!-- record table: end -->", text, re.S)
    assert found, "docs/results.md has no record table"
    lines = [line for line in found.group(1).splitlines() if line.startswith("|")][2:]   # title and rule
    return [tuple(cell.strip() for cell in line.strip("|").split(" | ")) for line in lines]


def test_every_field_is_documented_with_its_unit_and_nothing_else():
    documented = documented_rows()
    fields = rec.doc_rows()
    assert all(len(row) == 5 and row[3] for row in documented), "every documented field has a unit"
    missing = [row[:2] for row in fields if row not in documented]
    extra = [row[:2] for row in documented if row not in fields]
    assert not missing, f"fields of record.py that docs/results.md does not document (as record.doc_rows()): {missing}"
    assert not extra, f"docs/results.md documents fields that record.py lacks: {extra}"
    assert documented == fields, "docs/results.md lists the fields in the record's order"


def test_every_field_has_a_unit_and_a_meaning():
    for group in rec.GROUPS:
        for f in dataclasses.fields(group):
            assert f.metadata["unit"] and f.metadata["meaning"], f"{group.__name__}.{f.name}"


@pytest.mark.parametrize("field, direction", [("kernel", "forward"), ("backward_kernel", "backward")])
def test_the_layout_lists_the_kernel_variants_the_backends_record(field, direction):
    """The record's meaning and the layout name each direction's families of the registry, per dtype."""
    from hilbert_hpc.kernels.registry import families_for

    meaning = dict(((g, n), m) for g, n, _, _, m in rec.doc_rows())[("case attrs", field)]
    for dtypes, clause in ((("float32",), "cuda-fp32 and cuda"), (("bfloat16", "float16"), "cuda 16-bit")):
        registered = {f.name for d in dtypes for f in families_for(d, direction)}
        listed = re.search(rf"{clause}: ([^;]*);", meaning)
        assert listed, f"the meaning of {field} has no '{clause}: ...;' clause: {meaning}"
        assert set(re.split(r", | or ", listed.group(1))) == registered, (field, clause, sorted(registered))
    assert re.search(r"\bnone\b", meaning)
    layout = DOC.read_text().split("## The case record")[0]
    listed = re.search(rf"\b{field} \(([^)]*)\)", layout)
    assert listed, f"docs/results.md's layout has no '{field} (...)'"
    missing = [f.name for d in ("float32", "bfloat16") for f in families_for(d, direction)
               if not re.search(rf"\b{f.name}\b", listed.group(1))]
    assert not missing, f"docs/results.md's layout omits the {direction} kernels {missing} after {field}"


def test_parameters_are_the_case_params():
    from hilbert_hpc.study.jobfile import load_job

    case = load_job("job.toml", text=TINY.text(), world_size=1).cases[0]
    assert list(case.params()) == list(rec.names(rec.Parameters))
    assert case.params() == {rec.key(f): value for f, value in
                             zip(dataclasses.fields(rec.Parameters), dataclasses.astuple(rec.Parameters.of(case)))}
    assert case.params()["pass"] == "forward"


def test_pass_is_a_case_parameter_old_files_read_as_forward():
    """``pass`` is a sweepable case key in the parameters (resume matches on it); only backends whose
    ``passes`` hold it accept forward+backward, refused in one line naming the case's pass."""
    from hilbert_hpc.backends import BACKENDS
    from hilbert_hpc.errors import JobFileError
    from hilbert_hpc.study.jobfile import load_job

    text = TINY.but(case={"sweep": {"pass": ["forward", "forward+backward"]}}).text()
    cases = load_job("job.toml", text=text, world_size=1).cases
    assert [c.params()["pass"] for c in cases] == ["forward", "forward+backward"]
    others = [name for name, cls in BACKENDS.items() if "forward+backward" not in cls.passes]
    assert others and "numpy" not in others
    bad = TINY.but(case={"backend": others[0], "pass": "forward+backward"}).text()
    with pytest.raises(JobFileError) as err:
        load_job("job.toml", text=bad, world_size=1)
    assert "cases[0].pass" in str(err.value) and "runs on backend numpy" in str(err.value)


#: run in a fresh interpreter: one line added to the record (a setup field shown in report's table), then the
#: unchanged run and report
ADD_A_FIELD = textwrap.dedent("""
    import dataclasses, sys
    from hilbert_hpc.study import record as rec

    rec.Setup = dataclasses.make_dataclass(
        "Setup", [("probe", str, rec.entry("-", "a field added by a test", default="added", column="probe"))],
        bases=(rec.Setup,), frozen=True)
    from hilbert_hpc.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_field_added_to_the_record_reaches_the_file_and_the_report(tmp_path):
    (tmp_path / "job.toml").write_text(TINY.text())
    env = dict(os.environ, PYTHONPATH=str(ROOT), HDF5_USE_FILE_LOCKING="FALSE")

    def cli(*args: str) -> None:
        done = subprocess.run([sys.executable, "-c", ADD_A_FIELD, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr

    cli("run", "job.toml", "-o", "r.h5")
    cli("report", "r.h5", "--csv", "r.csv")
    with h5py.File(tmp_path / "r.h5") as f:
        (group,) = f["cases"].values()
        assert group.attrs["probe"] == "added"
        units = json.loads(group["metrics"].attrs["units"])
        assert units == rec.units(rec.Metrics)
    with (tmp_path / "r.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["table"] == "cases" and rows[0]["probe"] == "added"


def test_the_writer_stores_every_field_of_the_record(tmp_path):
    from hilbert_hpc.study.results_read import case_groups

    (tmp_path / "job.toml").write_text(TINY.text())
    done = run_in_process(["run", "job.toml", "-o", "r.h5"], tmp_path, env={"HDF5_USE_FILE_LOCKING": "FALSE"})
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        ((_, group, _),) = list(case_groups(f["cases"]))
        attrs = set(group.attrs)
        assert set(rec.names(rec.Parameters) + rec.names(rec.Setup) + rec.names(rec.Bookkeeping)) - attrs \
            == {"input_sha256"}                                  # the case reads no input file
        assert set(group["timings"]) == set(rec.names(rec.Timings))
        for f_ in dataclasses.fields(rec.Timings):
            assert group["timings"][f_.name].attrs["units"] == rec.unit(f_)
        assert set(group["metrics"].attrs) == set(rec.names(rec.Metrics)) | {"units"}
        assert set(group["accuracy"].attrs) == set(rec.names(rec.Accuracy))


@pytest.mark.parametrize("group", rec.GROUPS, ids=lambda g: g.__name__)
def test_groups_name_where_they_go(group):
    assert group.PLACE in {row[0] for row in documented_rows()}
