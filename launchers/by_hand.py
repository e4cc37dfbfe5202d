"""A prepared run started by hand, on every rank: `audiollm prepare` prints how.

    srun python -m launchers.by_hand RUN_DIR                      # inside an allocation
    torchrun --nnodes=N --nproc-per-node=G ... -m launchers.by_hand RUN_DIR

What a submitted job's ranks get from launchers/job.py, without submitit:

* ranks from SLURM's variables where RANK is absent (srun), else from torchrun's;
* this rank's output also in RUN_DIR/logs/rank<N>.log, where the failure records point;
* SIGTERM, SIGUSR2 and SIGINT (a time limit, `scancel`, a preemption, Ctrl-C to torchrun,
  which passes it on to its workers) write a checkpoint at the next step boundary, and the
  rank exits 0: the same command resumes from it. Without this, the first SIGTERM killed
  the rank where it was, and the steps since the last checkpoint were lost;
* a rank that raises records its error (logs/failure_rank<N>.json, launchers/failures.py),
  and the run's state.json says RUNNING, COMPLETED, STOPPED or FAILED, so that `audiollm
  status RUN_DIR` shows the run and names the cause of its failure as for a submitted one
  (a run whose ranks all stopped beating without a word: DIED);
* the hang detection of launchers/watchdog.py: the rank that finds the job stalled
  past train.hang_timeout logs every thread's stack, names the stopped rank, records the
  cause and exits 1, and so do the others: srun and torchrun then end the step, instead
  of waiting for the process group's own timeout in silence. No requeue: nothing here
  owns a queue; the same command resumes;
* no start beside a submitted job of the run that is queued or running (rank 0 asks its
  scheduler once): two jobs would write one run's checkpoints. `audiollm train` refuses
  the other way round (launchers/submit.py ensure_not_active).

The entry is the run's launcher.entry (the trainer by default), as for a submitted job.
Imports neither torch nor megatron itself: the entry does.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from launchers import failures, watchdog
from launchers.job import (end_slurm_step, hang_timeout, load_callable, log_to_run_dir, recorded_failure,
                          update_state)
from launchers.summary import active_submission
from orchestrator.plan.rundir import read_json
from orchestrator.runtime import job_control
from orchestrator.runtime.slurm_env import export_from_slurm

DEFAULT_ENTRY = "orchestrator.train.entry.main"


def job_id() -> str:
    """What the failure records name this start by: SLURM's job and step, torchrun's run id."""
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        step = os.environ.get("SLURM_STEP_ID")
        return f"{slurm}.{step}" if step else slurm
    return os.environ.get("TORCHELASTIC_RUN_ID") or "by-hand"


def refuse(why: str) -> int:
    """Rank 0's refusal to start beside a submitted job of the run (two jobs must never write
    one run's checkpoints), before this start touched the run directory. The other ranks
    wait for rank 0 in the process group's set-up, where a stop signal only asks for a
    checkpoint at a step that never comes: torchrun kills them 30 s after rank 0 ended;
    under srun, rank 0 ends the tasks of its step at once, as srun's --kill-on-bad-exit
    would."""
    print(f"not started: {why}", file=sys.stderr, flush=True)
    end_slurm_step(0)
    return 2


def main(run_dir: str) -> int:
    run_path = Path(run_dir)
    if not (run_path / "plan.json").is_file():
        print(f"{run_path} holds no plan.json: prepare it first (`audiollm prepare OVERRIDES`)", file=sys.stderr)
        return 2
    export_from_slurm()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if rank == 0:
        submitted = active_submission(run_path)  # one scheduler query, by one rank
        if submitted:
            return refuse(submitted)
    log_to_run_dir(run_path, rank)
    started_by = job_id()
    print(f"[by hand {time.strftime('%H:%M:%S')}] rank {rank}/{world_size} pid {os.getpid()} ({started_by})",
          flush=True)
    failures.clear(run_path, rank)
    if rank == 0:  # launch None: no launch.json entry is this start's (launchers/summary.py run_state)
        update_state(run_path, state="RUNNING", by_hand=True, job_id=started_by, launch=None, error=None)
    job_control.reset()
    job_control.install_handlers((*job_control.STOP_SIGNALS, signal.SIGINT))  # SIGINT: Ctrl-C to torchrun

    def hung(cause: str) -> bool:
        failures.record(run_path, rank, started_by, RuntimeError(cause))
        update_state(run_path, state="FAILED", error=cause)
        print(f"[by hand] rank {rank}: {cause}; ending this rank (the same command resumes from the latest "
              f"checkpoint)", flush=True)
        return False

    dog = watchdog.Watchdog(run_path, rank, world_size, hang_timeout(run_path), hung,
                            job_failed=lambda: recorded_failure(run_path, started_by)).start()
    config = (read_json(run_path / "plan.json", default={}) or {}).get("config") or {}
    entry = (config.get("launcher") or {}).get("entry") or DEFAULT_ENTRY
    try:
        load_callable(entry)(str(run_path))
    except BaseException as exc:
        failures.record(run_path, rank, started_by, exc)
        if rank == 0:
            update_state(run_path, state="FAILED", error=traceback.format_exc(limit=5))
        raise
    finally:
        dog.stop()
        sys.stdout.flush()
        sys.stderr.flush()
    stopped = job_control.stopped_early()
    if stopped:
        print(f"[by hand] rank {rank}: stopped by {job_control.stop_signal()} after a checkpoint; the same command "
              f"resumes from it", flush=True)
    if rank == 0:
        update_state(run_path, state="STOPPED" if stopped else "COMPLETED")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m launchers.by_hand RUN_DIR")
    sys.exit(main(sys.argv[1]))
