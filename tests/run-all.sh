#!/usr/bin/env bash
# The whole test suite: single-process tests (listing why any skipped), then the MPI tests under 2 and 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) == 0 ]]; then  # Open MPI refuses root unless told; containers and CI often run as root
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -q -rs -p no:cacheprovider -m "not mpi" "$@" tests
for n in 2 4; do
  echo "== MPI tests on $n ranks"
  mpiexec -n "$n" --oversubscribe python -m pytest -q -p no:cacheprovider --with-mpi -m mpi \
    --timeout=300 "$@" tests
done
