"""Job file texts for the tests, built from keys instead of TOML pasted into every test file.

``job_text(name="tiny", **QUICK, defaults={...}, cases=[{...}])`` gives the text of a job file: the [job] keys
as keyword arguments, the [defaults] table, then one [[cases]] table per case, a case's ``sweep`` (a dict) as its
[cases.sweep] table. A test that needs the same job with a key or two changed keeps a ``JobSpec`` and asks
``spec.but(...)`` for the variant. The writer knows the value types job files use (strings, booleans, integers,
floats and lists of them); tomllib reads back exactly the keys given, in their order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the [job] keys of a small, fast job: one timed call, no warm-up, four rows checked
QUICK: dict[str, Any] = {"repeats": 1, "warmup": 0, "accuracy_rows": 4}


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


#: a value for ``JobSpec.but`` that removes the key instead of setting it
DROP: Any = _Drop()

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class JobSpec:
    """A job file's content: the [job] keys, the [defaults] keys and the [[cases]] tables (empty ones are left out)."""

    job: Mapping[str, Any]
    cases: Sequence[Mapping[str, Any]]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """The job as the dict tomllib reads from its text."""
        doc: dict[str, Any] = {}
        for key, value in (("job", self.job), ("defaults", self.defaults)):
            if value:
                doc[key] = dict(value)
        if self.cases:
            doc["cases"] = [dict(case) for case in self.cases]
        return doc

    def text(self) -> str:
        """The job file's text."""
        return toml_text(self.document())

    def but(self, *, defaults: Mapping[str, Any] | None = None, case: Mapping[str, Any] | None = None,
            cases: Sequence[Mapping[str, Any]] | None = None, **job: Any) -> JobSpec:
        """This job with keys changed: ``job`` in [job], ``defaults`` in [defaults], ``case`` in every case,
        or ``cases`` in place of all of them; a value ``DROP`` removes its key."""
        new_cases = list(self.cases if cases is None else cases)
        if case:
            new_cases = [changed(c, case) for c in new_cases]
        return JobSpec(changed(self.job, job), new_cases, changed(self.defaults, defaults or {}))

    def but_case(self, index: int, changes: Mapping[str, Any]) -> JobSpec:
        """This job with ``changes`` in case ``index`` only (``DROP`` removes a key)."""
        return self.but(cases=[changed(c, changes) if i == index else c for i, c in enumerate(self.cases)])


def job_text(*, cases: Sequence[Mapping[str, Any]], defaults: Mapping[str, Any] | None = None, **job: Any) -> str:
    """The text of a job file with the [job] keys ``job``, the [defaults] keys ``defaults`` and ``cases``."""
    return JobSpec(job, cases, defaults or {}).text()


def changed(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``changes`` set (new keys at the end), the keys whose change is ``DROP`` removed."""
    out = {**base, **changes}
    return {key: value for key, value in out.items() if value is not DROP}


# --- the TOML writer -------------------------------------------------------------------------------------------------

def toml_text(doc: Mapping[str, Any]) -> str:
    """TOML for ``doc``: dict values become tables, lists of dicts arrays of tables, the rest ``key = value``."""
    lines: list[str] = []
    _write_table(lines, [], doc, array=False)
    return "\n".join(lines) + "\n"


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_table(v) for v in value)


def _write_table(lines: list[str], path: list[str], table: Mapping[str, Any], array: bool) -> None:
    """Append ``table`` at ``path``: its header (none at the top), its plain keys, then its tables."""
    if path:
        name = ".".join(_key(p) for p in path)
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    for key, value in table.items():
        if not (_is_table(value) or _is_table_array(value)):
            lines.append(f"{_key(key)} = {toml_value(value)}")
    for key, value in table.items():
        if _is_table(value):
            _write_table(lines, [*path, key], value, array=False)
        elif _is_table_array(value):
            for item in value:
                _write_table(lines, [*path, key], item, array=True)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def toml_value(value: Any) -> str:
    """One TOML value: a string, boolean, integer, float or (nested) list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"value: no TOML spelling for {type(value).__name__} {value!r}")


def _float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    return text if any(c in text for c in ".e") else text + ".0"


def _string(value: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    escapes = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
    out = []
    for char in value:
        if char in escapes:
            out.append(escapes[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def run_on_every_rank(text: str, tmp_path_factory: Any, name: str) -> Any:
    """Run the job ``text`` on every rank of MPI.COMM_WORLD in one temporary folder (rank 0's); returns the
    results file's path on rank 0 and None on the others, after every rank has finished."""
    import io
    from pathlib import Path

    from mpi4py import MPI

    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp(name)) if comm.Get_rank() == 0 else None))
    job = load_job(tmp / "job.toml", text=text, world_size=comm.Get_size())
    out = run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    return out if comm.Get_rank() == 0 else None
