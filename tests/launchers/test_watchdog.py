"""The watchdog's rules (launchers/watchdog.py): the bound without progress, and which
ranks a hang names. The whole path (a rank frozen with SIGSTOP in a two-node SLURM job,
detected, the job requeued and resumed exactly) is
tests/slurm/test_multinode.py::test_a_frozen_rank_is_named_and_the_job_requeued_and_resumed_exactly."""

import json
import os
import subprocess
import sys
import time

from orchestrator.runtime import job_control
from launchers.watchdog import (BEAT_S, HANG_FLOOR_S, PHASE_MULTIPLE, STALE_BEATS, STARTUP_S, hang_bound,
                               stopped_ranks)


def test_the_bound_is_five_slowest_steps_with_a_floor_and_longer_before_steps_are_timed():
    assert hang_bound("start", None, 0) == STARTUP_S
    assert hang_bound("train", None, 0) == STARTUP_S  # one step done: none timed yet
    assert hang_bound("train", 3.0, 0) == HANG_FLOOR_S
    assert hang_bound("train", 60.0, 0) == 300.0
    assert hang_bound("train", 60.0, 45) == 45  # train.hang_timeout
    assert hang_bound("save", 60.0, 45) == STARTUP_S and hang_bound("eval", 1.0, 0) == STARTUP_S


def test_a_save_or_evaluation_is_bounded_by_the_slowest_seen_once_one_was_timed():
    assert hang_bound("save", 1.0, 0, slowest_phase=0.4) == HANG_FLOOR_S  # a sub-second save: 2 minutes, not 30
    assert hang_bound("save", 1.0, 0, slowest_phase=60.0) == PHASE_MULTIPLE * 60.0
    assert hang_bound("eval", 1.0, 900, slowest_phase=30.0) == 900  # train.hang_timeout, where larger
    assert hang_bound("save", None, 0, slowest_phase=None) == STARTUP_S  # the first save
    assert hang_bound("save_wait", 1.0, 0, slowest_phase=None) == STARTUP_S  # a save's stall bounds no write


def test_saves_and_evaluations_are_timed_from_their_start_to_the_step_after():
    job_control.reset()
    job_control.progress(1)
    job_control.progress(1, "save")
    started = job_control.progress_state(0)["progress_at"]
    job_control.progress(1, "train")
    state = job_control.progress_state(0)
    assert 0 <= state["slowest_save_s"] <= state["progress_at"] - started and state["slowest_eval_s"] is None
    assert state["slowest_step_s"] is None  # a save is no step
    job_control.progress(2, "eval")
    job_control.progress(2, "train")
    assert job_control.progress_state(0)["slowest_eval_s"] is not None


def test_step_times_count_only_between_steps():
    job_control.reset()
    job_control.progress(1)
    first = job_control.progress_state(0)["progress_at"]
    job_control.progress(1, "eval")
    job_control.progress(1, "train")  # back from an evaluation: not a step
    assert job_control.progress_state(0)["slowest_step_s"] is None
    job_control.progress(2)
    state = job_control.progress_state(0)
    assert state["step"] == 2 and 0 <= state["slowest_step_s"] <= state["progress_at"] - first
    job_control.reset()
    assert job_control.progress_state(7.0) == {"step": 0, "phase": "start", "progress_at": 7.0, "slowest_step_s": None,
                                               "slowest_save_s": None, "slowest_save_wait_s": None,
                                               "slowest_eval_s": None}


def test_a_rank_without_heartbeat_is_named_frozen_else_the_one_furthest_behind():
    now = 1000.0
    fresh, old = now - BEAT_S, now - (STALE_BEATS + 1) * BEAT_S

    def beat(alive, step, progress_at):
        return {"alive": alive, "step": step, "progress_at": progress_at}

    beats = {0: beat(fresh, 7, 900.0), 1: beat(old, 7, 890.0), 2: beat(fresh, 7, 900.0)}
    assert stopped_ranks(beats, now) == ([1], [0, 2])
    beats = {0: beat(fresh, 7, 900.0), 1: beat(fresh, 6, 800.0), 2: beat(fresh, 7, 900.0)}
    assert stopped_ranks(beats, now) == ([], [1])


# A rank of job 42 that detects a hang while rank 0, alive, waits at the same step: rank 0
# acts, this rank waits. Its watchdog beats every 0.2 s instead of 5 s (the module's
# constants, read at each use), so that the detection takes about two seconds.
WAITING_RANK = """
import json, os, sys, threading, time
from pathlib import Path
from launchers import watchdog
from launchers.job import recorded_failure
from orchestrator.runtime import job_control

watchdog.BEAT_S = 0.2
run_dir = Path(sys.argv[1])
job_control.reset()
job_control.progress(1)
job_control.progress(2)

def peer():
    path = watchdog.heartbeat_path(run_dir, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path.with_suffix('.tmp').write_text(json.dumps({'rank': 0, 'host': 'here', 'pid': 1, 'alive': time.time(),
                                                      'step': 2, 'phase': 'train', 'progress_at': time.time() - 60}))
        os.replace(path.with_suffix('.tmp'), path)
        time.sleep(0.05)

threading.Thread(target=peer, daemon=True).start()
watchdog.Watchdog(run_dir, 1, 2, 0.5, lambda cause: sys.exit('rank 1 must not act'),
                  job_failed=lambda: recorded_failure(run_dir, '42')).start()
time.sleep(600)
"""


def test_a_rank_waiting_for_slurm_to_end_it_ends_once_the_run_records_the_jobs_failure(tmp_path):
    """The rank that acts on a hang (or on a peer's error) ends the job's step with one
    signal, which a node can miss; the others wait for it (for a requeue, up to
    REQUEUE_GRACE_S). Such a waiting rank ends on its own once state.json records this
    job's failure, and not for a requeue (PREEMPTED) or another job's failure."""
    from tests.distributed_run import REPO

    state, log = tmp_path / "state.json", tmp_path / "rank1.log"

    def record(**fields):
        state.write_text(json.dumps(fields))

    record(state="RUNNING", job_id="42")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", WAITING_RANK, str(tmp_path)], stderr=out, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.time() + 120
        while "hang: no progress" not in log.read_text() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert "hang: no progress" in log.read_text() and "rank 0 (pid 1 on here) furthest behind" in log.read_text(), \
            log.read_text()
        record(state="PREEMPTED", job_id="42")  # the acting rank requeued it: SLURM ends this task
        time.sleep(1.5)
        record(state="FAILED", job_id="41", error="an earlier job's")
        time.sleep(1.5)
        assert proc.poll() is None, log.read_text()
        record(state="FAILED", job_id="42", error="Traceback (most recent call last):\n  ...\nValueError: boom")
        assert proc.wait(timeout=60) == 1, log.read_text()
        assert "[watchdog] rank 1: the job failed (ValueError: boom); ending this task" in log.read_text()
    finally:
        proc.kill()
        proc.wait()
