"""ReFrame configuration of one machine, local launcher (CI, a workstation): ``reframe -C reframe/settings.py``.

A site uses its own configuration (partitions, schedulers, launchers such as srun); this one only lets the
shipped check run where ReFrame is installed and nothing else is configured.
"""

site_configuration = {
    "systems": [{
        "name": "local",
        "descr": "this machine, local launcher",
        "hostnames": [".*"],
        "partitions": [{"name": "cpu", "scheduler": "local", "launcher": "local", "environs": ["default"],
                        "max_jobs": 1}],
    }],
    "environments": [{"name": "default"}],
    "logging": [{
        "handlers": [{"type": "stream", "name": "stdout", "level": "info", "format": "%(message)s"}],
        "handlers_perflog": [{
            "type": "filelog", "prefix": "%(check_system)s/%(check_partition)s", "level": "info",
            "format": "%(check_job_completion_time)s|%(check_info)s|%(check_perfvalues)s", "append": True,
        }],
    }],
}
