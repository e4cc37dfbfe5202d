"""The callable that submitit runs on every task (rank) of a job.

    RankJob(entry, accelerator, max_requeues)(run_dir, launch_index)

1. exports the torch.distributed environment (RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) from submitit's job environment, the
   port below the ephemeral range (orchestrator/runtime/ports.py);
2. copies this rank's output into <run_dir>/logs/rank<N>.log (appended across restarts);
   Python warnings go to that log only;
3. replaces submitit's signal handlers: SIGUSR2 (preemption / time limit warning)
   and SIGTERM only set a flag that the entry reads at its next step boundary
   (orchestrator.runtime.job_control.should_stop), so checkpoints are never written mid-step;
4. calls the entry `f(run_dir)` (a dotted path, so the trainer is pluggable); a rank
   whose entry raises records the error (logs/failure_rank<N>.json, launchers/failures.py),
   from which `audiollm status` and the console name the cause of a failed job in one line;
5. if the entry stopped early, requeues: on SLURM rank 0 runs `scontrol requeue`
   (after SIGUSR2; after SIGTERM SLURM itself decides, e.g. preemption in requeue
   mode) and every rank exits without a result, so submitit's watcher keeps waiting;
   locally every rank exits with submitit's requeue code, which restarts the tasks.
   After `max_requeues` requeues the run fails with a message saying how to resume.

Imports torch only through the entry and orchestrator.runtime.job_control, never at import time.
"""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from launchers import failures, slurm_records, watchdog
from orchestrator.plan.rundir import read_json, write_json
from orchestrator.runtime import job_control
from orchestrator.runtime.ports import port_for_job

# submitit.local.local.LOCAL_REQUEUE_RETURN_CODE: the local controller restarts the tasks.
LOCAL_REQUEUE_RETURN_CODE = 144


def load_callable(dotted: str) -> Callable[[str], Any]:
    """'pkg.mod.func' or 'pkg.mod:func' -> the function."""
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"launcher.entry must be 'package.module.function', got {dotted!r}")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"launcher.entry {dotted!r}: module {module_name} has no attribute {attr!r}") from None


class _Tee(io.TextIOBase):
    """Write to the task's original stream and to the per-rank log file (`log`, which
    the job may also write to alone: details that the console does not need)."""

    def __init__(self, stream, log):
        self._stream, self.log = stream, log

    def write(self, text: str) -> int:
        # A full disk must not turn every print into a new error (and Python's own report
        # of the first into "lost sys.stderr"): what cannot be written is dropped.
        for target in (self._stream, self.log):
            try:
                target.write(text)
            except (OSError, ValueError):
                pass
        return len(text)

    def flush(self) -> None:
        for target in (self._stream, self.log):
            try:
                target.flush()
            except (OSError, ValueError):
                pass

    def fileno(self) -> int:
        return self._stream.fileno()


def log_to_run_dir(run_path: Path, rank: int) -> None:
    """This rank's output also into <run_dir>/logs/rank<N>.log (appended across restarts),
    and Python warnings (libraries' notices: optional packages missing, deprecations) into
    that log only, not to the console."""
    (run_path / "logs").mkdir(parents=True, exist_ok=True)
    log = open(run_path / "logs" / f"rank{rank}.log", "a", buffering=1)
    sys.stdout, sys.stderr = _Tee(sys.__stdout__, log), _Tee(sys.__stderr__, log)

    def show(message, category, filename, lineno, file=None, line=None):
        log.write(warnings.formatwarning(message, category, filename, lineno, line))
    warnings.showwarning = show


def hang_timeout(run_dir: Path) -> float:
    """train.hang_timeout of the run's plan (0: derived from the step times)."""
    plan = read_json(run_dir / "plan.json", default={}) or {}
    return float(((plan.get("config") or {}).get("train") or {}).get("hang_timeout") or 0)


def end_slurm_step(rank: int) -> None:
    """End every task of this process's SLURM job step, this one too, as srun's
    --kill-on-bad-exit would (nothing outside a step)."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if job and step:
        print(f"[launcher {time.strftime('%H:%M:%S')}] rank {rank}: ending the tasks of step {job}.{step}",
              flush=True)
        subprocess.run(["scancel", "--signal=KILL", f"{job}.{step}"], check=False, timeout=60)


def recorded_failure(run_dir: Path, job_id: str) -> str | None:
    """The last line of job `job_id`'s failure where state.json records one (its state
    FAILED, by whichever rank decided it), else None."""
    state = read_json(run_dir / "state.json", default={}) or {}
    if state.get("state") != "FAILED" or str(state.get("job_id")) != str(job_id):
        return None
    return (str(state.get("error") or "").strip().splitlines() or ["no cause recorded"])[-1]


def update_state(run_dir: Path, **fields: Any) -> None:
    path = run_dir / "state.json"
    state = read_json(path, default={}) or {}
    state.update(fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        write_json(path, state)
    except OSError as exc:  # a full disk: say so, and let the job's own error be the one raised
        print(f"[launcher] could not write {path} (state {fields.get('state')}): {exc}", flush=True)


def _limit_cpu_threads(local_world_size: int) -> int:
    """CPU ranks of a node share its cores, but torch starts one thread per core in every
    rank: N ranks would oversubscribe the machine N-fold (SLURM does not always pin tasks
    to their CPUs). Like torchrun, set OMP_NUM_THREADS unless the user did: the task's
    CPUs on SLURM, else this process's usable cores split among the node's ranks.
    Returns the thread count in effect."""
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"])
    per_task = os.environ.get("SLURM_CPUS_PER_TASK")
    threads = int(per_task) if per_task else max(1, len(os.sched_getaffinity(0)) // max(1, local_world_size))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already imported: the variable alone comes too late
        sys.modules["torch"].set_num_threads(threads)
    return threads


def _require_cuda(hostname: str, local_rank: int) -> None:
    """launcher.accelerator=gpu: stop at once, in one line, where this task has no CUDA
    device (a CPU node, a missing driver, a GPU count below the tasks per node) instead
    of failing later inside NCCL or the model build."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    fix = "run on GPU nodes (launcher.partition, launcher.constraint) or set launcher.accelerator=cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device on {hostname}: torch {torch.__version__} (CUDA {torch.version.cuda}) "
                           f"sees none, CUDA_VISIBLE_DEVICES={visible!r}; {fix}")
    if local_rank >= torch.cuda.device_count():
        raise RuntimeError(f"no CUDA device on {hostname} for local rank {local_rank}: "
                           f"{torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES={visible!r}); "
                           f"launcher.gpus_per_node must not exceed the GPUs of a node")


class RankJob:
    """Picklable job callable; see the module docstring."""

    def __init__(self, entry: str, accelerator: str = "cpu", max_requeues: int = 3):
        self.entry = entry
        self.accelerator = accelerator
        self.max_requeues = max_requeues

    def __call__(self, run_dir: str, launch_index: int = 0) -> dict:
        """`launch_index` numbers the submissions of this run (launch.json); requeues are counted per launch."""
        import submitit

        run_path = Path(run_dir)
        env = submitit.JobEnvironment()
        if env.name() == "slurm":
            # submitit's default port is random in 20000-60000, which overlaps the ports the
            # kernel lends to outgoing connections; locally launchers/local_controller.py sets it.
            os.environ.setdefault("MASTER_PORT", str(port_for_job(os.environ.get("SLURM_JOB_ID") or env.job_id)))
        dist_env = submitit.helpers.TorchDistributedEnvironment()
        # Every task keeps the node's CUDA_VISIBLE_DEVICES: the job picks its device from
        # LOCAL_RANK (orchestrator/runtime/distributed.py), and NCCL sees all local GPUs.
        dist_env.export(set_cuda_visible_devices=False, overwrite=True)
        rank = dist_env.rank
        on_slurm = env.name() == "slurm"
        threads = _limit_cpu_threads(dist_env.local_world_size) if self.accelerator == "cpu" else None

        log_to_run_dir(run_path, rank)
        state = read_json(run_path / "state.json", default={}) or {}
        if state.get("launch") != launch_index:
            state = {"launch": launch_index, "requeues": 0, "attempt": 0}
        attempt = int(state.get("attempt", 0)) + 1
        # Only rank 0 owns state.json, so only its attempt number is reliable.
        print(
            f"[launcher {time.strftime('%H:%M:%S')}] rank {rank}/{dist_env.world_size} pid {os.getpid()} "
            f"job {env.job_id} on {env.hostname} master {dist_env.master_addr}:{dist_env.master_port}"
            + (f" cpu threads {threads}" if threads else "") + (f" attempt {attempt}" if rank == 0 else ""),
            flush=True,
        )
        failures.clear(run_path, rank)  # a record of an earlier start is not this one's
        if rank == 0:
            update_state(
                run_path, state="RUNNING", by_hand=False, launch=launch_index, attempt=attempt,
                requeues=int(state.get("requeues", 0)), job_id=env.job_id, error=None,
                requeue_causes=state.get("requeue_causes") or {},  # this launch's only
            )

        job_control.reset()
        job_control.install_handlers()
        requeues = int(state.get("requeues", 0))
        started = time.time()
        # On SLURM rank 0 follows srun's report of its peers (the local controller does it
        # for a local job's tasks).
        peers = {}
        if on_slurm and rank == 0:
            tail = slurm_records.SrunLogTail(slurm_records.srun_log(env.paths.folder, env.job_id))
            peers = {"peer_ended": lambda stepped: _srun_reports_an_end(run_path, env, tail, dist_env.world_size,
                                                                        stepped),
                     "on_peer_ended": lambda cause: self._peer_ended(run_path, env, rank, cause)}
        dog = watchdog.Watchdog(run_path, rank, dist_env.world_size, hang_timeout(run_path),
                                lambda cause: self._hung(run_path, env, rank, on_slurm, requeues, attempt, cause,
                                                         started),
                                job_failed=lambda: recorded_failure(run_path, env.job_id), **peers).start()
        try:
            if self.accelerator == "gpu":
                _require_cuda(env.hostname, dist_env.local_rank)
            result = load_callable(self.entry)(str(run_path))
        except BaseException as exc:
            failures.record(run_path, rank, env.job_id, exc, launch_index)  # every rank: status names the cause
            if rank == 0:
                update_state(run_path, state="FAILED", error=traceback.format_exc(limit=5))
                _refresh_sweep_summary(run_path)
            raise
        finally:
            dog.stop()
            _destroy_process_group()
            sys.stdout.flush()
            sys.stderr.flush()

        if not job_control.stopped_early():
            if rank == 0:
                update_state(run_path, state="COMPLETED")
                _refresh_sweep_summary(run_path)
            return {"rank": rank, "result": result}
        # The count read at start: rank 0 rewrites state.json while the others decide.
        return self._requeue(run_path, env, rank, on_slurm, int(state.get("requeues", 0)))

    def _hung(self, run_path: Path, env, rank: int, on_slurm: bool, requeues: int, attempt: int, cause: str,
              started: float) -> bool:
        """The watchdog's verdict (launchers/watchdog.py), on the rank that acts on it: on
        SLURM the job is requeued (counted, with its cause) and resumes from its latest
        checkpoint; elsewhere, or past launcher.max_requeues, it ends FAILED, and the same
        command resumes it. A rank that stopped because it raised an error of its own
        (its peers, in a NCCL collective, wait for it without one) is no hang: the job
        ends FAILED with that error as its cause, because a requeue would meet it again.
        True when requeued."""
        # A record from before this attempt belongs to an earlier one (its tasks start
        # within seconds of each other: a minute of margin).
        if failures.own_errors(run_path, env.job_id, since=started - 60):
            raised = failures.explain(run_path, env.job_id) or cause
            print(f"[launcher {time.strftime('%H:%M:%S')}] not a hang: {raised}", flush=True)
            self._fail(run_path, env, rank, on_slurm, RuntimeError(f"a peer raised an error: {raised}"), raised,
                       lost_peer=True)
            return False
        if on_slurm and requeues < self.max_requeues:
            causes = (read_json(run_path / "state.json", default={}) or {}).get("requeue_causes") or {}
            update_state(run_path, state="PREEMPTED", requeues=requeues + 1, signal="hang", stopped_at=time.time(),
                          requeue_causes={**causes, str(attempt): cause})
            print(f"[launcher {time.strftime('%H:%M:%S')}] {cause}; requeuing job {env.job_id}", flush=True)
            subprocess.run(["scontrol", "requeue", env.job_id], check=False, timeout=60)
            return True
        self._fail(run_path, env, rank, on_slurm, RuntimeError(cause), cause)
        return False

    def _peer_ended(self, run_path: Path, env, rank: int, cause: str) -> None:
        """The watchdog's verdict that a peer ended while this rank waited for it: the job
        fails, its cause the peer's end (this rank's record is only that it lost it), as a
        local job's controller ends one and as gloo's ranks end on their own: no requeue,
        because what killed a rank or made it raise would most likely do it again; the
        same command resumes the run from its latest checkpoint."""
        self._fail(run_path, env, rank, True, RuntimeError(f"a peer ended: {cause}"), cause, lost_peer=True)

    @staticmethod
    def _fail(run_path: Path, env, rank: int, on_slurm: bool, error: Exception, cause: str,
              lost_peer: bool | None = None) -> None:
        """The job's failure, decided by this rank for all: its record, the run's state, and
        on SLURM the end of every task of the job's step (this one too), as srun's
        --kill-on-bad-exit would: srun keeps running the tasks that wait in a NCCL
        collective for a peer that is gone, for the process group's timeout (10 minutes)."""
        failures.record(run_path, rank, env.job_id, error, lost_peer=lost_peer)
        update_state(run_path, state="FAILED", error=cause)
        _refresh_sweep_summary(run_path)
        if on_slurm:
            end_slurm_step(rank)

    def _requeue(self, run_path: Path, env, rank: int, on_slurm: bool, requeues: int) -> dict:
        signame = job_control.stop_signal() or "SIGTERM"
        if requeues >= self.max_requeues:
            message = (
                f"stopped by {signame} after {requeues} requeues (launcher.max_requeues={self.max_requeues}); "
                "the checkpoint is kept: run the same command again with run.resume=auto to continue"
            )
            if rank == 0:
                update_state(run_path, state="FAILED", error=message)
                _refresh_sweep_summary(run_path)
            raise RuntimeError(message)
        print(f"[launcher {time.strftime('%H:%M:%S')}] rank {rank}: checkpoint written after {signame}; exiting for requeue", flush=True)
        if rank == 0:
            update_state(run_path, state="PREEMPTED", requeues=requeues + 1, signal=signame, stopped_at=time.time())
            if on_slurm and signame == "SIGUSR2":
                # Requeue this job (array element ids "A_i" are accepted as they are).
                subprocess.run(["scontrol", "requeue", env.job_id], check=False, timeout=60)
        sys.stdout.flush()
        # No result file: submitit's watcher sees the requeued job, not a finished one.
        if on_slurm:
            raise SystemExit(1)
        if signame == "SIGTERM":  # local: stopped by the user (cancel), not a time limit
            raise SystemExit(1)
        raise SystemExit(LOCAL_REQUEUE_RETURN_CODE)


def _srun_reports_an_end(run_path: Path, env, tail: slurm_records.SrunLogTail, world_size: int,
                         stepped: bool) -> str | None:
    """The cause of the job's failure as srun's report of this attempt's tasks gives it
    (launchers/failures.py), once it reports a task that ended: None before. Read
    every beat. Once the job has stepped, a lost node is SLURM's to handle: it ends the
    job's step itself, and requeues the job where its configuration says so."""
    ends = tail.ends(world_size)
    if stepped:
        ends.lost_nodes = []
    if not (ends.codes or ends.oom or ends.lost_nodes):
        return None
    return failures.explain(run_path, env.job_id, ends) or "; ".join(
        f"rank {rank} ended with exit code {code} (srun)" for rank, code in ends.codes.items())


def _refresh_sweep_summary(run_path: Path) -> None:
    # A sweep's summary table is rewritten by each point as it ends; never fail the job for it.
    try:
        from launchers.summary import write_sweep_summary

        if (run_path.parent / "sweep.json").exists():
            write_sweep_summary(run_path.parent, query_scheduler=False)
    except Exception as exc:  # noqa: BLE001
        print(f"[launcher] could not update the sweep summary: {exc}", flush=True)


def _destroy_process_group() -> None:
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
