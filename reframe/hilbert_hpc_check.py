"""A ReFrame check of hilbert-hpc: run a study job through the system's launcher, check its accuracy verdicts,
and report its figures of merit against per-system references.

    reframe -C reframe/settings.py -c reframe/hilbert_hpc_check.py -r          # this machine, local launcher
    reframe -C <site config> -c reframe/hilbert_hpc_check.py -r --system cluster:gpu -S tasks=4 \\
            -S study_job=jobs/strong_scaling_gpu.toml                                 # a partition of a site

The job runs as ``hilbert-hpc run JOB -o results.h5`` on ``tasks`` ranks (ReFrame's launcher: srun, mpirun ...),
then ``hilbert-hpc report results.h5 --json`` writes the figures of merit (figures.json), from which the sanity
check reads each case's accuracy verdict (``within_tolerance``) and the performance stage one variable per
case and figure (``<case>.<figure>``: the median attention time in s, useful TFLOP/s, and, for forward+backward
cases, their backward and sum). ``reference`` carries example references of the CPU job on any system ('*');
a site puts its own per partition, or runs ``hilbert-hpc report results.h5 --save-references refs.toml`` on
a run it trusts and ``--check refs.toml`` on later ones (docs/studies.md, "Regression checks").
"""

import json
import os

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import performance_function, run_before, sanity_function, variable

#: the repository root (jobs are given relative to it)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: figures of merit that become performance variables, with their units
PERF_FIGURES = {"attention_s": "s", "tflops": "TFLOP/s", "backward_s": "s", "forward_backward_s": "s"}


@sn.deferrable
def figure_of(path, case, figure):
    """One figure of merit of one case from ``report --json``'s output file."""
    with open(path) as f:
        cases = json.load(f)["cases"]
    return next(c for c in cases if c["case"] == case)["figures"][figure]["value"]


@rfm.simple_test
class HilbertHpcStudy(rfm.RunOnlyRegressionTest):
    """One study job of hilbert-hpc on ``tasks`` ranks, its figures of merit as performance variables."""

    descr = "hilbert-hpc study: accuracy verdicts and figures of merit"
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    #: the study job file (relative to the repository root, or absolute)
    study_job = variable(str, value="jobs/regression_cpu.toml")
    #: MPI ranks of the run
    tasks = variable(int, value=1)
    #: the Python that runs hilbert-hpc
    python = variable(str, value="python3")
    sourcesdir = None
    time_limit = "10m"
    tags = {"hilbert_hpc", "regression"}
    reference = {
        # the CPU job on any system: the attention time of each case a loose bound (a busy laptop passes, a
        # build 25x slower than 2 ms fails), and no lower one
        "*": {
            "0000-grid32x32.attention_s": (0.002, None, 24.0, "s"),
            "0001-grid32x32.attention_s": (0.002, None, 24.0, "s"),
        },
    }

    @run_before("run")
    def set_command(self):
        job = self.study_job if os.path.isabs(self.study_job) else os.path.join(ROOT, self.study_job)
        self.num_tasks = self.tasks
        self.executable = self.python
        self.executable_opts = ["-m", "hilbert_hpc", "run", job, "-o", "results.h5"]
        self.postrun_cmds = [f"{self.python} -m hilbert_hpc report results.h5 --json > figures.json"]
        self.env_vars = {"PYTHONPATH": ROOT + ":" + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}

    @sanity_function
    def every_case_is_accurate(self):
        """Every case of the results is within its dtype's tolerance against float64."""
        path = os.path.join(self.stagedir, "figures.json")
        return sn.assert_true(_all_accurate(path), msg="a case is not within its tolerance (or no figures.json)")

    @run_before("performance")
    def set_perf_variables(self):
        """One performance variable per case and figure of merit the results hold."""
        path = os.path.join(self.stagedir, "figures.json")
        with open(path) as f:
            cases = json.load(f)["cases"]
        self.perf_variables = {
            f"{c['case']}.{name}": sn.make_performance_function(figure_of(path, c["case"], name), unit)
            for c in cases for name, unit in PERF_FIGURES.items() if name in c["figures"]}


@sn.deferrable
def _all_accurate(path):
    """Whether ``report --json`` found every case within tolerance (False when it wrote nothing)."""
    try:
        with open(path) as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(cases) and all(c["within_tolerance"] for c in cases)
