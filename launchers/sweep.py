"""`audiollm train -m OVERRIDES...`: a sweep, one run per point.

Expansion: orchestrator/plan/sweep.py (Hydra's grammar, as `audiollm plan -m`). Every point is
validated before anything is submitted; through a queueing launcher (SLURM) the points are
one job array per distinct launcher section, on this machine (local) they run one after
another.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from launchers.checks import DemoCorpusError, NEVER_STARTS, cluster_problems, ensure_demo_corpus
from launchers.follow import follow_hint
from launchers.kinds import launcher_for
from launchers.runs import (
    EXIT_INVALID,
    EXIT_OK,
    PreparedRun,
    config_yaml,
    dry_run_text,
    launch_index,
    prepare,
    print_errors,
    rank_job,
)
from launchers.submit import RunActive, ensure_not_active, submit_run
from launchers.summary import write_sweep_summary
from orchestrator.plan import rundir as rd
from orchestrator.plan.sweep import SweepError, expand, swept_keys


def _sweep_dir(points: list[PreparedRun], overrides: Sequence[str]) -> Path:
    first = points[0].container
    name = first["run"].get("name")
    if not name:
        digest = hashlib.sha256("\n".join(rd.config_identity(p.container) for p in points).encode()).hexdigest()
        name = f"sweep-{first.get('recipe') or 'run'}-{digest[:8]}"
    return (Path(first["run"]["output_root"]) / str(first["run"]["experiment"]) / str(name)).absolute()


def prepare_sweep(overrides: Sequence[str]) -> tuple[Path | None, list[tuple[list[str], PreparedRun]], list[str]]:
    """Expand, compose, validate and plan every point; all errors of all points together."""

    try:
        point_overrides = expand(overrides)
        keys = swept_keys(overrides)
    except SweepError as exc:
        return None, [], [str(exc)]
    composed: list[tuple[list[str], list[str], Any]] = []
    errors: list[str] = []
    for i, point in enumerate(point_overrides):
        swept = [o for o in point if o.split("=", 1)[0] in keys]
        run, point_errors = prepare(point, run_dir=Path(f"/nonexistent-point-{i}"))
        errors += [f"point {i} ({' '.join(swept)}): {e}" for e in point_errors]
        composed.append((point, swept, run))
    if errors:
        return None, [], errors
    sweep_dir = _sweep_dir([c[2] for c in composed], overrides)
    points = []
    for i, (point, swept, run) in enumerate(composed):
        run.run_dir = sweep_dir / f"{i:03d}"
        try:
            run.resumes = rd.check_resume(run.run_dir, run.container["run"]["resume"])
        except rd.RunDirError as exc:
            errors.append(f"point {i} ({' '.join(swept)}): {exc}")
        points.append((swept, run))
    return (None, [], errors) if errors else (sweep_dir, points, [])


def submit_sweep(sweep_dir: Path, points: list[tuple[list[str], PreparedRun]]) -> list:
    """A queueing launcher's sweep: one job array per distinct launcher section (usually one)."""

    rd.write_json(sweep_dir / "sweep.json", {
        "points": [{"dir": run.run_dir.name, "swept": swept, "overrides": run.overrides} for swept, run in points],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
    })
    for _, run in points:
        rd.prepare(run.run_dir, config_yaml(run), run.plan)
    groups: dict[str, list[PreparedRun]] = {}
    for _, run in points:
        groups.setdefault(json.dumps(run.launcher, sort_keys=True), []).append(run)
    jobs = []
    for runs in groups.values():
        launcher = runs[0].launcher
        indices = [launch_index(run.run_dir) for run in runs]
        kind = launcher_for(launcher["kind"])
        executor = kind.executor(launcher, sweep_dir / "submitit", f"audiollm-{sweep_dir.name}")
        with kind.submitting():
            group_jobs = executor.map_array(rank_job(launcher), [str(r.run_dir) for r in runs], indices)
        for run, index, job in zip(runs, indices, group_jobs):
            rd.record_launch(run.run_dir, {
                "kind": launcher["kind"], "job_ids": [str(job.job_id)], "launch_index": index,
                "submitit_folder": str(sweep_dir / "submitit"), "overrides": run.overrides,
                "resumed": run.resumes, "sweep": str(sweep_dir), "source": run.source,
            })
        jobs += group_jobs
    write_sweep_summary(sweep_dir, query_scheduler=False)
    return jobs


def train_sweep(overrides: Sequence[str]) -> int:
    sweep_dir, points, errors = prepare_sweep(overrides)
    if errors:
        print_errors(errors, header="invalid sweep; nothing was submitted")
        return EXIT_INVALID
    launcher = points[0][1].launcher
    problems = []
    for launcher_json in sorted({json.dumps(run.launcher, sort_keys=True) for _, run in points}):
        problems += [p for p in cluster_problems(json.loads(launcher_json)) if p not in problems]
    if problems and not launcher["dry_run"]:
        print_errors(problems, header="sweep " + NEVER_STARTS)
        return EXIT_INVALID
    if launcher["dry_run"]:
        print(f"# sweep of {len(points)} points in {sweep_dir}")
        for swept, run in points:
            print(f"#   {run.run_dir.name}: {' '.join(swept)}")
        print(dry_run_text(points[0][1], array_size=len(points)), end="")
        if problems:
            print_errors(problems, header="this cluster could never start the sweep's jobs")
        return EXIT_OK
    try:
        for _, run in points:
            ensure_not_active(run.run_dir)
        ensure_demo_corpus([run for _, run in points])
    except (RunActive, DemoCorpusError) as exc:
        print_errors([str(exc)], header="sweep not submitted")
        return EXIT_INVALID
    kind = launcher_for(launcher["kind"])
    if kind.queues:
        jobs = submit_sweep(sweep_dir, points)
        arrays = ", ".join(dict.fromkeys(str(job.job_id).split("_")[0] for job in jobs))
        print(f"sweep {sweep_dir}: {len(points)} points\nsubmitted job(s) {arrays}\n"
              f"{follow_hint(sweep_dir, sweep=True)}")
        return kind.wait(jobs, [run.run_dir for _, run in points]) if kind.waits(launcher) else EXIT_OK
    # On this machine: one point after another (they share its cores)
    rd.write_json(sweep_dir / "sweep.json", {
        "points": [{"dir": run.run_dir.name, "swept": swept, "overrides": run.overrides} for swept, run in points],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
    })
    code = EXIT_OK
    for swept, run in points:
        print(f"=== point {run.run_dir.name}: {' '.join(swept)}", flush=True)
        job = submit_run(run)
        point_code = kind.wait([job], [run.run_dir])
        code = max(code, point_code)
        if point_code >= 128:  # stopped by Ctrl-C / SIGTERM / SIGHUP: the later points are not started
            break
    print(write_sweep_summary(sweep_dir))
    return code
