"""Tests only (on PYTHONPATH of the commands tests/conftest.py starts warm): a sweep job's process that
the device pool started as ``python -m litlab.cli.train ...`` hands its command to a warm-start
server (tests/warm.py, ``run_job_warm``) instead of importing torch and Lightning again. Every other
process, and a job when no server is ready yet, runs cold, untouched."""

import os
import sys

if (
    os.environ.get("LITLAB_TEST_WARM_JOBS")
    and "LITLAB_SWEEP_JOB" in os.environ  # a sweep job (litlab.launch.multirun.SWEEP_JOB_ENV)
    and sys.orig_argv[1:2] == ["-m"]
    and sys.orig_argv[2:3] in (["litlab.cli.train"], ["litlab.cli.eval"])
):
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_litlab_test_warm",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "warm.py"),
    )
    _warm = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_warm)
    _warm.run_job_warm(os.environ["LITLAB_TEST_WARM_JOBS"])  # returns only when the job runs cold
    del _spec, _warm
