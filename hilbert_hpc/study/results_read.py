"""Reading a results file safely: one damaged case never hides the others.

``case_groups`` is how every reader (resume, report, the saved-output checks)
walks the cases of a results file (docs/results.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import h5py


#: what h5py raises for an object it cannot read (damage, or a write cut off by a full disk)
READ_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def case_groups(cases: h5py.Group, names: Iterable[str] = ()) -> Iterator[tuple[str, h5py.Group | None, str]]:
    """``(case id, group, "")`` for each case of a results file, ``(case id, None, why)`` for unreadable ones.

    Goes by name, so one damaged case does not hide the others. If the list of
    cases itself cannot be read, the cases called ``names`` are looked up one by
    one instead (a resume knows its job's case ids); with no names the read error
    is raised.
    """
    try:
        ids = list(cases)
    except READ_ERRORS:
        if not names:
            raise
        ids = [n for n in names if _exists(cases, n)]
    for cid in ids:
        try:
            group = cases[cid]
            if not isinstance(group, h5py.Group):
                raise TypeError("not a group")
            group.attrs.get("complete")
        except READ_ERRORS as exc:
            yield cid, None, str(exc)
            continue
        yield cid, group, ""


def _exists(group: h5py.Group, name: str) -> bool:
    try:
        return name in group
    except READ_ERRORS:
        return False


def is_results_file(path: Path) -> bool:
    """True when ``path`` is an HDF5 file written by ``hilbert-hpc run`` (program attribute and /cases)."""
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("program") == "hilbert-hpc" and isinstance(f.get("cases"), h5py.Group)
    except Exception:  # noqa: BLE001 - not HDF5, damaged beyond opening, or unreadable: not one of ours
        return False
