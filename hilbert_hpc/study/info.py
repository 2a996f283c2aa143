"""``hilbert-hpc info``: what this process would run on."""

from __future__ import annotations

import json
import os

from hilbert_hpc.study.provenance import cpu_model, git_hash, gpu_devices, library_versions, thread_record


def threads_line() -> str:
    """This rank's CPU threads and how they were decided; what BLAS/OpenMP report (two lines)."""
    record = thread_record()
    libraries = ", ".join(f"{name} {n}" for name, n in sorted(record["libraries"].items())) or "none loaded"
    return (f"threads:  {record['threads']} per rank ({record['decided']}; under mpiexec each rank takes its "
            f"share)\nblas/omp: {libraries} thread(s)")


def print_info() -> None:
    """Print CPU, GPUs (with compute capability), MPI library and library versions."""
    from hilbert_hpc.distributed.mpi import world

    world()  # starts MPI (so its library version is reported) and sets this rank's threads
    print(f"cpu:      {cpu_model()} ({os.cpu_count()} logical cores)")
    print(threads_line())
    gpus = gpu_devices()
    if gpus:
        for g in gpus:
            print(f"gpu {g['index']}:    {g['name']}, compute capability {g['compute_capability']}, "
                  f"{g['memory_bytes'] / 2**30:.1f} GiB, {g['multiprocessors']} SMs")
    else:
        print("gpu:      none visible (CuPy missing or no CUDA device)")
    versions = library_versions()
    print(f"mpi:      {versions.get('mpi_library', 'mpi4py not installed')}")
    from hilbert_hpc.distributed.transports import choose_transport

    auto = choose_transport("auto", on_gpu=True)
    print(f"transport (auto, GPU arrays): {auto.name} ({auto.cuda_aware[1]})")
    print(f"git:      {git_hash()}")
    print("versions: " + json.dumps({k: v for k, v in versions.items() if k != "mpi_library"}))
