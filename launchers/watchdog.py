"""No silent hang: a thread in every rank that notices when training stops progressing.

A rank frozen (SIGSTOP, a hung driver) or stuck leaves its peers waiting inside a
collective, and SLURM sees healthy nodes; without this the job would wait for the
process group's own timeout (600 s) and then fail with nobody named.

Every rank's watchdog thread writes RUN/heartbeats/rank<N>.json at its start and every
BEAT_S seconds: `host`, `pid`, `alive` (when the thread last ran: a frozen or dead process
stops writing), and the training loop's last progress (`step`, `phase`, `progress_at`,
from job_control.progress). A rank whose own progress has stalled past the bound
decides that the job hangs:

1. it writes every one of its threads' stacks into its log (faulthandler);
2. it reads every rank's heartbeat and names the ranks that stopped: those whose
   heartbeat went stale (frozen or dead), else those furthest behind;
3. the lowest-numbered live rank that detected it records the cause (state.json and
   logs/failure_rank<N>.json) and, on SLURM, requeues the job (`scontrol requeue`,
   counted as a requeue): the next attempt resumes from the latest checkpoint. Off
   SLURM it ends the job (frozen processes of this host are killed), and the same
   command resumes it. The other ranks wait for SLURM to end them, or end themselves
   once the run records the job's failure (state.json FAILED).

The bound, per phase of the loop: `train.hang_timeout` seconds when set (> 0); otherwise
max(HANG_FLOOR_S, 5 x the slowest step seen). While a checkpoint is written (or waited
for, when written in the background) or the model evaluated: max(train.hang_timeout or
HANG_FLOOR_S, 10 x the slowest of the same kind seen so far) -- a rank frozen in a save (a hung filesystem, the commonest hang on shared
storage) is found as soon as a rank stuck in a step would be. Before the first step, save
or evaluation is timed (model build, compilation, the first data): STARTUP_S.

Rank 0 of a SLURM job also follows what srun reports of the other tasks
(launchers/failures.py): a task that ended (killed, out of memory, an exit code) leaves
the others waiting for it -- at the rendezvous, or in a collective that NCCL does not
fail when a peer is gone -- so PEERS_GRACE_S later the job ends, its cause naming that
task, within seconds instead of the hang bound. After the first step a lost node is left
to SLURM, which ends (or requeues) the whole job itself. A local job's controller does
the same for its tasks (launchers/local_controller.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from orchestrator.runtime import job_control

BEAT_S = 5.0
HANG_FLOOR_S = 120.0
STARTUP_S = 1800.0
STEP_MULTIPLE = 5
PHASE_MULTIPLE = 10  # saves and evaluations vary more than steps (the filesystem, generation lengths)
STALE_BEATS = 4  # a heartbeat this many beats old: the process no longer runs
REQUEUE_GRACE_S = 120.0
# How long the ranks of a job get to notice on their own that one of them ended (they fail
# with a lost connection within seconds in a gloo collective) before the launcher ends them.
PEERS_GRACE_S = 15.0


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "heartbeats" / f"rank{rank}.json"


def read_beats(run_dir: Path, world_size: int) -> dict:
    """rank -> its last heartbeat ({"rank", "host", "pid", "alive", ...}), for the ranks
    of a world of `world_size` that wrote one that reads."""
    beats = {}
    for rank in range(world_size):
        try:
            beat = json.loads(heartbeat_path(run_dir, rank).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(beat, dict):
            beats[rank] = beat
    return beats


def hang_bound(phase: str, slowest_step: Optional[float], configured: float,
               slowest_phase: Optional[float] = None) -> float:
    """Seconds without progress after which the job is declared hung; `slowest_phase`:
    the slowest save or evaluation seen, in those phases."""
    if phase in job_control.TIMED_PHASES and slowest_phase is not None:
        return max(configured if configured > 0 else HANG_FLOOR_S, PHASE_MULTIPLE * slowest_phase)
    if phase != "train" or slowest_step is None:
        return max(STARTUP_S, configured)
    if configured > 0:
        return configured
    return max(HANG_FLOOR_S, STEP_MULTIPLE * slowest_step)


def stopped_ranks(beats: dict, now: float) -> tuple[list, list]:
    """(ranks whose heartbeat went stale: frozen or dead; live ranks furthest behind)."""
    stale = sorted(r for r, b in beats.items() if now - b["alive"] > STALE_BEATS * BEAT_S)
    live = {r: b for r, b in beats.items() if r not in stale}
    if not live:
        return stale, []
    lowest = min(b["step"] for b in live.values())
    oldest = min(b["progress_at"] for b in live.values() if b["step"] == lowest)
    behind = sorted(r for r, b in live.items() if b["step"] == lowest and b["progress_at"] == oldest)
    return stale, behind


class Watchdog:
    def __init__(self, run_dir: Path, rank: int, world_size: int, hang_timeout: float,
                 on_hang: Callable[[str], bool], peer_ended: Optional[Callable[[bool], Optional[str]]] = None,
                 on_peer_ended: Optional[Callable[[str], None]] = None,
                 job_failed: Optional[Callable[[], Optional[str]]] = None):
        self.run_dir, self.rank, self.world_size = Path(run_dir), rank, world_size
        self.hang_timeout = float(hang_timeout or 0)
        # Records the cause and requeues (True: SLURM ends every task) or ends the job.
        self.on_hang = on_hang
        # What the launcher saw of a peer that ended (None while all run; its argument:
        # whether this rank has stepped), and what records this job's failure for it (both
        # or neither).
        self.peer_ended, self.on_peer_ended = peer_ended, on_peer_ended
        self._peer_ended_at: Optional[float] = None
        # The job's failure as the run records it (its cause), None while it has none.
        self.job_failed = job_failed
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audiollm-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        heartbeat_path(self.run_dir, self.rank).parent.mkdir(parents=True, exist_ok=True)
        # At once, not a beat later: a rank killed in its first seconds is still named
        # with its host (launchers/failures.py reads the heartbeats' hosts).
        self._beat(time.time(), job_control.progress_state(self.started))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _beat(self, now: float, progress: dict) -> None:
        path = heartbeat_path(self.run_dir, self.rank)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps({"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                                       "alive": now, **progress}))
            os.replace(tmp, path)
        except OSError:
            pass  # a full disk: the job's own error is the one to report

    def _beats(self) -> dict:
        return read_beats(self.run_dir, self.world_size)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            now = time.time()
            progress = job_control.progress_state(self.started)
            self._beat(now, progress)
            bound = hang_bound(progress["phase"], progress["slowest_step_s"], self.hang_timeout,
                               progress.get(f"slowest_{progress['phase']}_s"))
            stalled = now - progress["progress_at"]
            if stalled > bound and self._declare(progress, stalled, bound):
                return
            if self.peer_ended is not None and progress["phase"] != job_control.END_PHASE:
                self._end_if_a_peer_ended(now, progress)

    def _end_if_a_peer_ended(self, now: float, progress: dict) -> None:
        """A rank that ended leaves the others waiting for it: at the rendezvous or in the
        first collective, bounded only by the process group's timeout (10 minutes) or
        STARTUP_S; later in a NCCL collective, bounded by the hang detection. PEERS_GRACE_S
        after the launcher reported it (gloo's ranks fail on their own by then), this rank
        records the job's failure and ends; the others lose it and end too."""
        started = progress["phase"] == "start"
        cause = self.peer_ended(not started)
        if cause is None:
            return
        self._peer_ended_at = self._peer_ended_at or now
        if now - self._peer_ended_at < PEERS_GRACE_S:
            return
        where = "while this rank started" if started else f"after step {progress['step']} ({progress['phase']})"
        print(f"[watchdog] rank {self.rank}: a peer ended {where} {now - self._peer_ended_at:.0f} s ago: {cause}; "
              "ending the job", file=sys.stderr, flush=True)
        self.on_peer_ended(cause)
        os._exit(1)

    def _declare(self, progress: dict, stalled: float, bound: float) -> bool:
        """False where progress came back while waiting (a whole job suspended and
        resumed, Ctrl-Z then fg): no hang. Otherwise it does not return."""
        log = sys.stderr
        print(f"[watchdog] rank {self.rank}: no progress for {stalled:.0f} s (bound {bound:.0f} s) in "
              f"{progress['phase']} after step {progress['step']}; this rank's threads:", file=log, flush=True)
        try:  # into the rank's own log file (faulthandler writes to a file descriptor)
            faulthandler.dump_traceback(file=getattr(log, "log", log), all_threads=True)
        except (OSError, ValueError, AttributeError):  # a log without a file descriptor
            pass
        # Let a frozen rank's heartbeat go stale, beating meanwhile (this rank is alive): a
        # rank that stopped when this one last progressed beat last a beat before that.
        deadline = time.time() + max(2 * BEAT_S, STALE_BEATS * BEAT_S + 1 - (stalled - BEAT_S))
        while time.time() < deadline:
            self._beat(time.time(), job_control.progress_state(self.started))
            time.sleep(min(BEAT_S, max(deadline - time.time(), 0)))
        if job_control.progress_state(self.started)["progress_at"] > progress["progress_at"]:
            print(f"[watchdog] rank {self.rank}: progress resumed; not a hang", file=log, flush=True)
            return False
        now = time.time()
        beats = self._beats()
        beats[self.rank] = {**beats.get(self.rank, {}), "alive": now, **job_control.progress_state(self.started)}
        stale, behind = stopped_ranks(beats, now)
        named = [f"rank {r} (pid {beats[r]['pid']} on {beats[r]['host']}): no heartbeat for "
                 f"{now - beats[r]['alive']:.0f} s, frozen or dead (its last: step {beats[r]['step']}, "
                 f"{beats[r]['phase']})" for r in stale]
        if not stale:
            named = [f"rank {r} (pid {beats[r]['pid']} on {beats[r]['host']}) furthest behind: step "
                     f"{beats[r]['step']} ({beats[r]['phase']}), last progress {now - beats[r]['progress_at']:.0f} s "
                     f"ago" for r in behind]
        cause = (f"hang: no progress for {stalled:.0f} s after step {progress['step']} (bound {bound:.0f} s); "
                 + "; ".join(named or ["no rank named (no heartbeats)"]))
        print(f"[watchdog] rank {self.rank}: {cause}", file=log, flush=True)
        live = [r for r in range(self.world_size) if r not in stale]
        requeued = False
        if live and self.rank == min(live):
            requeued = self.on_hang(cause)
            if not requeued:  # end the frozen processes of this host (SLURM's requeue ends them all)
                for r in stale:
                    if beats[r]["host"] == socket.gethostname():
                        _kill(int(beats[r]["pid"]))
        elif live:
            requeued = None  # the acting rank decides; SLURM ends this task if it requeues
        if requeued is not False:
            self._await_the_end()
        os._exit(1)

    def _await_the_end(self) -> None:
        """Up to REQUEUE_GRACE_S for SLURM to end this task, as it normally does long before:
        by the requeue, or by the acting rank's end of the job's step when the job fails.
        That end is one signal the controller sends once, node to node, and a node can miss
        it (a loaded two-node cluster: the message forwarded to the second node was lost,
        its ranks waited out the grace). So once the run records the job's failure, this
        rank ends on its own."""
        deadline = time.time() + REQUEUE_GRACE_S
        while time.time() < deadline:
            failed = self.job_failed() if self.job_failed is not None else None
            if failed:
                print(f"[watchdog] rank {self.rank}: the job failed ({failed}); ending this task",
                      file=sys.stderr, flush=True)
                return
            time.sleep(min(BEAT_S, max(deadline - time.time(), 0)))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


