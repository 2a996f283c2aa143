# Shared by the sbatch scripts in slurm/: environment, the study step, USR1 forwarding and requeue.
# Sourced from an sbatch script that runs in the submission folder (the repository root):
#   source slurm/common.sh; run_study JOB.toml [hilbert-hpc run options ...]
# Settings (environment, all optional):
#   HH_PYTHON           the Python that has hilbert_hpc installed (default: python3)
#   HH_SRUN_ARGS        extra srun options for the study step (e.g. "--mpi=pmix")
#   HH_CUDA_AWARE_PYPI  1: make a PyPI Open MPI 5 + libucx-cu13 stack CUDA-aware (hilbert-hpc cuda-env)
#   HH_REPORT           1 (default): print the report of the results file when the study is complete

# shellcheck shell=bash
set +o posix                # POSIXLY_CORRECT in the environment must not change `wait` below
HH_REQUEUE_EXIT=75          # hilbert_hpc.study.signals.REQUEUE_EXIT: stopped at a case boundary, resume later
HH_PYTHON=${HH_PYTHON:-python3}

hh_log() { echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) ${SLURM_JOB_ID:+job $SLURM_JOB_ID: }$*"; }

hh_environment() {
  # One thread per core a task owns; HDF5 locking off for Lustre/NFS unless the site says otherwise.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  # srun of Slurm >= 22.05 no longer inherits --cpus-per-task from sbatch
  if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi
  export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
  if [[ ${HH_CUDA_AWARE_PYPI:-0} == 1 ]]; then
    local env_lines
    env_lines=$("$HH_PYTHON" -m hilbert_hpc cuda-env) || exit 2
    eval "$env_lines"
  fi
}

# run_study JOB [OPTIONS...]: one srun step of `hilbert-hpc run JOB --resume OPTIONS`.
# USR1/TERM to this batch shell (sbatch --signal=B:USR1@SECONDS) is passed on to the step: the
# ranks finish the current case, flush and exit 75; the job is then requeued and, when it starts
# again, --resume skips the complete cases. Returns the step's exit code otherwise.
run_study() {
  local job=$1
  shift
  if [[ ! -f $job ]]; then
    echo "hilbert-hpc: error: job file '$job' not found (submit from the repository root, or give a full path)" >&2
    return 2
  fi
  hh_environment
  hh_log "restart ${SLURM_RESTART_COUNT:-0}: hilbert-hpc run $job --resume $*"
  # Every rank exits 75 after a stop, so a non-zero rank exit must not kill the others (a site may set
  # KillOnBadExit); a rank that fails aborts all of them through MPI_Abort instead.
  # shellcheck disable=SC2086
  srun --kill-on-bad-exit=0 ${HH_SRUN_ARGS:-} "$HH_PYTHON" -m hilbert_hpc run "$job" --resume "$@" &
  local step=$! rc again
  trap 'hh_log "stop requested: the ranks finish the current case, then stop"; kill -USR1 "$step" 2>/dev/null' USR1 TERM
  while :; do
    wait "$step"
    rc=$?
    ((rc > 128)) || break                            # the step's own exit code
    kill -0 "$step" 2>/dev/null && continue          # a trapped signal ended the wait early: wait again
    wait "$step"                                     # the step ended meanwhile: its saved exit code
    again=$?
    ((again == 127)) || rc=$again
    break
  done
  trap - USR1 TERM
  if [[ $rc == "$HH_REQUEUE_EXIT" ]]; then
    if [[ -n ${SLURM_JOB_ID:-} ]] && scontrol requeue "$SLURM_JOB_ID"; then
      hh_log "stopped at a case boundary; requeued (the next start resumes the results file)"
      return 0
    fi
    hh_log "stopped at a case boundary; requeue failed: resubmit with the same job to resume"
    return "$rc"
  fi
  if [[ $rc == 0 && ${HH_REPORT:-1} == 1 ]]; then
    local output
    output=$(hh_output_path "$job" "$@")
    [[ -n $output && -f $output ]] && "$HH_PYTHON" -m hilbert_hpc report "$output"
  fi
  return "$rc"
}

# hh_output_path JOB [OPTIONS...]: the results file a run writes (-o/--output, else the job's output).
hh_output_path() {
  local job=$1 prev= arg
  shift
  for arg in "$@"; do
    case $prev in -o|--output) echo "$arg"; return ;; esac
    case $arg in
      --output=*) echo "${arg#--output=}"; return ;;
      -o?*) echo "${arg#-o}"; return ;;
    esac
    prev=$arg
  done
  "$HH_PYTHON" - "$job" <<'PY'
import sys
from hilbert_hpc.study.jobfile import load_job
print(load_job(sys.argv[1]).output)
PY
}
