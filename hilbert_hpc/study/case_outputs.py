"""The output parts of a case: every rank writes its block of the output (and of the gradients of a forward+backward
case), in natural order, beside the results file.

``<results>.parts/<case-id>/`` holds one shared file (parallel HDF5) or one file
per rank; each part records the results file it belongs to, its case and the
SHA-256 of its block(s). The results file itself is written by ``results.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from hilbert_hpc.errors import UserError
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.distributed.mpi import agree
from hilbert_hpc.study.output_files import IO_ERRORS, hdf5_image, io_error, remove_quietly, write_synced
from hilbert_hpc.core.precision import precision
from hilbert_hpc.study.parts import block_digest, parts_dir, refuse_foreign_parts
from hilbert_hpc.study.results import ResultsFile
from hilbert_hpc.distributed.sharding import Layout


def parallel_hdf5(comm: Any) -> bool:
    """True when the case's ranks can write one shared file through parallel HDF5 (h5py built with MPI).

    ``HILBERT_HPC_PARALLEL_HDF5=0`` forces the per-rank files (e.g. on a file
    system where MPI-IO is slow or broken); a single rank never needs it.
    """
    if os.environ.get("HILBERT_HPC_PARALLEL_HDF5", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if comm.Get_size() < 2 or type(comm).__module__.split(".")[0] != "mpi4py":
        return False
    import h5py

    return bool(h5py.get_config().mpi)


def write_output_part(case: Case, comm: Any, layout: Layout, outputs: dict[str, list[np.ndarray]],
                      results_path: Path, results_id: str) -> tuple[str, dict[str, str]]:
    """Every rank of the case writes its block of each saved array, in natural order; no rank holds more than its
    shard.

    ``outputs``: the arrays by dataset name (``record.SAVED``: the output and, for
    a forward+backward case, the gradients), one serialized shard per batch element.
    Rank ``r`` receives the natural positions ``[r*L, (r+1)*L)`` by one all-to-all
    exchange per array. With parallel HDF5 all ranks write their blocks into one file,
    ``<results>.parts/<case-id>/output.h5`` (collective MPI-IO); otherwise each
    rank writes ``<results>.parts/<case-id>/rank<r>.h5``, made in memory (each
    block moves into it in turn) and written out with plain file I/O, so that a
    full disk is an ordinary OSError (:func:`output_files.hdf5_image`); the
    datasets lie side by side in it. The parts folder must belong to the
    results file ``results_id`` (rank 0 made it, holding the file's lock); each dataset records that
    identity, the case and the SHA-256 of the block(s) it holds. Returns this
    rank's file, relative to the results file, and the SHA-256 of its block of
    each dataset.
    """
    import h5py

    from hilbert_hpc.distributed.datafile import redistribute

    rank = comm.Get_rank()
    natural = layout.shard_natural(rank)
    file_dtype = precision(case.dtype).file_dtype       # HDF5 has no bfloat16: stored exactly as float32
    blocks = {name: np.stack([redistribute(np.asarray(o, dtype=file_dtype), natural, layout.shard, comm)
                              for o in arrays]) for name, arrays in outputs.items()}
    digest = {name: block_digest(b) for name, b in blocks.items()}
    digests = comm.allgather(digest)
    shared = parallel_hdf5(comm)
    parts = parts_dir(results_path)
    refuse_foreign_parts(parts, results_path, results_id)
    rel = Path(parts.name) / case.case_id / ("output.h5" if shared else f"rank{rank:05d}.h5")
    target = results_path.parent / rel
    target.parent.mkdir(exist_ok=True)
    if shared:
        comm.Barrier()                                   # the folder exists before any rank opens the file
        with h5py.File(target, "w", driver="mpio", comm=comm) as f:
            for name, b in blocks.items():
                shape = (b.shape[0], layout.shard * comm.Get_size(), *b.shape[2:])
                ds = f.create_dataset(name, shape=shape, dtype=b.dtype)
                with ds.collective:
                    ds[:, rank * layout.shard:(rank + 1) * layout.shard] = b
                ds.attrs["first_token"] = 0
                _output_attrs(ds, case, results_id, [d[name] for d in digests])
    else:
        def fill(f: Any) -> None:
            for name in list(blocks):
                ds = f.create_dataset(name, data=blocks.pop(name))     # each block leaves memory once copied
                ds.attrs["first_token"] = rank * layout.shard
                _output_attrs(ds, case, results_id, [digest[name]])

        try:
            write_synced(hdf5_image(fill), target)
        except BaseException:
            remove_quietly(target)                 # a part cut short by a full disk is of no use
            raise
    return str(rel), digest


def _output_attrs(ds: Any, case: Case, results_id: str, digests: list[str]) -> None:
    """What a part says about itself: layout, owner (results file and case), SHA-256 of its rank block(s)."""
    ds.attrs["order"] = "natural"
    ds.attrs["axes"] = "batch, token, head, dim"
    ds.attrs["results_id"] = results_id
    ds.attrs["case_id"] = case.case_id
    ds.attrs["sha256"] = json.dumps(digests)


def write_case_outputs(case: Case, job: Job, comm: Any, layout: Layout, outputs: dict[str, list[np.ndarray]],
                       results: ResultsFile | None, results_path: Path | None,
                       results_id: str) -> tuple[list[str] | None, dict[str, list[str]] | None]:
    """Every rank of the case writes its output part (:func:`write_output_part`), agreed by all of them.

    Rank 0 first begins the results file (a replacing run removes the old one
    now); every part is on disk before the case can be committed. A failed
    write on any rank raises a UserError on every rank. Returns (parts, SHA-256
    digests of each dataset, rank order) on rank 0 and (None, None) on the
    other ranks.
    """
    path = Path(results_path or job.output)
    error = None
    if results is not None:
        try:
            results.begin()                          # the first case of a replacing run: the old file goes now
        except UserError as exc:
            error = exc
    error = agree(comm, error)                       # the parts folder is ready before any rank writes
    if error is not None:
        raise error
    try:
        rel, digest = write_output_part(case, comm, layout, outputs, path, results_id)
    except UserError as exc:
        error = exc
    except IO_ERRORS as exc:
        error = io_error(exc, "write an output part of", path,
                         "its complete cases are kept; free some space and continue with --resume")
    error = agree(comm, error)                       # every part is on disk before the case is committed
    if error is not None:
        raise error
    gathered = comm.gather((rel, digest), root=0)
    if gathered is None:
        return None, None
    return [g[0] for g in gathered], {name: [g[1][name] for g in gathered] for name in outputs}
