"""Locality of a serialization: surface per token of contiguous chunks.

Cut the serialized sequence into chunks of ``chunk`` consecutive positions (the
tokens of one segment, or of one rank). A grid face between two neighbouring
points is *cut* when the points fall in different chunks. Surface per token =
2 x (cut faces) / N: the mean number of a token's grid neighbours that live in
another chunk (faces on the grid boundary are not counted). Lower is better:
a row-major 2-D order gives ~2 (the whole row above and below is elsewhere).

``python -m hilbert_hpc.tools.locality`` prints the table in ``docs/ordering.md``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from hilbert_hpc.core.ordering import inverse_order, serialization_order


def surface_per_token(grid: Sequence[int], perm: np.ndarray, chunk: int) -> float:
    """Mean number of cut neighbour faces per token when ``perm`` is cut into chunks of ``chunk``."""
    dims = tuple(int(g) for g in grid)
    n = int(np.prod(dims))
    chunk_of = (inverse_order(perm) // chunk).reshape(dims)
    cut = 0
    for axis in range(len(dims)):
        a = np.take(chunk_of, range(0, dims[axis] - 1), axis=axis)
        b = np.take(chunk_of, range(1, dims[axis]), axis=axis)
        cut += int(np.count_nonzero(a != b))
    return 2.0 * cut / n


DEFAULT_CASES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((256, 256), 96),
    ((256, 256), 1024),
    ((200, 120), 1000),
    ((1000, 1000), 4096),
    ((64, 64, 64), 4096),
    ((45, 37, 23), 1000),
)


def locality_table(cases=DEFAULT_CASES) -> list[dict]:
    """Rows ``{grid, chunk, natural, hilbert, ratio}`` for each (grid, chunk) case."""
    rows = []
    for grid, chunk in cases:
        nat = surface_per_token(grid, serialization_order(grid, "natural"), chunk)
        hil = surface_per_token(grid, serialization_order(grid, "hilbert"), chunk)
        rows.append({"grid": grid, "chunk": chunk, "natural": nat, "hilbert": hil, "ratio": nat / hil})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the locality table as Markdown."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| grid | chunk | natural | hilbert | natural / hilbert |")
    print("|---|---:|---:|---:|---:|")
    for r in locality_table():
        grid = "x".join(map(str, r["grid"]))
        print(f"| {grid} | {r['chunk']} | {r['natural']:.3f} | {r['hilbert']:.3f} | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
