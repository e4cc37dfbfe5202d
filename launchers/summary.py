"""State of runs and sweeps, as `audiollm status` shows it (no torch).

A run's state combines what the job wrote (state.json: RUNNING, PREEMPTED,
COMPLETED, FAILED) with the scheduler's view, which alone knows PENDING and jobs
that died without a word (cancelled, killed, node failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from launchers.rundir import last_launch, read_json, read_metrics

# Scheduler states after which the job will not write anything any more.
_SLURM_ENDED = ("CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def slurm_state(job_id: str) -> str | None:
    """SLURM's state of a job (or array element "A_i"): squeue while queued, then sacct."""
    for cmd in (
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
    ):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.split()
        except (subprocess.SubprocessError, OSError):
            continue
        if out:
            return out[0].split()[0]  # "CANCELLED by 0" -> "CANCELLED"
    return None


def _local_alive(job_id: str) -> bool:
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


def run_state(run_dir: Path, query_scheduler: bool = True) -> dict:
    """{"state", "scheduler", "job_id", "step", "iters", "loss", "error"} of one run."""
    run_dir = Path(run_dir)
    job_state = read_json(run_dir / "state.json", default={}) or {}
    launch = last_launch(run_dir) or {}
    job_ids = launch.get("job_ids") or []
    job_id = job_ids[0] if job_ids else None
    scheduler = None
    if query_scheduler and job_id is not None:
        if launch.get("kind") == "slurm":
            scheduler = slurm_state(str(job_id))
        else:
            scheduler = "RUNNING" if _local_alive(str(job_id)) else "ENDED"
    state = job_state.get("state") or ("SUBMITTED" if job_id is not None else "NOT SUBMITTED")
    if state == "RUNNING" and launch.get("launch_index") != job_state.get("launch"):
        state = "SUBMITTED"  # the state file is from an earlier launch
    if scheduler in ("PENDING", "REQUEUED", "CONFIGURING") and state != "COMPLETED":
        state = "PENDING"
    elif scheduler and scheduler.startswith(_SLURM_ENDED) and state in ("RUNNING", "PREEMPTED", "SUBMITTED"):
        state = scheduler
    elif scheduler == "ENDED" and state in ("RUNNING", "SUBMITTED"):
        state = "DIED"  # a local job ended without saying how
    elif scheduler == "ENDED" and state == "PREEMPTED":
        state = "STOPPED"  # a local run stopped with a checkpoint: run the same command to continue
    metrics = read_metrics(run_dir)
    cfg_iters = None
    cfg_path = run_dir / "config.yaml"
    if cfg_path.exists():
        import yaml

        cfg_iters = (yaml.safe_load(cfg_path.read_text()) or {}).get("train", {}).get("iters")
    return {
        "state": state,
        "scheduler": scheduler,
        "job_id": job_id,
        "kind": launch.get("kind"),
        "step": metrics[-1]["step"] if metrics else None,
        "iters": cfg_iters,
        "loss": metrics[-1].get("loss") if metrics else None,
        "requeues": job_state.get("requeues", 0),
        "error": job_state.get("error"),
    }


def _fmt_loss(loss) -> str:
    return "-" if loss is None else f"{loss:.6g}"


def format_run(run_dir: Path, info: dict) -> str:
    sched = f" (scheduler: {info['scheduler']}, job {info['job_id']})" if info["scheduler"] else ""
    step = "-" if info["step"] is None else f"{info['step']}/{info['iters']}"
    lines = [
        f"run       {run_dir}",
        f"state     {info['state']}{sched}",
        f"step      {step}",
        f"loss      {_fmt_loss(info['loss'])}",
        f"requeues  {info['requeues']}",
    ]
    if info.get("error"):
        lines.append("error     " + info["error"].strip().splitlines()[-1])
    return "\n".join(lines)


def sweep_table(sweep_dir: Path, query_scheduler: bool = True) -> str:
    sweep = read_json(Path(sweep_dir) / "sweep.json", default={"points": []})
    rows = [("point", "overrides", "state", "step", "final loss")]
    for point in sweep["points"]:
        info = run_state(Path(sweep_dir) / point["dir"], query_scheduler=query_scheduler)
        step = "-" if info["step"] is None else f"{info['step']}/{info['iters']}"
        rows.append((point["dir"], " ".join(point["swept"]), info["state"], step, _fmt_loss(info["loss"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_sweep_summary(sweep_dir: Path, query_scheduler: bool = True) -> str:
    """Rewrite <sweep_dir>/summary.txt (point, overrides, state, step, final loss)."""
    table = sweep_table(sweep_dir, query_scheduler=query_scheduler)
    path = Path(sweep_dir) / "summary.txt"
    tmp = path.with_name(f".summary.{os.getpid()}.tmp")
    tmp.write_text(table + "\n")
    os.replace(tmp, path)
    return table
