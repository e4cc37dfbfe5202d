"""State of runs and sweeps, as `audiollm status` shows it (no torch).

A run's state combines what the job wrote (state.json: RUNNING, PREEMPTED,
COMPLETED, FAILED) with the scheduler's view, which alone knows PENDING and jobs
that died without a word (cancelled, killed, node failure).
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.plan.checkpoint_dirs import FROZEN_SOURCE, frozen_source, frozen_source_problem, held_checkpoints
from orchestrator.plan.rundir import damage, last_launch, read_json, read_metrics
from launchers.kinds import SchedulerView, launcher_for

# Scheduler states after which the job will not write anything any more.
_SLURM_ENDED = ("CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


# Why a job is pending (squeue %r), in words; the keys are SLURM's reason codes.
PENDING_REASONS = {
    "Resources": "waiting for nodes with free CPUs/GPUs/memory: it starts when running jobs end",
    "Priority": "jobs of higher priority are ahead of it in the queue",
    "BeginTime": "not eligible yet (a requeued job waits a few seconds; or its begin time is later)",
    "Dependency": "waiting for the jobs it depends on",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "NodeDown": "a node it needs is down",
    "PartitionConfig": "the request exceeds what the partition allows: it will never start; `audiollm cancel` it "
                       "and fix the launcher section (`audiollm plan ... launcher=slurm` checks it here)",
    "PartitionNodeLimit": "more nodes than the partition allows per job: it will never start; cancel it and lower "
                          "launcher.nodes",
    "PartitionTimeLimit": "a time limit above the partition's: it will never start; cancel it and lower "
                          "launcher.timeout_min",
    "PartitionDown": "the partition is down",
    "JobHeldUser": "held by its user (scontrol release JOBID)",
    "JobHeldAdmin": "held by an administrator",
    "launch failed requeued held": "its launch failed on a node and SLURM held it (scontrol release JOBID)",
}


def explain_pending(reason: str | None) -> str | None:
    if not reason or reason == "None":
        return None
    if reason in PENDING_REASONS:
        return f"{reason}: {PENDING_REASONS[reason]}"
    if reason.startswith(("QOS", "Assoc")):
        return f"{reason}: a limit of its QOS or account holds it until the account's other jobs end"
    return reason


# How an attempt that did not finish the job ended, in words.
_ATTEMPT_ENDS = {
    "REQUEUED": "requeued (preemption or time-limit signal: checkpoint, then requeue)",
    "PREEMPTED": "preempted", "NODE_FAIL": "a node failed", "TIMEOUT": "hit the time limit",
    "BOOT_FAIL": "a node failed to boot", "OUT_OF_MEMORY": "out of memory",
}


def _step_at(metrics: list[dict], end: str) -> int | None:
    """The last step logged before `end` (sacct's local time, 2026-11-23T17:57:38, whole seconds)."""
    import datetime

    try:
        limit = datetime.datetime.fromisoformat(end).timestamp() + 1.0  # the end's second, all of it
    except ValueError:
        return None
    steps = [m["step"] for m in metrics if m.get("time") is not None and m["time"] <= limit]
    return steps[-1] if steps else 0


ACTIVE_STATES = ("PENDING", "RUNNING", "SUBMITTED")


def active_submission(run_dir: Path, info: dict | None = None) -> str | None:
    """Why the run cannot start now, where a submitted job of it is queued or running (its
    scheduler asked once); None otherwise. A run started by hand asks it too
    (launchers/by_hand.py)."""
    info = run_state(run_dir) if info is None else info
    if info.get("by_hand") or info["state"] not in ACTIVE_STATES or info["scheduler"] in (None, "ENDED", "COMPLETED"):
        return None
    return (f"run {run_dir} already has job {info['job_id']} ({info['state']}); "
            f"follow it with `audiollm status {run_dir}` or stop it with `audiollm cancel {run_dir}` first")


def run_state(run_dir: Path, query_scheduler: bool = True) -> dict:
    """{"state", "scheduler", "job_id", "step", "iters", "loss", "requeues", "pending" (why it waits),
    "history" (attempts that ended without finishing), "checkpoint", "error", "damaged" (files of the run
    directory that cannot be read, and frozen weights its latest checkpoint cannot read back, one line
    each), "held" (its checkpoints other runs hold: checkpoint_dirs.held_checkpoints), "frozen_from"
    (where its latest checkpoint reads its frozen weights, or None)} of one run; a damaged file never
    raises."""
    run_dir = Path(run_dir)
    job_state = read_json(run_dir / "state.json", default={})
    job_state = job_state if isinstance(job_state, dict) else {}
    by_hand = bool(job_state.get("by_hand"))  # started by srun or torchrun (launchers/by_hand.py): no launch
    launch = {} if by_hand else last_launch(run_dir) or {}
    job_ids = launch.get("job_ids") or []
    job_id = job_state.get("job_id") if by_hand else job_ids[0] if job_ids else None
    view = SchedulerView()
    if query_scheduler and job_ids:
        view = launcher_for(launch.get("kind")).scheduler_view(str(job_id))
    scheduler, attempts = view.state, view.attempts
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
    elif by_hand and state == "RUNNING" and not _beating(run_dir):
        state = "DIED"  # every rank stopped beating without saying how (killed, out of memory)
    metrics = read_metrics(run_dir)
    problems = {name: damage(run_dir / name) for name in ("state.json", "launch.json", "config.yaml", "plan.json")}
    damaged = [problem for problem in problems.values() if problem]
    cfg_iters = None
    cfg_path = run_dir / "config.yaml"
    if cfg_path.exists() and problems["config.yaml"] is None:
        import yaml

        cfg_iters = ((yaml.safe_load(cfg_path.read_text()) or {}).get("train") or {}).get("iters")
    # Attempts that ended without finishing (sacct lists one row per attempt; the last is the current one).
    # The job's own word where it requeued itself (a hang, launchers/watchdog.py), else SLURM's.
    own = job_state.get("requeue_causes") or {}
    history = [{**a, "cause": own.get(str(k)) or _ATTEMPT_ENDS.get(a["state"], a["state"].lower()),
                "step": _step_at(metrics, a["end"])}
               for k, a in enumerate(attempts[:-1], start=1)]
    latest = (run_dir / "checkpoints" / "latest")
    checkpoint = latest.read_text().strip() if latest.is_file() else None
    checkpoint_step = int(checkpoint.split("_")[-1]) if checkpoint and checkpoint.split("_")[-1].isdigit() else None
    if problems["state.json"] and state == "DIED":
        # The job's own record is lost: its checkpoints still tell a finished run.
        state = "COMPLETED" if checkpoint_step is not None and checkpoint_step == cfg_iters else "UNKNOWN"
    frozen_from = None
    latest_dir = run_dir / "checkpoints" / checkpoint if checkpoint else None
    if latest_dir is not None and latest_dir.is_dir():
        # A LoRA run's checkpoints leave the frozen base where model.init_checkpoint was.
        try:
            frozen_from = (frozen_source(latest_dir) or {}).get("source")
            problem = frozen_source_problem(latest_dir)  # None where it holds every weight
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = f"{checkpoint}/{FROZEN_SOURCE} cannot be read ({exc})"
        if problem:
            damaged.append(problem)
    last_step = metrics[-1]["step"] if metrics else None
    if checkpoint_step is not None and (last_step or 0) < checkpoint_step:
        damaged.append(f"metrics.jsonl ends at step {last_step or 0}, before the checkpoint of step "
                       f"{checkpoint_step} (lines were lost)")
    return {
        "state": state,
        "scheduler": scheduler,
        "job_id": job_id,
        "kind": launch.get("kind"),
        "by_hand": by_hand,
        "step": metrics[-1]["step"] if metrics else None,
        "iters": cfg_iters,
        "loss": metrics[-1].get("loss") if metrics else None,
        # The job counts the requeues it asked for; SLURM also counts those it did itself (node failure).
        "requeues": max(int(job_state.get("requeues", 0)), view.restarts, len(history)),
        "pending": explain_pending(view.reason) if scheduler == "PENDING" else None,
        "history": history,
        "checkpoint": checkpoint,
        "error": job_state.get("error"),
        "damaged": damaged,
        "held": held_checkpoints(run_dir / "checkpoints"),
        "frozen_from": frozen_from,
    }


def _beating(run_dir: Path) -> bool:
    """Whether a rank of a by-hand start still writes its heartbeat (launchers/watchdog.py),
    or started a moment ago (state.json says RUNNING just before the first beat)."""
    import time

    from launchers.watchdog import BEAT_S, STALE_BEATS

    files = [Path(run_dir) / "state.json", *(Path(run_dir) / "heartbeats").glob("rank*.json")]
    times = [f.stat().st_mtime for f in files if f.exists()]
    return bool(times) and time.time() - max(times) < STALE_BEATS * BEAT_S


# States of a run that ended without finishing: `audiollm status` names the cause. Not
# PREEMPTED: the job's own word while it is being requeued.
FAILED_STATES = ("FAILED", "DIED", "UNKNOWN") + tuple(s for s in _SLURM_ENDED if s != "PREEMPTED")


def failure_cause(run_dir: Path, info: dict) -> str | None:
    """Why the run's job failed, in one line (launchers/failures.py); None while it has not
    failed or where nothing was recorded."""
    if info.get("state") not in FAILED_STATES or info.get("job_id") is None:
        return None
    from launchers import failures

    launch = last_launch(run_dir) or {}
    folder = launch.get("submitit_folder") or Path(run_dir) / "submitit"
    return failures.cause(run_dir, launch.get("kind"), str(info["job_id"]), Path(folder),
                          query_scheduler=info.get("scheduler") is not None)


def _fmt_loss(loss) -> str:
    return "-" if loss is None else f"{loss:.6g}"


def format_run(run_dir: Path, info: dict) -> str:
    sched = f" (scheduler: {info['scheduler']}, job {info['job_id']})" if info["scheduler"] else ""
    if info.get("by_hand"):
        sched = f" (started by hand: {info['job_id']})"
    step = "-" if info["step"] is None else f"{info['step']}/{info['iters']}"
    lines = [
        f"run       {run_dir}",
        f"state     {info['state']}{sched}",
    ]
    if info.get("pending"):
        lines.append(f"waiting   {info['pending']}")
    lines += [
        f"step      {step}",
        f"loss      {_fmt_loss(info['loss'])}",
        f"requeues  {info['requeues']}",
    ]
    for k, attempt in enumerate(info.get("history") or [], start=1):
        # The run's metrics keep the steps up to the checkpoint it resumed from.
        at = "" if attempt["step"] is None else f" (steps kept: 1..{attempt['step']})"
        lines.append(f"{'history' if k == 1 else '':<10}attempt {k} on {attempt['nodes']} {attempt['start']} .. "
                     f"{attempt['end']}: {attempt['cause']}{at}")
    if info.get("checkpoint"):
        lines.append(f"checkpoint {info['checkpoint']}")
    if info.get("frozen_from"):
        lines.append(f"frozen    weights read from {info['frozen_from']} (train.save_frozen_weights=false: it must "
                     f"stay in place)")
    for k, (step, holders) in enumerate((info.get("held") or {}).items()):
        # Kept beyond train.keep_last (checkpoint_dirs.hold_checkpoint) until those runs are deleted.
        lines.append(f"{'held' if k == 0 else '':<10}{step} by {', '.join(holders)} (their checkpoints read "
                     f"frozen weights there)")
    if info.get("cause"):
        # In place of the job's own error (rank 0's, often only that a peer was gone).
        lines.append("cause     " + info["cause"])
    elif info.get("error"):
        lines.append("error     " + info["error"].strip().splitlines()[-1])
    for k, problem in enumerate(info.get("damaged") or []):
        lines.append(f"{'damaged' if k == 0 else '':<10}{problem}")
    return "\n".join(lines)


def format_eval_job(job_dir: Path, info: dict) -> str:
    """An evaluation job's state (launchers/eval_job.py) and what it has scored so far."""
    job = read_json(Path(job_dir) / "eval_job.json", default={}) or {}
    argv = job.get("argv") or []
    run_dir = Path(job_dir).parent.parent
    scored = sorted(p.stem for p in (run_dir / "eval").glob("step_*.json"))
    sched = f" (scheduler: {info['scheduler']}, job {info['job_id']})" if info["scheduler"] else ""
    lines = [f"eval job  {job_dir}", f"evaluates {' '.join(argv[1:]) or 'the latest checkpoint'} of {run_dir}",
             f"state     {info['state']}{sched}"]
    if info.get("pending"):
        lines.append(f"waiting   {info['pending']}")
    lines += [f"requeues  {info['requeues']}", f"scored    {', '.join(scored) or 'none yet'} (in {run_dir / 'eval'})"]
    if info.get("cause"):
        lines.append("cause     " + info["cause"])
    elif info.get("error"):
        lines.append("error     " + info["error"].strip().splitlines()[-1])
    return "\n".join(lines)


def sweep_table(sweep_dir: Path, query_scheduler: bool = True) -> str:
    sweep = read_json(Path(sweep_dir) / "sweep.json", default={"points": []})
    rows = [("point", "overrides", "state", "step", "requeues", "final loss")]
    for point in sweep["points"]:
        info = run_state(Path(sweep_dir) / point["dir"], query_scheduler=query_scheduler)
        step = "-" if info["step"] is None else f"{info['step']}/{info['iters']}"
        state = info["state"] + (f" ({info['pending'].split(':')[0]})" if info.get("pending") else "")
        rows.append((point["dir"], " ".join(point["swept"]), state, step, str(info["requeues"]),
                     _fmt_loss(info["loss"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_sweep_summary(sweep_dir: Path, query_scheduler: bool = True) -> str:
    """Rewrite <sweep_dir>/summary.txt (point, overrides, state, step, requeues, final loss)."""
    table = sweep_table(sweep_dir, query_scheduler=query_scheduler)
    path = Path(sweep_dir) / "summary.txt"
    tmp = path.with_name(f".summary.{os.getpid()}.tmp")
    tmp.write_text(table + "\n")
    os.replace(tmp, path)
    return table
