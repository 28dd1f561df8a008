"""A pytest plugin that writes each failure's report to the file named by
TRIDIAX_FAILURES_LOG as soon as its test ends (gpu_report.py runs the GPU tests with it), so
that tests stopped by a timeout, or a worker killed by a crash, still leave their tracebacks:
pytest itself prints them only at the end of the session."""

from __future__ import annotations

import os

_controller = True


def pytest_configure(config):
    global _controller
    _controller = not hasattr(config, "workerinput")  # with xdist, the controller writes


def pytest_runtest_logreport(report):
    path = os.environ.get("TRIDIAX_FAILURES_LOG")
    if path and _controller and report.failed:
        with open(path, "a") as log:
            log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
