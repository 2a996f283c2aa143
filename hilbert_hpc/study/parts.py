"""The output parts folder of a results file, and the one check of a saved output.

``<results>.parts/`` carries an ``OWNER`` file naming the results file (its
``results_id``); each case's part files record that identity, the case and the
SHA-256 of their blocks (docs/results.md, "Checksums").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np

from hilbert_hpc.study.output_files import OutputError, move_into_place, os_reason, remove_quietly, temporary_name
from hilbert_hpc.study.record import SAVED, saved_datasets
from hilbert_hpc.study.results_read import READ_ERRORS, case_groups


#: suffix of the folder of a results file's output parts
PARTS_SUFFIX = ".parts"
#: the file in a parts folder that names the results file (by its ``results_id``) the folder belongs to
OWNER_FILE = "OWNER"
#: bytes read at a time when checksumming (input files, output parts)
CHUNK_BYTES = 1 << 24


def parts_dir(results_path: Path) -> Path:
    """Folder of the per-rank output files of a results file: its whole name + ``.parts`` (``x.h5`` ->
    ``x.h5.parts``), so that ``x.h5``, ``x.hdf5`` and ``x`` never share one.

    Files of earlier versions used ``<stem>.parts``; their cases name their part
    files (relative to the results file), so they stay readable.
    """
    results_path = Path(results_path)
    return results_path.with_name(results_path.name + PARTS_SUFFIX)


def parts_owner(parts: Path) -> str | None:
    """The ``results_id`` that the parts folder's OWNER file names; None when there is none (no folder, a
    symbolic link, no or an unreadable OWNER file)."""
    try:
        if parts.is_symlink() or not parts.is_dir():
            return None
        lines = (parts / OWNER_FILE).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    found = [line.split()[1] for line in lines if line.startswith("results_id ") and len(line.split()) == 2]
    return found[0] if found else None


def make_parts_dir(results_path: Path, results_id: str) -> None:
    """Create the parts folder of ``results_path`` (if missing) and name its owner; call with the lock held.

    A new folder is made under a temporary name with its OWNER file inside and renamed into place, so a
    run killed at any moment leaves either no parts folder or one that names its owner (never an ownerless
    folder that a resume would have to refuse). Raises what the file system raised (OSError).
    """
    parts = parts_dir(results_path)
    if parts.is_dir() and not parts.is_symlink():
        _write_owner(parts, results_path, results_id)
        return
    tmp_dir = temporary_name(parts)
    try:
        tmp_dir.mkdir()
        _write_owner(tmp_dir, results_path, results_id)
        move_into_place(tmp_dir, parts)
    except BaseException:
        remove_quietly(tmp_dir / OWNER_FILE)
        try:
            tmp_dir.rmdir()
        except OSError:
            pass
        raise


def _write_owner(folder: Path, results_path: Path, results_id: str) -> None:
    """Write ``folder``'s OWNER file (temporary name, then rename)."""
    owner = folder / OWNER_FILE
    tmp = temporary_name(owner)
    try:
        tmp.write_text(f"output parts of the hilbert-hpc results file {results_path.name}\n"
                       f"results_id {results_id}\n")
        move_into_place(tmp, owner)
    except BaseException:
        remove_quietly(tmp)
        raise


def refuse_foreign_parts(parts: Path, results_path: Path, results_id: str | None) -> None:
    """Refuse a parts folder that is a symbolic link, or (``results_id`` given) that names another owner.

    Parts are written only into a real folder that belongs to this results file,
    so two results files can never exchange outputs.
    """
    if parts.is_symlink():
        raise OutputError(f"{str(parts)!r} is a symbolic link; output parts are written only into a real folder "
                          f"next to {results_path.name!r}: replace the link by a folder, or write to another "
                          f"file with -o", "output")
    if results_id is not None and parts.exists() and parts_owner(parts) != results_id:
        raise OutputError(f"{str(parts)!r} does not belong to {results_path.name!r} (its {OWNER_FILE} file names "
                          f"another results file, or is missing); move it away, or write to another file with -o",
                          "output")


def check_parts_are_ours(parts: Path) -> None:
    """Refuse to remove a ``.parts`` folder holding anything but case folders of output files."""
    if not parts.exists():
        return
    strange = [p for p in parts.rglob("*") if not (p.is_dir() and p.parent == parts)
               and not (p.is_file() and p.parent.parent == parts and p.suffix == ".h5")
               and not (p.is_file() and p == parts / OWNER_FILE)]
    if not parts.is_dir() or strange:
        example = str(strange[0]) if strange else str(parts)
        raise OutputError(f"{str(parts)!r} holds files that are not output parts (e.g. {example!r}); it is not "
                          f"removed: move it away first", "output")


def block_digest(block: np.ndarray) -> str:
    """SHA-256 of an output block's bytes (C order, as stored): what a part's checksum is."""
    return hashlib.sha256(np.ascontiguousarray(block).reshape(-1).view(np.uint8)).hexdigest()


def _stored_digest(ds: h5py.Dataset, lo: int, hi: int) -> str:
    """:func:`block_digest` of ``ds[:, lo:hi]``, read a few MiB at a time."""
    digest = hashlib.sha256()
    row = max(1, int(np.prod(ds.shape[2:], dtype=np.int64)) * ds.dtype.itemsize)
    step = max(1, CHUNK_BYTES // row)
    for b in range(ds.shape[0]):
        for t in range(lo, hi, step):
            digest.update(np.ascontiguousarray(ds[b, t:min(hi, t + step)]).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def output_problem(group: h5py.Group, results_path: Path, results_id: str | None) -> str | None:
    """Why a case's saved output cannot be trusted, naming the part, or None: the one check of resume and report.

    Every part file the case's ``output`` lists must be there, readable, of the
    right shape and dtype, belong to this results file (``results_id``) and this
    case, and its data must match the SHA-256 the case recorded for each rank's
    block; so must the gradients a forward+backward case saves beside it
    (``record.saved_datasets``), which must be there. Cases of earlier versions (no ``results_id``, no
    checksums) are checked for presence, shape and dtype only.
    """
    cid = group.name.rsplit("/", 1)[-1]
    try:
        wanted = saved_datasets(str(group.attrs.get("pass", "forward")))
        for name in SAVED:
            if name in wanted and name not in group:
                return f"its saved {name} is missing"
            if name in group:
                problem = _saved_problem(group[name], name, results_path, cid, results_id)
                if problem:
                    return problem
    except READ_ERRORS as exc:
        return f"its output is unreadable ({os_reason(exc)})"
    return None


def _saved_problem(ds: h5py.Dataset, name: str, results_path: Path, cid: str, results_id: str | None) -> str | None:
    """What is wrong with the parts of one saved dataset of a case (see :func:`output_problem`), or None."""
    files = json.loads(ds.attrs.get("parts", "[]"))
    digests = json.loads(ds.attrs.get("part_sha256", "[]"))
    if not files:
        return f"its {name} lists no parts"
    batch, tokens, *row = ds.shape
    ranks = len(digests) or len(files)
    if len(files) not in (1, ranks) or tokens % ranks:
        return f"its {name} lists {len(files)} part(s) for {ranks} rank(s)"
    shard = tokens // ranks
    for i, part in enumerate(files):
        blocks = [(r, r * shard) for r in range(ranks)] if len(files) == 1 else [(i, 0)]
        expected = (batch, tokens if len(files) == 1 else shard, *row)
        problem = _part_problem(results_path.parent / part, part, name, cid, expected, ds.dtype, results_id,
                                [(lo, lo + shard, digests[r]) for r, lo in blocks] if digests else [])
        if problem:
            return problem
    return None


def _part_problem(file: Path, part: str, name: str, cid: str, shape: tuple[int, ...], dtype: np.dtype,
                  results_id: str | None, blocks: list[tuple[int, int, str]]) -> str | None:
    """What is wrong with dataset ``name`` of one output part file (see :func:`output_problem`), or None."""
    if not file.is_file():
        return f"output part {part} is missing"
    what = "" if name == "output" else f" ({name})"
    try:
        with h5py.File(file, "r") as f:
            out = f.get(name)
            if not isinstance(out, h5py.Dataset):
                return f"output part {part} holds no {name}"
            if out.shape != shape or out.dtype != dtype:
                return f"output part {part}{what} is {out.shape} {out.dtype}, expected {shape} {dtype}"
            if results_id is not None and (out.attrs.get("results_id") != results_id
                                           or out.attrs.get("case_id") != cid):
                return f"output part {part}{what} belongs to another results file or case"
            for lo, hi, digest in blocks:
                if _stored_digest(out, lo, hi) != digest:
                    return (f"output part {part}{what} is damaged (its data does not match the SHA-256 the case "
                            f"recorded)")
    except READ_ERRORS as exc:
        return f"output part {part} is unreadable ({os_reason(exc)})"
    return None


def output_notes(path: str | Path) -> list[str]:
    """A note for each complete case of a results file whose saved output is lost or damaged (for ``report``)."""
    path = Path(path)
    notes = []
    try:
        with h5py.File(path, "r") as h5:
            results_id = h5.attrs.get("results_id")
            for cid, group, _ in case_groups(h5["cases"]):
                if group is None or not group.attrs.get("complete", False) or "output" not in group:
                    continue
                problem = output_problem(group, path, results_id)
                if problem:
                    notes.append(f"{str(path)!r}, case {cid}: {problem}; its saved output cannot be trusted "
                                 f"(NaN where a part is missing); its timings and accuracy are unaffected")
    except READ_ERRORS:
        return notes              # an unreadable file or list of cases: the reader says so itself
    return notes
