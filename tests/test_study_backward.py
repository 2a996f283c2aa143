"""Studies of the backward pass (pass = "forward+backward", numpy backend; one rank, and the ring on several)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from clirun import run_in_process
from jobtext import JobSpec, run_on_every_rank

JOB = JobSpec({"name": "bwd", "repeats": 2, "warmup": 1, "accuracy_rows": 8},
              defaults={"heads": 4, "head_dim": 16, "backend": "numpy"},
              cases=[{"name": "g", "grid": [32, 32], "patterns": [[64, 1], [256, 4]],
                      "sweep": {"pass": ["forward", "forward+backward"], "dtype": ["float32", "float64"],
                                "causal": [False, True]}}])


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    done = run_in_process(args, tmp_path, env={"HDF5_USE_FILE_LOCKING": "FALSE"})
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bwd")
    (tmp / "job.toml").write_text(JOB.text())
    _cli(tmp, "run", "job.toml", "-o", "r.h5")
    return tmp / "r.h5"


def test_backward_is_its_own_phase_with_useful_flops_and_gradient_accuracy(results):
    with h5py.File(results) as f:
        cases = list(f["cases"].values())
        assert len(cases) == 8
        for g in cases:
            acc, met, tim = g["accuracy"].attrs, g["metrics"].attrs, g["timings"]
            grads = [acc[f"grad_{t}_{e}"] for t in "qkv" for e in ("max_rel_err", "rel_l2_err")]
            assert np.allclose(tim["total"][()], tim["serialize"][()] + tim["attention"][()] + tim["backward"][()]
                               + tim["unserialize"][()])
            if g.attrs["pass"] == "forward":
                assert not tim["backward"][()].any() and np.isnan(grads).all()
                assert np.isnan(met["median_backward_s"]) and np.isnan(met["backward_useful_tflops"])
                continue
            assert (tim["backward"][()] > 0).all() and acc["within_tolerance"]
            bound = 1e-15 if g.attrs["dtype"] == "float64" else 1e-5          # float32: the goal
            assert max(grads) <= bound
            bwd = float(np.median(tim["backward"][()].max(axis=0)))
            assert met["median_backward_s"] == pytest.approx(bwd)
            assert met["backward_useful_tflops"] == pytest.approx(2.5 * met["useful_flops"] / bwd / 1e12)
            both = float(np.median((tim["attention"][()] + tim["backward"][()]).max(axis=0)))
            assert met["forward_backward_useful_tflops"] == pytest.approx(3.5 * met["useful_flops"] / both / 1e12)


def _case(**changes):
    from hilbert_hpc.study.jobfile import load_job

    job = load_job("job.toml", text=JOB.text(), world_size=1)
    case = next(c for c in job.cases if c.pass_ == "forward+backward" and c.dtype == "float32" and c.causal)
    return dataclasses.replace(case, **changes)


class _OneRank:
    def Get_rank(self) -> int:
        return 0


def test_dout_has_its_own_stream_and_the_check_sees_a_wrong_gradient():
    from hilbert_hpc.core.inputs import random_rows
    from hilbert_hpc.study.gradients import gradient_accuracy, gradient_fields
    from hilbert_hpc.study.measure import dout_shard, shard_inputs
    from hilbert_hpc.study.setup import check_case

    setup = check_case(_case())
    case = setup.case
    dout = dout_shard(setup, 7, _OneRank(), 0)
    natural = setup.layout.shard_natural(0)
    assert np.array_equal(dout, random_rows(7, "do", natural, case.heads, case.head_dim, np.float32))
    inputs = shard_inputs(case, 7, setup.layout, _OneRank(), 0)
    assert not any(np.allclose(dout, x) for x in inputs)
    out, lse = setup.backend.serialized_forward(*inputs, case.patterns, case.causal, case.softmax_scale)
    grads = list(setup.backend.serialized_backward(*inputs, out, lse, dout, case.patterns, case.causal,
                                                   case.softmax_scale))
    good = gradient_fields(gradient_accuracy(setup, 7, 8, grads))
    assert max(good.values()) < 1e-5
    grads[1] = grads[1] * 1.01                          # dK 1% off (against the larger of dK and its terms)
    bad = gradient_fields(gradient_accuracy(setup, 7, 8, grads))
    assert bad["grad_k_max_rel_err"] > 1e-3 and bad["grad_q_max_rel_err"] < 1e-5


def test_backward_on_several_ranks_needs_a_ring_backward_else_is_refused_in_one_line(monkeypatch):
    from hilbert_hpc.backends.numpy_backend import NumpyBackend
    from hilbert_hpc.errors import ConfigError
    from hilbert_hpc.study.setup import check_case

    assert check_case(_case(), ranks=2).ranks == 2                       # numpy's ring has a backward
    monkeypatch.setattr(NumpyBackend, "ring_backward_kernels", lambda self, kernel: None)
    with pytest.raises(ConfigError) as err:
        check_case(_case(), ranks=2)
    assert err.value.param.endswith(".pass") and "one rank" in str(err.value)
    assert "\n" not in str(err.value)


RING_JOB = JobSpec({"name": "ringbwd", "repeats": 1, "warmup": 0, "accuracy_rows": 16, "save_output": True},
                   defaults={"heads": 3, "head_dim": 16, "backend": "numpy", "pass": "forward+backward"},
                   cases=[{"name": "s", "grid": [32, 32], "ranks": "pow2", "patterns": [[64, 1], [256, 4],
                                                                                        ["N", "N/64"]],
                           "sweep": {"dtype": ["float64", "float32"], "causal": [False, True]}}])


@pytest.mark.mpi(min_size=2)
def test_strong_scaling_forward_backward_on_several_ranks_matches_one_rank(tmp_path_factory):
    """pass = forward+backward on 1, 2, 4 ... ranks (sub-communicators, the ring backward): the same gradients,
    the same gradient errors against float64, the backward timed on every rank."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    out = run_on_every_rank(RING_JOB.text(), tmp_path_factory, "ringbwd")
    if out is None:
        return
    with h5py.File(out) as f:
        groups = {}
        for g in f["cases"].values():
            groups.setdefault((g.attrs["dtype"], bool(g.attrs["causal"])), []).append(g)
        assert len(groups) == 4
        for (dtype, _), cases in groups.items():
            cases.sort(key=lambda g: int(g.attrs["ranks"]))
            assert [int(g.attrs["ranks"]) for g in cases] == [p for p in (1, 2, 4, 8) if p <= size]
            one = cases[0]
            bound = 1e-12 if dtype == "float64" else 1e-5
            for g in cases:
                acc, tim = g["accuracy"].attrs, g["timings"]
                assert acc["within_tolerance"]
                assert tim["backward"].shape[0] == g.attrs["ranks"] and (tim["backward"][()] > 0).all()
                for t in "qkv":
                    for e in ("max_rel_err", "rel_l2_err"):
                        name = f"grad_{t}_{e}"
                        assert acc[name] <= bound
                        # float64: both at rounding level; float32: the same size (the sums run in another order)
                        assert acc[name] == pytest.approx(one["accuracy"].attrs[name], rel=0.5, abs=1e-14)
                    want = one[f"grad_{t}"][...]
                    assert np.abs(g[f"grad_{t}"][...] - want).max() <= bound * np.abs(want).max()


def test_results_without_pass_resume_as_forward(tmp_path):
    """A file written before the case key ``pass`` existed: its cases are forward cases, kept by --resume."""
    job = JOB.but(cases=[{"name": "g", "grid": [32, 32], "patterns": [[64, 1], [256, 4]]}])
    (tmp_path / "job.toml").write_text(job.text())
    _cli(tmp_path, "run", "job.toml", "-o", "r.h5")
    with h5py.File(tmp_path / "r.h5", "r+") as f:
        (g,) = f["cases"].values()
        params = json.loads(g.attrs["params_json"])
        del params["pass"]
        g.attrs["params_json"] = json.dumps(params, sort_keys=True)
        del g.attrs["pass"]
        finished = g.attrs["finished_utc"]
    _cli(tmp_path, "run", "job.toml", "-o", "r.h5", "--resume")
    with h5py.File(tmp_path / "r.h5") as f:
        (g,) = f["cases"].values()
        assert g.attrs["finished_utc"] == finished
    _cli(tmp_path, "report", "r.h5")                                   # reads it as forward


def test_plan_counts_the_backward_memory():
    from hilbert_hpc.core.reference_backward import reference_bytes
    from hilbert_hpc.study.jobfile import DEFAULT_ACCURACY_ROWS
    from hilbert_hpc.study.plan import estimate

    fwd, both = _case(pass_="forward"), _case()
    n, row, heads = both.tokens, both.heads * both.head_dim, both.heads
    check = reference_bytes(n, heads, both.head_dim, both.patterns, DEFAULT_ACCURACY_ROWS)
    extra = n * row * 4 + n * (3 * row + heads) * 4 + check                            # dO; dQ dK dV, delta; check
    assert estimate(both).memory_bytes - estimate(fwd).memory_bytes == extra
    assert estimate(both).floor_bytes == estimate(fwd).floor_bytes
    # on 8 ranks: the shard's part, the three accumulator blocks of the ring backward (the pattern (256, 4)
    # spans 2 ranks: 128/4 rows of every head's K and V per rank, float32) and the check of the sampled rows
    fwd8, both8 = (dataclasses.replace(c, ranks=8) for c in (fwd, both))
    shard = n // 8
    accumulators = 3 * (shard // 4) * heads * 2 * both.head_dim * 4
    extra8 = shard * row * 4 + shard * (3 * row + heads) * 4 + accumulators + check
    assert estimate(both8).memory_bytes - estimate(fwd8).memory_bytes == extra8


def test_plan_counts_the_peers_gathered_backward_copies():
    """The peers gather every pattern and head offset for their kernels' backward: the largest such group (the
    (64, 1) pattern: every row and head) in nine copies (five inputs, three gradients, the kernel's own)."""
    pytest.importorskip("torch")
    from hilbert_hpc.study.plan import estimate

    for backend in ("torch", "numpy"):
        fwd, both = _case(backend=backend, pass_="forward"), _case(backend=backend)
        n, row, heads = both.tokens, both.heads * both.head_dim, both.heads
        gathered = 9 * n * row * 4 if backend == "torch" else 0
        extra = n * row * 4 + n * (3 * row + heads) * 4 + gathered                # dO; dQ dK dV, delta; copies
        assert estimate(both, accuracy_rows=0).memory_bytes - estimate(fwd).memory_bytes == extra


def test_the_default_forward_returns_the_merged_log_sum_exp_for_kernels_and_array_modules():
    """Backend.serialized_forward: the array-module algorithm, or a fused provider's local patterns into an
    output of the input's type; a backend computing the backward needs only ``passes`` and the backward."""
    from hilbert_hpc.backends import NumpyBackend
    from hilbert_hpc.backends.base import Backend
    from hilbert_hpc.core.dilated import accumulate_patterns, local_dilated_forward

    assert "serialized_forward" not in vars(NumpyBackend)
    case = _case()
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((case.tokens, case.heads, case.head_dim)).astype(np.float32) for _ in "qkv")
    args = (case.patterns, case.causal, case.softmax_scale)
    out, lse = local_dilated_forward(q, k, v, *args)
    got = NumpyBackend().serialized_forward(q, k, v, *args)
    assert all(np.array_equal(a, b) for a, b in zip(got, (out, lse)))

    class Provider:
        def local_patterns(self, qs, ks, vs, patterns, causal, scale, out, lse):
            accumulate_patterns(qs, ks, vs, patterns, causal, scale, out, lse)

    class Fused(Backend):
        def ring_kernels(self, kernel):
            return Provider()

    fused = Fused().serialized_forward(q, k, v, *args)
    assert fused[0].dtype == np.float32 and fused[1].shape == (case.tokens, case.heads)
    assert all(np.array_equal(a, b) for a, b in zip(fused, (out, lse)))


def test_saved_outputs_hold_the_gradients_in_natural_order(tmp_path):
    """save_output = true: grad_q, grad_k, grad_v beside output (natural order, checked like it); forward cases
    save the output alone."""
    from hilbert_hpc.core.backward import local_dilated_backward
    from hilbert_hpc.core.dilated import local_dilated_forward
    from hilbert_hpc.core.inputs import random_rows
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.parts import output_problem
    from hilbert_hpc.study.setup import check_case

    job = JOB.but(save_output=True, repeats=1, warmup=0, seed=5,
                  cases=[{"name": "g", "grid": [32, 32], "patterns": [[64, 1], [256, 4]], "ordering": "hilbert",
                          "causal": True, "sweep": {"pass": ["forward", "forward+backward"]}}])
    (tmp_path / "job.toml").write_text(job.text())
    _cli(tmp_path, "run", "job.toml", "-o", "r.h5")
    case = next(c for c in load_job("job.toml", text=job.text(), world_size=1).cases if c.pass_ != "forward")
    serial = check_case(case).layout.shard_natural(0)              # the natural position of each serialized row
    assert not np.array_equal(serial, np.arange(case.tokens))
    q, k, v, do = (random_rows(5, t, serial, case.heads, case.head_dim, np.float32).astype(np.float64)
                   for t in ("q", "k", "v", "do"))
    out, lse = local_dilated_forward(q, k, v, case.patterns, True, case.softmax_scale)
    grads = local_dilated_backward(q, k, v, out, lse, do, case.patterns, True, case.softmax_scale)
    with h5py.File(tmp_path / "r.h5") as f:
        fwd, both = (f["cases"][cid] for cid in sorted(f["cases"]))
        assert "grad_q" not in fwd and fwd["output"].dtype == np.float32
        for name, ref in zip(("grad_q", "grad_k", "grad_v"), grads):
            saved = both[name][()]
            assert saved.shape == (1, case.tokens, case.heads, case.head_dim) and saved.dtype == np.float32
            want = np.empty_like(ref)
            want[serial] = ref
            assert np.abs(saved[0] - want).max() <= 1e-5 * np.abs(want).max(), name
            assert len(json.loads(both[name].attrs["part_sha256"])) == 1 and both[name].attrs["order"] == "natural"
        assert output_problem(both, tmp_path / "r.h5", f.attrs["results_id"]) is None
        cid = both.name.rsplit("/", 1)[-1]
    with h5py.File(tmp_path / "r.h5.parts" / cid / "rank00000.h5", "r+") as part:
        part["grad_k"][0, 5, 1, 2] += 1.0
    with h5py.File(tmp_path / "r.h5") as f:
        problem = output_problem(f["cases"][cid], tmp_path / "r.h5", f.attrs["results_id"])
    assert problem == (f"output part r.h5.parts/{cid}/rank00000.h5 (grad_k) is damaged (its data does not match "
                       f"the SHA-256 the case recorded)")


def _forward_backward_cases(tmp_path: Path, backends: list[str], dtypes: list[str]) -> list:
    job = JobSpec({"name": "peer", "repeats": 1, "warmup": 1, "accuracy_rows": 8},
                  defaults={"heads": 4, "head_dim": 64, "pass": "forward+backward"},
                  cases=[{"name": "g", "tokens": 1024, "patterns": [[256, 1], [1024, 4]],
                          "sweep": {"backend": backends, "dtype": dtypes, "causal": [False, True]}}])
    (tmp_path / "job.toml").write_text(job.text())
    _cli(tmp_path, "run", "job.toml", "-o", "r.h5")
    with h5py.File(tmp_path / "r.h5") as f:
        return [(dict(g.attrs), dict(g["accuracy"].attrs), g["timings"]["backward"][()].copy())
                for g in f["cases"].values()]


def test_the_torch_peer_runs_forward_and_backward_in_float64(tmp_path):
    pytest.importorskip("torch")
    cases = _forward_backward_cases(tmp_path, ["torch", "numpy"], ["float64"])
    assert len(cases) == 4
    for attrs, acc, backward in cases:
        assert attrs["backward_kernel"] == "none" and (backward > 0).all() and acc["within_tolerance"]
        assert max(acc[f"grad_{t}_max_rel_err"] for t in "qkv") <= 1e-12, attrs["backend"]


@pytest.mark.gpu
def test_gpu_backends_run_forward_and_backward(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cases = _forward_backward_cases(tmp_path, ["cuda", "torch"], ["float32", "bfloat16"])
    assert len(cases) == 8
    for attrs, acc, backward in cases:
        worst = max(acc[f"grad_{t}_max_rel_err"] for t in "qkv")
        assert (backward > 0).all() and acc["within_tolerance"], attrs["case_id"]
        assert worst <= (1e-5 if attrs["dtype"] == "float32" else 3e-2), (attrs["case_id"], worst)
        if attrs["backend"] == "cuda":
            from hilbert_hpc.kernels.selection import choose_backward

            assert attrs["backward_kernel"] == choose_backward(attrs["dtype"], 64).name


def test_plan_counts_the_16_bit_backward_chunks_on_one_device():
    """backend cuda, 16 bits, one device: dQ, dK, dV in 16 bits plus the float32 sums of one chunk of rows;
    float32, or several ranks (the ring backward): float32 sums of the whole shard."""
    from hilbert_hpc.backends.cuda_autograd import SCRATCH_SHARE, chunk_rows
    from hilbert_hpc.backends.cuda_fused import CudaBackend
    from hilbert_hpc.backends.memory import RankShape
    from hilbert_hpc.core.patterns import Pattern

    pats, row = (Pattern(2048, 1), Pattern(8192, 4)), 8 * 64
    memory = CudaBackend.memory

    def grads(shard, itemsize, patterns=pats, ranks=1):
        return memory.gradient_bytes(RankShape(shard, 8, 64, itemsize, patterns, ranks=ranks))

    chunk = chunk_rows(262144, pats, SCRATCH_SHARE)
    assert grads(262144, 2) == 3 * row * (262144 * 2 + chunk * 4)
    assert grads(262144, 2) < 0.7 * grads(262144, 4)
    for local in (pats, pats[:1]):   # on several ranks the ring backward's float32 sums, local patterns or not
        assert grads(4096, 2, local, ranks=2) == 3 * row * 4096 * (4 + 2)
    # and plan counts the gradients as the backend holds them
    from hilbert_hpc.study.memory import MemoryModel
    from hilbert_hpc.study.setup import plan_setup

    case = _case(backend="cuda", dtype="bfloat16")
    n, r, heads = case.tokens, case.heads * case.head_dim, case.heads
    model = MemoryModel(plan_setup(case), 0)
    held = memory.gradient_bytes(RankShape(n, heads, case.head_dim, 2, tuple(case.patterns)))
    assert (model.output_gradient(), model.gradients(), model.row_delta()) == (n * r * 2, held, n * heads * 4)
    assert model.backward_workspace() == model.ring_accumulators() == model.gradient_check() == 0


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("causal", [False, True])
def test_each_rank_checks_its_own_gradient_rows_and_a_wrong_row_on_one_rank_shows(causal):
    """The gradient check on several ranks: every rank checks the sampled rows it owns (no rank gathers the
    sequence), the first rank adds the sums up; a gradient 1% off on the last rank only is seen there."""
    from mpi4py import MPI

    from hilbert_hpc.core.backward import local_dilated_backward
    from hilbert_hpc.core.dilated import local_dilated_forward
    from hilbert_hpc.study.gradients import gradient_accuracy, gradient_fields
    from hilbert_hpc.study.measure import dout_shard, shard_inputs
    from hilbert_hpc.study.setup import check_case

    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.Get_rank() < 2 else MPI.UNDEFINED, world.Get_rank())
    if comm == MPI.COMM_NULL:
        return
    placed = _case(causal=causal, dtype="float64", placement="zigzag" if causal else "contiguous")
    one, two = check_case(placed), check_case(placed, 2)
    case = one.case
    inputs = shard_inputs(case, 7, one.layout, _OneRank(), 0)                # the whole sequence, serialized
    dout = dout_shard(one, 7, _OneRank(), 0)
    out, lse = local_dilated_forward(*inputs, case.patterns, case.causal, case.softmax_scale)
    grads = local_dilated_backward(*inputs, out, lse, dout, case.patterns, case.causal, case.softmax_scale)
    rank = comm.Get_rank()
    mine = np.flatnonzero(two.layout.owner(np.arange(case.tokens)) == rank)  # serialized positions of this rank
    shard = [np.empty_like(g[:len(mine)]) for g in grads]
    for s, g in zip(shard, grads):
        s[two.layout.local_rows(mine)] = g[mine]
    assert two.layout.placement == ("zigzag" if causal else "contiguous")
    good = gradient_accuracy(two, 7, 8, shard, comm)
    if rank == 1:
        shard[1] = shard[1] * 1.01
    bad = gradient_accuracy(two, 7, 8, shard, comm)
    comm.Free()
    if rank != 0:
        assert good is None and bad is None
        return
    assert good["q"]["rows"] == 8 and max(gradient_fields(good).values()) < 1e-12
    assert gradient_fields(bad)["grad_k_max_rel_err"] > 1e-3 and gradient_fields(bad)["grad_v_max_rel_err"] < 1e-12
