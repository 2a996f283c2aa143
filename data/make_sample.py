"""Regenerate data/grid32x32.h5: a natural-order input on a 32 x 32 token grid (H = 4, D = 16, float32)."""

from pathlib import Path

import numpy as np

from hilbert_hpc.datafile import write_input
from hilbert_hpc.inputs import random_rows

GRID = (32, 32)
HEADS, HEAD_DIM = 4, 16

if __name__ == "__main__":
    positions = np.arange(int(np.prod(GRID)))
    q, k, v = (random_rows(1, t, positions, HEADS, HEAD_DIM, np.float32) for t in ("q", "k", "v"))
    # a smooth field along the grid so that locality matters: add a function of the 2-D position
    y, x = np.unravel_index(positions, GRID)
    wave = np.sin(2 * np.pi * (x[:, None, None] / 32 + y[:, None, None] / 16 + np.arange(HEAD_DIM) / HEAD_DIM))
    write_input(Path(__file__).with_name("grid32x32.h5"), q + wave.astype(np.float32), k + wave.astype(np.float32),
                v, grid=GRID)
