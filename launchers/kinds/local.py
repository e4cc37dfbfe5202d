"""launcher.kind=local: the job's ranks as processes on this machine, started by submitit's
local executor (`tasks_per_node = nodes x gpus_per_node`, nodes=1) through
launchers/local_controller.py, which keeps each task's exit status. The command that
submits streams rank 0's output until the job ends (launcher.wait, default true); Ctrl-C
asks the job to checkpoint and stop. A sweep runs its points one after another."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from launchers.follow import failure_line, latest_checkpoint
from launchers.kinds import Launcher, SchedulerView, TaskEnds, size_text, world_size
from launchers.local_controller import exit_codes_path
from launchers.rank_start import launcher_python
from launchers.runs import EXIT_FAILED, EXIT_OK
from orchestrator.plan.rundir import read_json


class LocalLauncher(Launcher):
    name = "local"
    queues = False

    def executor(self, launcher: Mapping[str, Any], folder: Path, job_name: str):
        import submitit

        executor = submitit.AutoExecutor(folder=folder, cluster="local", local_python=launcher_python())
        params: dict[str, Any] = {
            "name": job_name,
            "tasks_per_node": world_size(launcher),
            "timeout_min": int(launcher["timeout_min"]),
        }
        if launcher["accelerator"] == "gpu":
            params["gpus_per_node"] = world_size(launcher)
        if launcher.get("setup"):
            params["local_setup"] = list(launcher["setup"])
        executor.update_parameters(**params)
        return executor

    def dry_run_text(self, launcher, folder, job_name, array_size=None) -> str:
        return (f"# local: {world_size(launcher)} processes on this machine "
                f"({'gloo' if launcher['accelerator'] == 'cpu' else 'nccl'}), entry {launcher['entry']}")

    def submitting(self):
        return own_session()

    def submitted(self, job, launcher) -> str:
        return f"started job {job.job_id} on this machine ({size_text(launcher)})"

    def wait(self, jobs: Sequence, run_dirs: Sequence[Path]) -> int:
        code = EXIT_OK
        for job, run_dir in zip(jobs, run_dirs):
            code = max(code, stream_local(job, run_dir=run_dir))
        return code

    def scheduler_view(self, job_id: str) -> SchedulerView:
        return SchedulerView(state="RUNNING" if alive(job_id) else "ENDED")

    def task_ends(self, job_id: str, folder: Path, world_size: int, query_scheduler: bool = True) -> TaskEnds:
        """The controller's record of each task's exit status (launchers/local_controller.py)."""
        record = read_json(exit_codes_path(folder, job_id), default={}) or {}
        codes = (record.get("exit_codes") or [])[:world_size]
        order = [r for r in record.get("ended") or [] if r < len(codes)] or range(len(codes))  # the order they ended
        return TaskEnds(codes={rank: codes[rank] for rank in order if codes[rank] is not None},
                        stopped=[r for r in record.get("stopped") or [] if r < world_size],
                        hosts=dict.fromkeys(range(len(codes)), record["host"]) if record.get("host") else {})

    def cancel(self, job_id: str) -> tuple[bool, str]:
        return signal_local(job_id, signal.SIGTERM), "process not running"


# submitit's own start/finish notices ("submitit INFO (<time>) - Starting with
# JobEnvironment(...)"): they stay in its log files, not on the console.
_SUBMITIT_NOTICE = "submitit INFO ("


def stream_local(job, run_dir: Path | None = None) -> int:
    """Print rank 0's stdout/stderr while the local job runs (whole lines, without
    submitit's own notices); Ctrl-C stops it gracefully."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(job.paths.folder, job_id=job.job_id, task_id=0)
    offsets = {paths.stdout: 0, paths.stderr: 0}
    partial = {paths.stdout: "", paths.stderr: ""}  # a line not yet ended

    def pump(final: bool = False) -> None:
        for path, stream in ((paths.stdout, sys.stdout), (paths.stderr, sys.stderr)):
            try:
                with open(path, "rb") as handle:
                    handle.seek(offsets[path])
                    data = handle.read()
            except FileNotFoundError:
                continue
            offsets[path] += len(data)
            lines = (partial[path] + data.decode(errors="replace")).split("\n")
            partial[path] = "" if final else lines.pop()
            shown = [line for line in lines if not line.startswith(_SUBMITIT_NOTICE)]
            if final and shown and shown[-1] == "":
                shown.pop()
            if shown:
                stream.write("\n".join(shown) + "\n")
                stream.flush()

    # The job runs in its own session (LocalLauncher.submitting): a terminal's Ctrl-C, and the hang-up
    # when the terminal closes, reach this process only. The first Ctrl-C, SIGTERM or
    # SIGHUP asks the job to checkpoint at its next step boundary and stop (a rerun of the
    # same command resumes there); a second Ctrl-C stops it at once.
    stop = _StopRequests()
    with stop.handling():
        while not job.done():
            pump()
            if stop.count == 1 and not stop.asked:
                stop.asked = True
                print(f"\n{stop.name}: asking the job to checkpoint at its next step and stop (Ctrl-C again stops "
                      f"it at once, losing the steps since its last checkpoint) ...", file=sys.stderr, flush=True)
                signal_local(str(job.job_id), signal.SIGTERM)
            elif stop.count > 1:
                kill_local(str(job.job_id))
                pump(final=True)
                print(f"stopped at once: the steps since the last checkpoint are lost; the same command resumes "
                      f"from {latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
                return stop.exit_code
            time.sleep(0.2)
    pump(final=True)
    if stop.count:
        print(f"stopped; the same command resumes from {latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
        return stop.exit_code
    try:
        job.results()
    except Exception as exc:  # noqa: BLE001 - submitit re-raises the task's failure
        print(f"job failed: {failure_line(job, run_dir, exc)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


class _StopRequests:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP while a local job streams: counted, not raised,
    so that the wait loop decides what each one does."""

    def __init__(self):
        self.count, self.name, self.asked, self.exit_code = 0, "", False, 0

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self.name = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "terminated (SIGTERM)",
                     signal.SIGHUP: "hang-up (SIGHUP: the terminal closed)"}.get(signum, signal.Signals(signum).name)
        self.exit_code = 128 + signum

    @contextlib.contextmanager
    def handling(self):
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@contextlib.contextmanager
def own_session():
    """submitit's local executor starts its controller (which starts the ranks) with a
    plain Popen, in this command's process group: a terminal's Ctrl-C, sent to the whole
    foreground group, would kill every rank mid-step and lose the steps since the last
    checkpoint. Within this block, processes start in a session of their own; this
    command forwards the stop request itself (stream_local). The controller is
    launchers.local_controller, which records how each task ended."""
    original = subprocess.Popen

    class SessionPopen(original):  # type: ignore[misc, valid-type]
        def __init__(self, args, *rest, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(_recording_controller(args), *rest, **kwargs)

    subprocess.Popen = SessionPopen
    try:
        yield
    finally:
        subprocess.Popen = original


def _recording_controller(args):
    """submitit's local controller command (a list, or a shell line after launcher.setup)
    with launchers.local_controller in its place: the same controller, keeping each
    task's exit status for launchers/failures.py."""
    module, ours = "submitit.local._local", "launchers.local_controller"
    if isinstance(args, str):
        return args.replace(f"-m {module} ", f"-m {ours} ")
    return [ours if a == module else a for a in args]


def kill_local(job_id: str) -> None:
    """Every process of a local job at once: its controller started a session of its own."""
    try:
        os.killpg(os.getpgid(int(job_id)), signal.SIGKILL)
    except (ValueError, ProcessLookupError, PermissionError):
        pass


def signal_local(job_id: str, sig: int) -> bool:
    try:
        os.kill(int(job_id), sig)  # the local controller forwards it to every task
    except (ValueError, ProcessLookupError, PermissionError):
        return False
    return True


def alive(job_id: str) -> bool:
    """Is the local job's controller process running (an unreaped zombie is not)?"""
    try:
        os.kill(int(job_id), 0)
    except (ValueError, ProcessLookupError, PermissionError):
        return False
    try:
        stat = Path(f"/proc/{int(job_id)}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


LAUNCHER = LocalLauncher()
