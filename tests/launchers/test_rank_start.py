"""launchers/rank_start.py: every task starts with the stop signals held until the job's
handlers exist, through submitit's own local executor (its controller starts the task
with nothing blocked, as srun does)."""

from __future__ import annotations

import os
import signal

import pytest

from launchers.kinds.local import LAUNCHER as LOCAL
from launchers.rank_start import HELD
from orchestrator.runtime import job_control

pytestmark = pytest.mark.multiprocess


def signalled_before_the_handlers() -> str | None:
    """In the task: USR2 after submitit's handlers and before the job's, then the job's."""
    os.kill(os.getpid(), signal.SIGUSR2)  # unheld: submitit's handler ends the task
    job_control.reset()
    job_control.install_handlers()
    return job_control.stop_signal()


def test_a_signal_before_the_jobs_handlers_is_held_for_them(tmp_path):
    launcher = {"nodes": 1, "gpus_per_node": 1, "timeout_min": 5, "accelerator": "cpu"}
    job = LOCAL.executor(launcher, tmp_path / "submitit", "held").submit(signalled_before_the_handlers)
    assert job.result() == "SIGUSR2", job.stderr()


def test_the_held_signals_are_the_ones_the_job_handles():
    assert set(HELD) == set(job_control.STOP_SIGNALS)
