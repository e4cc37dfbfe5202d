"""What a training job needs from the launcher while it runs, on every rank.

Contract for a job entry `main(run_dir)`:

* At every step boundary call `should_stop()`. It is a collective (one tiny
  all-reduce over the default process group), so every rank gets the same answer.
  When it returns True, write a checkpoint of the step just finished and return.
  The launcher then requeues the job (SLURM) or restarts the tasks (local), and the
  next attempt resumes from that checkpoint.
* `wandb_run_id(run_dir)` is the W&B run id of this run; it is written once and kept
  across restarts, so the same W&B run continues (`resume="allow"`).

Why a flag and not an exception from the signal handler: a signal can arrive in the
middle of a collective or an optimizer step; saving there would write a torn state
or deadlock the other ranks. The flag is only read where the state is consistent.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

# Set by the signal handlers (local to this rank).
_requested: str | None = None
# Set when should_stop() returned True: every rank agreed to stop early, and on
# which signal (the strongest one any rank got: SIGUSR2 asks for a requeue).
_agreed = False
_agreed_signal: str | None = None
# SIGINT: torchrun passes a Ctrl-C on to its workers as it is (a rank started by hand).
_SIGNAL_CODES = {None: 0, "SIGINT": 1, "SIGTERM": 1, "SIGUSR2": 2}


def request_stop(signum: int, _frame=None) -> None:
    """Signal handler: remember that the job must stop at the next step boundary."""
    global _requested
    _requested = signal.Signals(signum).name


STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


def install_handlers(signals=STOP_SIGNALS) -> None:
    """Stop at the next step boundary on these signals, one that arrived while the task
    started included: launchers/rank_start.py blocks them until now."""
    for sig in signals:
        signal.signal(sig, request_stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def stop_signal() -> str | None:
    """The signal the ranks agreed to stop on (or, before that, the one this rank got)."""
    return _agreed_signal or _requested


def should_stop() -> bool:
    """Collective: True on every rank when any rank was asked to stop."""
    global _agreed, _agreed_signal
    code = _SIGNAL_CODES.get(_requested, 1)
    import torch.distributed as dist  # job side only

    if dist.is_available() and dist.is_initialized():
        import torch

        flag = torch.tensor([code], dtype=torch.int32)
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        code = int(flag.item())
    if code:
        _agreed = True
        # this rank's own signal where it is the agreed one's kind, else the kind's name
        _agreed_signal = (_requested if _SIGNAL_CODES.get(_requested) == code
                          else {v: k for k, v in _SIGNAL_CODES.items()}[code])
    return bool(code)


def stopped_early() -> bool:
    """True once should_stop() has returned True in this process."""
    return _agreed


def reset() -> None:
    """Forget any stop request (a new attempt in the same process, tests)."""
    global _requested, _agreed, _agreed_signal
    _requested, _agreed, _agreed_signal = None, False, None
    _progress.update(_START)


# The training loop's progress, read by the watchdog thread (launchers/watchdog.py).
# Phases besides steps whose durations bound the next ones: a save (synchronous, or the stall
# of a background one), the wait for background saves to be written (the run's end, a stop),
# an evaluation.
TIMED_PHASES = ("save", "save_wait", "eval")
# After the loop's last collective: this rank's own end (the logger's, a summary), while
# its peers may already have exited; bounded as the start is.
END_PHASE = "end"
_START = {"step": 0, "phase": "start", "progress_at": None, "slowest_step_s": None,
          **{f"slowest_{phase}_s": None for phase in TIMED_PHASES}}
_progress: dict = dict(_START)


def progress(step: int, phase: str = "train") -> None:
    """The loop calls this after every step (phase "train"), before what may take longer
    than a step ("eval", "save", "save_wait") and after it ("train" again, same step). A step's time
    is measured only between two "train" calls of consecutive steps, so evaluations and
    saves never count as slow steps; an evaluation's or a save's from its start to the
    "train" after it (the watchdog bounds the next ones by them)."""
    now = time.time()
    before, since = _progress["phase"], _progress["progress_at"]
    if phase == "train" and before == "train" and since is not None and step > _progress["step"]:
        took = (now - since) / (step - _progress["step"])
        _progress["slowest_step_s"] = max(_progress["slowest_step_s"] or 0.0, took)
    if phase == "train" and before in TIMED_PHASES and since is not None:
        key = f"slowest_{before}_s"
        _progress[key] = max(_progress[key] or 0.0, now - since)
    _progress.update(step=step, phase=phase, progress_at=now)


def progress_state(started: float) -> dict:
    """A copy of the loop's progress; before its first report, progress_at is `started`."""
    state = dict(_progress)
    if state["progress_at"] is None:
        state["progress_at"] = started
    return state


def wandb_run_id(run_dir: str | os.PathLike) -> str:
    """The run's W&B id, created on first use and stored in the run directory."""
    path = Path(run_dir) / "wandb_id"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:16]
    tmp = path.with_name(f"wandb_id.{os.getpid()}.tmp")
    tmp.write_text(run_id + "\n")
    try:
        os.link(tmp, path)  # atomic; the first rank to create it wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()
