#!/usr/bin/env bash
# The whole test suite: single-process tests (listing why any skipped), then the MPI tests under 2 and 4 ranks.
# The single-process tests run on one pytest-xdist worker per core (at most 4) where pytest-xdist is installed
# (the test extra has it); the MPI runs collect only the files that hold MPI tests, and their ranks but rank 0
# report only what fails on them (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) == 0 ]]; then  # Open MPI refuses root unless told; containers and CI often run as root
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
workers=()
cores=$(python -c "import os; print(len(os.sched_getaffinity(0)))")
if (( cores > 1 )) && python -c "import xdist" 2>/dev/null; then
  workers=(-n "$(( cores < 4 ? cores : 4 ))" --dist worksteal)
fi
python -m pytest -q -rs -p no:cacheprovider -m "not mpi" "${workers[@]}" "$@" tests
mapfile -t mpi_files < <(grep -l "mark\.mpi" tests/test_*.py)
for n in 2 4; do
  echo "== MPI tests on $n ranks"
  mpiexec -n "$n" --oversubscribe python -m pytest -q -p no:cacheprovider --with-mpi -m mpi \
    --timeout=300 "$@" "${mpi_files[@]}"
done
