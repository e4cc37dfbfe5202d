"""Waiting on runs with a deadline: a hung job fails its test, never the whole session."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from launchers.status import cancel
from orchestrator.plan.rundir import read_json, read_metrics
from launchers.summary import run_state
from tests.train.audiollm_runs import data_overrides, shared_corpus


MINIMAL_JOB = "launcher.entry=tests.launchers.minimal_job.main"


def tiny_overrides(root, *extra: str, ranks: int = 2, iters: int = 6) -> list[str]:
    """The default tiny recipe as a `ranks`-process CPU job writing under `root`, running
    the launchers' minimal job (seconds to start; these tests are about launching). It
    reads no data: the data keys point at a small corpus (audiollm_runs.shared_corpus)."""
    return [
        MINIMAL_JOB, "launcher.accelerator=cpu", f"launcher.gpus_per_node={ranks}", f"optim.micro_batch_size={16 // ranks}",
        "optim.lr_warmup_iters=0", f"train.iters={iters}", "train.log_interval=1", f"run.output_root={root}",
        *data_overrides(shared_corpus()), *extra,
    ]


def signal_at_start(directory: Path, rank: int, sig: int, rank_variable: str = "SUBMITIT_LOCAL_GLOBALID") -> str:
    """A directory for PYTHONPATH whose sitecustomize sends `sig` to rank `rank` (as
    `rank_variable` numbers the tasks: SLURM_PROCID on SLURM) while its interpreter
    starts, before any of the job's Python, once (the first start)."""
    hook = Path(directory) / f"signal_rank{rank}_at_start"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import os
        if os.environ.get("{rank_variable}") == "{rank}":
            try:
                os.close(os.open({str(hook / "sent")!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), {int(sig)})
        """))
    return str(hook)


def wait_until(predicate, timeout: float, what: str, run_dirs=(), interval: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    for run_dir in run_dirs:
        cancel(run_dir)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs_tail(run_dirs)}")


def logs_tail(run_dirs) -> str:
    """The end of each rank's log and of the scheduler's job logs (srun says there how
    a step ended), for an assertion's message."""
    paths = [p for d in run_dirs for pattern in ("logs/*.log", "submitit/*.err") for p in sorted(Path(d).glob(pattern))]
    return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in paths)


def wait_for_step(run_dir: Path, step: int, timeout: float) -> None:
    wait_until(lambda: any(m["step"] >= step for m in read_metrics(run_dir)), timeout, f"step {step} in {run_dir}",
               [run_dir])


def wait_for_end(run_dir: Path, timeout: float, query_scheduler: bool = True) -> dict:
    ended = ("COMPLETED", "STOPPED", "FAILED", "CANCELLED", "TIMEOUT", "DIED", "NODE_FAIL", "OUT_OF_MEMORY")

    def done():
        info = run_state(run_dir, query_scheduler=query_scheduler)
        return info if info["state"] in ended else None

    return wait_until(done, timeout, f"the end of {run_dir}", [run_dir], interval=0.5)


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run_dir)}


def rank_pids(run_dir: Path, rank: int) -> list[int]:
    text = (Path(run_dir) / "logs" / f"rank{rank}.log").read_text()
    return [int(p) for p in re.findall(r"\[launcher [\d:]+\] rank \d+/\d+ pid (\d+)", text)]


def launches(run_dir: Path) -> list[dict]:
    return (read_json(Path(run_dir) / "launch.json", default={}) or {}).get("launches", [])


def dump(path: Path) -> str:
    return json.dumps(read_json(path), indent=1)


def status_cause(run_dir) -> str:
    """The `cause` line of `audiollm status RUN_DIR`, run as a user runs it (its own process)."""
    from tests.distributed_run import REPO

    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", str(run_dir)], capture_output=True,
                         text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    causes = [line for line in out.splitlines() if line.startswith("cause     ")]
    assert len(causes) == 1 and not any(line.startswith("error") for line in out.splitlines()), out
    return causes[0].removeprefix("cause     ")
