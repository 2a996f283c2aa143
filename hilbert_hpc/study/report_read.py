"""Reading results and bandwidth files for ``report``: each complete case as a :class:`CaseResult`.

A case's parameters come from ``params_json`` (the attributes, for files that
lack it), its setup, metrics and accuracy from the fields of the results record
(``record.py``); every statistic is recomputed from the raw timings.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import h5py
import numpy as np

from hilbert_hpc.errors import UserError
from hilbert_hpc.core.work import imbalance
from hilbert_hpc.study import record as rec
from hilbert_hpc.study.parts import output_notes, parts_dir
from hilbert_hpc.study.provenance import CODE_KEYS, code_of
from hilbert_hpc.study.results_read import READ_ERRORS, case_groups


PROGRAM = "hilbert-hpc"


#: The timing of a forward and its backward (their sum per rank and repeat, for :meth:`CaseResult.stats`).
FORWARD_BACKWARD = "attention+backward"


PARAM = "results"
#: The case parameters read from the attributes of a case without ``params_json`` (files of early versions,
#: which predate ``scaling``: their cases are strong).
OLD_PARAMS = tuple(name for name in rec.names(rec.Parameters) if name != "scaling")


@dataclass
class CaseResult:
    """One complete case of a results file, with its parameters and raw timings."""

    file: str
    case_id: str
    params: dict[str, Any]
    timings: dict[str, np.ndarray]
    setup: rec.Setup
    metrics: rec.Metrics
    accuracy: rec.Accuracy
    bookkeeping: rec.Bookkeeping
    _stats: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def transport(self) -> str:
        """The transport the case used (recorded per case); files without the record: the one requested."""
        return self.setup.transport or self.params["transport"]

    @property
    def placement(self) -> str:
        """The placement the case used (recorded per case); files without the record ran contiguous shards."""
        return self.setup.placement or "contiguous"

    @property
    def ranks(self) -> int:
        """Number of ranks the case ran on."""
        return int(self.params["ranks"])

    @property
    def repeats(self) -> int:
        """Number of timed repeats (of the attention timing)."""
        per_rep = self.slowest("attention")
        return 0 if per_rep is None else int(per_rep.size)

    @property
    def tokens(self) -> int:
        """Sequence length N."""
        return int(self.params["tokens"])

    @property
    def backward(self) -> bool:
        """True for a case that timed the backward too (``pass = "forward+backward"``)."""
        return self.params["pass"] == "forward+backward" and "backward" in self.timings

    def slowest(self, name: str) -> np.ndarray | None:
        """Per repeat, the largest value over ranks of timing ``name`` (None when the file lacks it); names
        joined by ``+`` (:data:`FORWARD_BACKWARD`) add those timings per rank and repeat first."""
        parts = [self.timings.get(n) for n in name.split("+")]
        if any(values is None or values.size == 0 for values in parts):
            return None
        values = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
        return np.atleast_2d(values).max(axis=0)

    def stats(self, name: str) -> tuple[float, float, float]:
        """(median, min, max) over repeats of the slowest rank's ``name``; NaNs when absent."""
        if name not in self._stats:
            per_rep = self.slowest(name)
            if per_rep is None:
                self._stats[name] = (math.nan, math.nan, math.nan)
            else:
                self._stats[name] = (float(np.median(per_rep)), float(per_rep.min()), float(per_rep.max()))
        return self._stats[name]

    def median(self, name: str) -> float:
        """Median over repeats of the slowest rank's ``name``."""
        return self.stats(name)[0]

    def imbalance(self, name: str) -> float:
        """Load imbalance of timing ``name`` (:func:`hilbert_hpc.core.work.imbalance`: median over repeats of
        largest / mean across ranks); NaN when the file lacks it (``useful_flops`` before it was recorded)."""
        values = self.timings.get(name)
        return math.nan if values is None or values.size == 0 else imbalance(values)


def plain(value: Any) -> Any:
    """An HDF5 attribute value as a plain Python value."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def is_true(value: Any) -> bool:
    """True only for a boolean attribute that is set."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def _case_params(group: h5py.Group, where: str) -> dict[str, Any]:
    """A case's parameters: ``params_json`` (else the attributes), completed with ``ranks`` and ``scaling``."""
    attrs = group.attrs
    text = plain(attrs.get("params_json"))
    if text:
        try:
            params = json.loads(text)
        except (TypeError, ValueError):
            raise UserError(f"{where}: the attribute params_json is not valid JSON", PARAM) from None
        if not isinstance(params, dict):
            raise UserError(f"{where}: the attribute params_json is not a JSON object", PARAM)
    else:
        params = {key: plain(attrs[key]) for key in OLD_PARAMS if key in attrs}
    if "ranks" not in params:
        if "ranks" in attrs:
            params["ranks"] = int(plain(attrs["ranks"]))
        elif "timings" in group and "attention" in group["timings"]:
            params["ranks"] = int(np.atleast_2d(group["timings"]["attention"][()]).shape[0])
        else:
            raise UserError(f"{where}: the case records no rank count", PARAM)
    params.setdefault("scaling", "strong")
    if "tokens" not in params:
        grid = params.get("grid")
        if not grid:
            raise UserError(f"{where}: the case records neither tokens nor grid", PARAM)
        params["tokens"] = math.prod(grid)
    params["ranks"] = int(params["ranks"])
    params["tokens"] = int(params["tokens"])
    for key, default in (("name", ""), ("backend", ""), ("ordering", "natural"), ("transport", ""), ("batch", 1),
                         ("segment", 0), ("pass", "forward"), ("placement", "auto"),
                         ("long_schedule", "auto")):
        params.setdefault(key, default)
    return params


def _read_case(path: str, cid: str, group: h5py.Group, code: dict[str, str]) -> CaseResult:
    """One complete case group as a CaseResult; a UserError naming the file and case when it is malformed.

    ``code``: the file's root ``version`` and ``git_hash``, the code of a case that does not record its own
    (files of earlier versions)."""
    where = f"{path!r}, case {cid}"
    params = _case_params(group, where)
    timings_group = group.get("timings")
    if not isinstance(timings_group, h5py.Group) or "attention" not in timings_group:
        raise UserError(f"{where}: no timings/attention dataset", PARAM)
    timings = {}
    for name, ds in timings_group.items():
        if isinstance(ds, h5py.Dataset):
            timings[name] = np.asarray(ds[()], dtype=np.float64)
    if timings["attention"].size == 0:
        raise UserError(f"{where}: timings/attention is empty", PARAM)
    groups = {name: group[name].attrs if isinstance(group.get(name), h5py.Group) else {}
              for name in ("metrics", "accuracy")}
    kept = rec.read(rec.Bookkeeping, group.attrs, plain)
    kept = dataclasses.replace(kept, **{key: getattr(kept, key) or code[key] for key in CODE_KEYS})
    return CaseResult(file=path, case_id=cid, params=params, timings=timings,
                      setup=rec.read(rec.Setup, group.attrs, plain),
                      metrics=rec.read(rec.Metrics, groups["metrics"], plain),
                      accuracy=rec.read(rec.Accuracy, groups["accuracy"], plain), bookkeeping=kept)


def read_results_file(path: str | Path) -> tuple[list[CaseResult], int]:
    """The complete cases of one results file and the number of incomplete ones skipped.

    Raises UserError, naming the file, when it is missing, not HDF5, not a
    hilbert-hpc results file, malformed, or holds no complete case.
    """
    name = str(path)
    p = Path(path)
    if not p.exists():
        raise UserError(f"{name!r}: no such file", PARAM)
    if not p.is_file():
        raise UserError(f"{name!r}: not a file", PARAM)
    try:
        is_hdf5 = h5py.is_hdf5(p)
    except OSError as exc:
        raise UserError(f"{name!r}: cannot read the file ({exc})", PARAM) from None
    if not is_hdf5:
        raise UserError(f"{name!r}: not an HDF5 file", PARAM)
    try:
        h5 = h5py.File(p, "r")
    except OSError as exc:
        raise UserError(f"{name!r}: cannot open the HDF5 file ({exc}); if another job is writing it, wait, or "
                        f"set HDF5_USE_FILE_LOCKING=FALSE", PARAM) from None
    with h5:
        cases_group = h5.get("cases")
        if plain(h5.attrs.get("program")) != PROGRAM or not isinstance(cases_group, h5py.Group):
            raise UserError(f"{name!r}: not a hilbert-hpc results file", PARAM)
        cases, skipped = [], 0
        code = code_of({key: plain(value) for key, value in h5.attrs.items() if key in CODE_KEYS})
        try:
            listed = list(case_groups(cases_group))
        except READ_ERRORS as exc:
            raise UserError(f"{name!r}: the list of its cases cannot be read (a damaged file: {exc})",
                            PARAM) from None
        for cid, group, _ in listed:
            if group is None or not is_true(group.attrs.get("complete")):
                skipped += 1             # unfinished, or unreadable (a write cut off by a full disk)
                continue
            try:
                cases.append(_read_case(name, cid, group, code))
            except UserError:
                raise
            except READ_ERRORS:                  # complete but damaged since: counted with the skipped ones
                skipped += 1
    if not cases:
        raise UserError(f"{name!r}: no complete cases (the job may have been stopped before its first case "
                        f"finished)", PARAM)
    return cases, skipped


def params_key(params: dict[str, Any], drop: Iterable[str] = ()) -> str:
    """Canonical text of ``params`` without the keys in ``drop`` (the grouping key)."""
    drop = set(drop)
    return json.dumps({k: v for k, v in params.items() if k not in drop}, sort_keys=True)


#: the case ids a note lists before it stops with "..."
NOTE_IDS = 4


def _case_list(ids: Sequence[str]) -> str:
    """Case ids for a note: all of a few, else the first ones and how many there are."""
    if len(ids) <= NOTE_IDS:
        return ", ".join(ids)
    return f"{', '.join(ids[:NOTE_IDS])}, ... ({len(ids)} cases)"


def code_note(path: str | Path, cases: Sequence[CaseResult]) -> str | None:
    """A note when the cases of one results file were computed by more than one version of the code (a resume by
    other code), naming each version and its cases; None when one code computed them all."""
    by_code: dict[tuple[str, str], list[str]] = {}
    for case in cases:
        by_code.setdefault((case.bookkeeping.version, case.bookkeeping.git_hash), []).append(case.case_id)
    if len(by_code) < 2:
        return None
    versions = "; ".join(f"{version or '?'} (git {commit or '?'}): {_case_list(ids)}"
                         for (version, commit), ids in by_code.items())
    return f"{str(path)!r}: its cases were computed by {len(by_code)} versions of the code: {versions}"


def finish_time(case: CaseResult) -> datetime.datetime | None:
    """When the case was written (its ``finished_utc``), None when it does not say."""
    try:
        when = datetime.datetime.fromisoformat(case.bookkeeping.finished_utc)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def later_case(earlier: CaseResult, given_later: CaseResult) -> tuple[CaseResult, str]:
    """Which of two cases with the same parameters report keeps, and the note's words for why: the one that
    finished later by ``finished_utc``; when that does not tell, the one of the file given later."""
    times = finish_time(earlier), finish_time(given_later)
    if None not in times and times[0] != times[1]:
        kept = given_later if times[1] > times[0] else earlier
        return kept, (f"keeping the one that finished later ({kept.file!r}, {kept.case_id}, finished "
                      f"{kept.bookkeeping.finished_utc})")
    why = (f"both finished at {given_later.bookkeeping.finished_utc}" if None not in times
           else "no finish time to tell which ran later")
    return given_later, (f"keeping the one of the file given later ({given_later.file!r}, {given_later.case_id}): "
                         f"{why}")


def load_cases(paths: Sequence[str | Path]) -> tuple[list[CaseResult], list[str]]:
    """Pool the complete cases of ``paths`` (in order) and return them with note lines.

    Cases with identical parameters (including ``ranks`` and ``scaling``) are
    kept once: the one that finished later (:func:`later_case`) wins. A file
    whose cases were computed by several versions of the code gets a note
    (:func:`code_note`).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UserError("give at least one results file", PARAM)
    pooled: dict[str, CaseResult] = {}
    notes: list[str] = []
    for path in paths:
        cases, skipped = read_results_file(path)
        if skipped:
            notes.append(f"{str(path)!r}: {skipped} incomplete case(s) skipped (unfinished or unreadable)")
        notes += output_notes(path)              # complete cases whose saved output is lost or damaged
        notes += [note for note in (code_note(path, cases),) if note]
        for case in cases:
            key = params_key(case.params)
            old = pooled.get(key)
            if old is not None:
                kept, why = later_case(old, case)
                notes.append(f"case {case.case_id} of {case.file!r} has the parameters of case {old.case_id} of "
                             f"{old.file!r}; {why}")
                if kept is old:
                    continue
                del pooled[key]
            pooled[key] = case
    return list(pooled.values()), notes


@dataclass
class BandwidthSweep:
    """One ``hilbert-hpc bandwidth -o`` file: the ring exchange rate per message size of one transport."""

    file: str
    transport: str
    device: str
    ranks: int
    host: str
    sizes: list[tuple[int, float]]


def _root_study(path: str | Path) -> str | None:
    """The ``study`` root attribute of a hilbert-hpc HDF5 file (None for anything else or an unreadable file)."""
    try:
        with h5py.File(path, "r") as h5:
            if plain(h5.attrs.get("program")) != PROGRAM:
                return None
            study = plain(h5.attrs.get("study"))
            return str(study) if study else None
    except Exception:  # noqa: BLE001 - not HDF5, missing or unreadable: read_results_file says which
        return None


def read_bandwidth_file(path: str | Path) -> BandwidthSweep:
    """The sweep of a bandwidth file; a UserError naming the file when it is malformed."""
    name = str(path)
    try:
        with h5py.File(path, "r") as h5:
            ds = h5.get("bandwidth")
            data = np.asarray(ds[()], dtype=np.float64) if isinstance(ds, h5py.Dataset) else None
            attrs = {key: plain(value) for key, value in ds.attrs.items()} if data is not None else {}
            host = str(plain(h5.attrs.get("host", "")))
    except READ_ERRORS as exc:
        raise UserError(f"{name!r}: the bandwidth file cannot be read ({exc})", PARAM) from None
    if data is None or data.ndim != 2 or data.shape[1] != 2:
        raise UserError(f"{name!r}: a bandwidth file without a (sizes, 2) dataset 'bandwidth'", PARAM)
    return BandwidthSweep(file=name, transport=str(attrs.get("transport", "?")), device=str(attrs.get("device", "?")),
                          ranks=int(attrs.get("ranks", 0) or 0), host=host,
                          sizes=[(int(b), float(r)) for b, r in data])


def _owned_by(path: str | Path) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """What a results file owns or names, which a report never writes: (files, folders), each with what it is.

    Files: the results file, its job file (root ``job_path``) and the cases'
    ``input`` files; folders: its output parts folder (``results.parts_dir``)
    and the folders its cases' outputs point to. Relative names count both from
    the current folder and from the results file's folder.
    """
    path = Path(path)
    files: list[tuple[Path, str]] = [(path, "file given to report")]
    folders: list[tuple[Path, str]] = [(parts_dir(path), f"output parts folder of {str(path)!r}")]

    def named(value: Any, what: str) -> None:
        text = plain(value)
        if isinstance(text, str) and text:
            files.extend([(Path(text), what), (path.parent / text, what)])

    try:
        h5 = h5py.File(path, "r")
    except Exception:  # noqa: BLE001 - not HDF5 or unreadable: it names nothing more
        return files, folders
    with h5:
        named(h5.attrs.get("job_path"), f"job file of {str(path)!r}")
        cases = h5.get("cases")
        for cid, group, _ in (case_groups(cases) if isinstance(cases, h5py.Group) else ()):
            try:
                named(group.attrs.get("input"), f"input file of case {cid}")
                output = group.get("output")
                parts = json.loads(plain(output.attrs.get("parts", "[]"))) if output is not None else []
            except Exception:  # noqa: BLE001 - a damaged case names nothing more
                continue
            for part in parts:
                top = Path(str(part)).parts
                if len(top) > 1:
                    folders.append((path.parent / top[0], f"output parts folder of {str(path)!r}"))
    return files, folders


@dataclass
class Loaded:
    """What the files given to a report hold, and what of theirs the report must never write."""

    cases: list[CaseResult]
    sweeps: list[BandwidthSweep]
    notes: list[str]
    protected_files: list[tuple[Path, str]]
    protected_folders: list[tuple[Path, str]]


def load_files(paths: Sequence[str | Path]) -> Loaded:
    """Read results files (pooled by :func:`load_cases`) and bandwidth files, in the order given."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise UserError("give at least one results file", PARAM)
    is_sweep = {str(p): _root_study(p) == "bandwidth" for p in paths}
    results = [p for p in paths if not is_sweep[str(p)]]
    sweeps = [read_bandwidth_file(p) for p in paths if is_sweep[str(p)]]
    cases, notes = load_cases(results) if results else ([], [])
    files: list[tuple[Path, str]] = []
    folders: list[tuple[Path, str]] = []
    for path in paths:
        owned_files, owned_folders = _owned_by(path)
        files += owned_files
        folders += owned_folders
    return Loaded(cases, sweeps, notes, files, folders)
