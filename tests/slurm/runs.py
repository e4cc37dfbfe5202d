"""The real trainer's SLURM runs in the tests: launcher settings, overrides, and what
the tests read back of a run (shared by the single-node and the multi-node tests)."""

from __future__ import annotations

import subprocess
import time

from orchestrator.plan.rundir import read_json, read_metrics
from tests.launchers.helpers import wait_for_step, wait_until
from tests.train.audiollm_runs import train_overrides

# 1 CPU per task, so that two tasks (one 2-rank job, or two sweep points) run at once on
# 2 cores; a rank of the tiny AudioLLM holds ~0.9 GiB. These clusters do not bind tasks to
# their CPUs, so torch would start one thread per core of the machine in every rank: on a
# busy machine that oversubscription made steps 10-100x slower (0.1 s -> 3-30 s). The job
# uses as many threads as the CPUs SLURM gave its task, as a user would set it.
SLURM = ["launcher=slurm", "launcher.accelerator=cpu", "launcher.cpus_per_task=1", "launcher.mem_gb=4",
         "launcher.timeout_min=15", "launcher.setup=['export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK']"]
# Starting a job (imports, process group, model, loader) takes ~20-60 s here; a busy
# machine can make it several times slower.
JOB_TIMEOUT = 480


def slurm_run(root, corpus, *extra, ranks=2, iters=30):
    """A `ranks`-process-per-node job of the real trainer (data parallel unless `extra`
    says otherwise) writing under `root`, logging to W&B offline as the recipes do: the
    SLURM tests check one W&B run across requeues and W&B's service under SLURM's signals."""
    return [*SLURM, f"launcher.gpus_per_node={ranks}", *train_overrides(corpus, wandb=True), f"train.iters={iters}",
            f"run.output_root={root}", *extra]


def restarted_or_ended(run_dir, attempt: int = 2):
    """state.json once attempt `attempt` has started, or the run has ended."""
    state = read_json(run_dir / "state.json") or {}
    return state if state.get("attempt", 0) >= attempt or state.get("state") in ("COMPLETED", "FAILED") else None


def wandb_runs(run_dir) -> list:
    return sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))


def preempt_and_wait_for_resume(run_dir, job_id: str, signal_after: int) -> tuple[int, float]:
    """USR2 (SLURM's preemption / time-limit warning) once step `signal_after` is logged,
    then wait until the requeued attempt logs its first step. Returns (the first
    attempt's last step, which it checkpointed; seconds from the signal to that next step)."""
    wait_for_step(run_dir, signal_after, timeout=JOB_TIMEOUT)
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    state = wait_until(lambda: restarted_or_ended(run_dir), JOB_TIMEOUT, "the requeued job to start again", [run_dir])
    assert state.get("attempt") == 2, f"the run was not preempted (it ended before USR2 reached it?): {state}"
    # The first attempt has ended (rank 0 of the second one wrote `attempt`): its last
    # row is the checkpointed step; note when the next step appears.
    done_before = max(m["step"] for m in read_metrics(run_dir))
    wait_for_step(run_dir, done_before + 1, timeout=JOB_TIMEOUT)
    return done_before, time.time() - signalled
