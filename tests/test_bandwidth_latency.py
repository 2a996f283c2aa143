"""bandwidth: the latency alpha and bandwidth B fitted to a sweep, recorded in its file and read back."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hilbert_hpc.study.bandwidth import LATENCY_BYTES, fit_latency, read_link


def test_the_fit_finds_alpha_and_b_of_exact_times():
    sizes = [8, 64, 512, 1024, 1 << 20, 1 << 26]
    fit = fit_latency(sizes, [20e-6 + b / 150e9 for b in sizes])
    assert fit.alpha_s == pytest.approx(20e-6) and fit.gb_per_s == pytest.approx(150.0)
    assert fit.method == "least squares" and fit.seconds(1 << 20) == pytest.approx(20e-6 + (1 << 20) / 150e9)


def test_noisy_times_still_give_positive_figures():
    # times that do not grow with the size (a sweep of small messages only): B is the highest rate measured
    flat = fit_latency([8, 1024, 4096], [10e-6, 10e-6, 9e-6])
    assert flat.alpha_s > 0 and flat.gb_per_s == pytest.approx(4096 / 9e-6 / 1e9)
    assert flat.method.endswith("B: the highest rate measured (the times do not grow with the size)")
    # times that grow faster than the size (a line through them crosses 0 above 0 bytes): alpha is the smallest
    # message's time, 1/B fitted again with it
    steep = fit_latency([1024, 2048, 4096], [1e-6, 4e-6, 16e-6])
    assert steep.alpha_s == 1e-6 and steep.gb_per_s > 0
    assert steep.method.startswith("alpha: the smallest message's time")
    with pytest.raises(ValueError, match="two or more positive"):
        fit_latency([8], [1e-6])


def test_a_bandwidth_file_without_the_fit_is_fitted_when_read(tmp_path):
    """Files written before alpha and B were recorded: the sweep's rates give them."""
    sizes = np.asarray([1024, 2048, 4096, 8192], dtype=np.float64)
    with h5py.File(tmp_path / "old.h5", "w") as f:
        f.attrs.update({"program": "hilbert-hpc", "study": "bandwidth"})
        ds = f.create_dataset("bandwidth", data=np.stack([sizes, sizes / (5e-6 + sizes / 2e9) / 1e9], axis=1))
        ds.attrs.update({"columns": "bytes, GB/s", "transport": "host", "device": "cpu", "ranks": 2})
    link = read_link(str(tmp_path / "old.h5"))
    assert (link.transport, link.ranks) == ("host", 2)
    assert link.fit.alpha_s == pytest.approx(5e-6) and link.fit.gb_per_s == pytest.approx(2.0)


@pytest.mark.mpi(min_size=2)
def test_the_sweep_records_alpha_and_b(tmp_path_factory, capsys):
    """Under mpiexec (host transport): the file holds the small messages' times and a positive alpha and B."""
    from mpi4py import MPI

    from hilbert_hpc.study.bandwidth import run_bandwidth

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("bw")) if comm.Get_rank() == 0 else None))
    sweep = run_bandwidth(comm, "host", "cpu", 4096, 2, str(tmp / "bw.h5"))
    assert sweep.fit.alpha_s > 0 and sweep.fit.gb_per_s > 0
    assert [b for b, _ in sweep.latency] == list(LATENCY_BYTES) and [b for b, _ in sweep.sizes] == [1024, 2048, 4096]
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    out = capsys.readouterr().out
    assert (f"# fit t(bytes) = alpha + bytes / B over the 6 sizes: alpha = {sweep.fit.alpha_s * 1e6:.2f} us, "
            f"B = {sweep.fit.gb_per_s:.3f} GB/s") in out
    with h5py.File(tmp / "bw.h5") as f:
        attrs = f["bandwidth"].attrs
        assert attrs["alpha_s"] == sweep.fit.alpha_s > 0 and attrs["b_gb_per_s"] == sweep.fit.gb_per_s > 0
        assert json.loads(attrs["units"]) == {"alpha_s": "s", "b_gb_per_s": "GB/s"} and attrs["fit"]
        assert f["bandwidth"].shape == (3, 2) and f["latency"].attrs["columns"] == "bytes, s"
        assert f["latency"][:, 0].tolist() == list(LATENCY_BYTES) and (f["latency"][:, 1] > 0).all()
    link = read_link(str(tmp / "bw.h5"))
    assert (link.transport, link.device, link.ranks) == ("host", "cpu", comm.Get_size())
    assert link.fit == sweep.fit
