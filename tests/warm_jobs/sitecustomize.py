"""Tests only (on PYTHONPATH of the commands tests/conftest.py starts warm): the process of a sweep job
(``python -m litlab.cli.train ...``, started by the device pool) or of a rank Lightning started hands
its command to a warm-start server (tests/warm.py, ``run_job_warm``) instead of importing torch and
Lightning again. Every other process runs cold, untouched."""

import os
import sys

# torchrun starts its workers as `python -u -m MODULE ...`
_argv = sys.orig_argv[2:] if sys.orig_argv[1:2] == ["-u"] else sys.orig_argv[1:]
if os.environ.get("LITLAB_TEST_WARM_JOBS") and (
    _argv[:2] in (["-m", "litlab.cli.train"], ["-m", "litlab.cli.eval"])
    or os.path.basename(_argv[0] if _argv else "") in ("litlab-train", "litlab-eval")
):
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_litlab_test_warm",
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "warm.py"),
    )
    _warm = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_warm)
    _warm.run_job_warm(os.environ["LITLAB_TEST_WARM_JOBS"], _argv)  # returns only when the job runs cold
    del _spec, _warm
