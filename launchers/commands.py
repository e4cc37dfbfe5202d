"""`audiollm train | status | cancel`: what the CLI routes to.

    train(overrides, multirun=False) -> exit code
        compose -> validate (every point of a sweep, before anything is submitted)
        -> plan -> run directory written -> submit. launcher=local blocks and streams
        rank 0's output; launcher=slurm returns once the job is queued (unless
        launcher.wait=true). launcher.dry_run=true prints and submits nothing.
    status(path) -> exit code      a run directory or a sweep directory
    cancel(path) -> exit code      the run's (or every sweep point's) job
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from launchers import rundir as rd
from launchers.summary import format_run, run_state, write_sweep_summary

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


@dataclass
class PreparedRun:
    overrides: list[str]
    cfg: Any  # DictConfig
    container: dict
    plan: dict
    run_dir: Path
    resumes: bool = False
    # How the layout differs from the latest checkpoint's (checkpoint_dirs.layout_change).
    continuation: str | None = None

    @property
    def launcher(self) -> dict:
        return self.container["launcher"]

    @property
    def job_name(self) -> str:
        return f"audiollm-{self.run_dir.name}"


def _compose(overrides: Sequence[str]):
    from orchestrator.compose import compose

    return compose(list(overrides))


def prepare(overrides: Sequence[str], run_dir: Path | None = None) -> tuple[PreparedRun | None, list[str]]:
    """Compose, validate and plan one run; (None, errors) when it is not valid."""
    from omegaconf import OmegaConf

    from orchestrator.compose import ComposeError
    from orchestrator.resolve import resolve, to_object
    from orchestrator.validate import ERROR, validate

    try:
        cfg = _compose(overrides)
    except ComposeError as exc:
        return None, [str(exc)]
    # A dry run shows what would run (like `audiollm plan`); a real launch is checked for training.
    purpose = "plan" if cfg.launcher.dry_run else "train"
    findings = validate(to_object(cfg), purpose)
    errors = [str(f) for f in findings if f.severity == ERROR]
    if errors:
        return None, errors
    for warning in (str(f) for f in findings if f.severity != ERROR):
        print(warning, file=sys.stderr)
    plan = resolve(cfg, purpose).to_dict()
    container = OmegaConf.to_container(cfg, resolve=True)
    run_dir = Path(run_dir or rd.run_dir_for(container)).absolute()
    try:
        resumes = rd.check_resume(run_dir, container["run"]["resume"])
    except rd.RunDirError as exc:
        return None, [str(exc)]
    continuation, problems = continuation_of(run_dir, plan) if resumes else (None, [])
    if problems:
        return None, problems
    return PreparedRun(list(overrides), cfg, container, plan, run_dir, resumes, continuation), []


def continuation_of(run_dir: Path, plan: dict) -> tuple[str | None, list[str]]:
    """How this plan continues the run directory's latest checkpoint at another parallel
    layout (None: the same layout, or a checkpoint that did not record its own), and why
    it cannot, each naming the checkpoint."""
    from orchestrator.checkpoint_dirs import layout_change, saved_layout

    name, saved = saved_layout(run_dir)
    if saved is None:
        return None, []
    line, problems = layout_change(saved, plan)
    return (f"{name} {line}" if line else None), [f"{run_dir / 'checkpoints' / name}: {p}" for p in problems]


def _config_yaml(run: PreparedRun) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(run.cfg, resolve=True)


def _launch_index(run_dir: Path) -> int:
    return len((rd.read_json(run_dir / "launch.json", default={}) or {}).get("launches") or [])


def _job(launcher: dict):
    from launchers.job import RankJob

    return RankJob(launcher["entry"], launcher["accelerator"], int(launcher["max_requeues"]))


def dry_run_text(run: PreparedRun, array_size: int | None = None) -> str:
    from launchers.executors import render_sbatch

    launcher = run.launcher
    parts = [
        f"# dry run: nothing written, nothing submitted\n# run directory: {run.run_dir}"
        + (f"\n# {run.continuation}" if run.continuation else ""),
        "# composed config (config.yaml)\n" + _config_yaml(run),
        # The plan's copy of the config is left out: it is printed just above.
        "# plan (plan.json)\n" + json.dumps({k: v for k, v in run.plan.items() if k != "config"}, indent=2, default=str),
        "# argv\n" + " ".join(str(a) for a in run.plan.get("argv") or []),
    ]
    if launcher["kind"] == "slurm":
        parts.append("# sbatch script\n" + render_sbatch(
            launcher, run.run_dir / "submitit", run.job_name, array_size=array_size))
    else:
        from launchers.executors import world_size

        parts.append(f"# local: {world_size(launcher)} processes on this machine "
                     f"({'gloo' if launcher['accelerator'] == 'cpu' else 'nccl'}), entry {launcher['entry']}")
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- single runs


ACTIVE_STATES = ("PENDING", "RUNNING", "SUBMITTED")


class RunActive(RuntimeError):
    """The run already has a queued or running job."""


def ensure_not_active(run_dir: Path) -> None:
    """Two jobs must never write one run directory's checkpoints."""
    if not rd.last_launch(run_dir):
        return
    info = run_state(run_dir)
    if info["state"] in ACTIVE_STATES and info["scheduler"] not in (None, "ENDED", "COMPLETED"):
        raise RunActive(
            f"run {run_dir} already has job {info['job_id']} ({info['state']}); "
            f"follow it with `audiollm status {run_dir}` or stop it with `audiollm cancel {run_dir}` first"
        )


def submit_run(run: PreparedRun):
    """Write the run directory, submit, record the launch. Returns the submitit job."""
    from launchers.executors import make_executor

    with rd.submission_lock(run.run_dir):  # check -> submit -> record, one command at a time
        ensure_not_active(run.run_dir)
        rd.prepare(run.run_dir, _config_yaml(run), run.plan)
        index = _launch_index(run.run_dir)
        executor = make_executor(run.launcher, run.run_dir / "submitit", run.job_name)
        with own_session(run.launcher["kind"] == "local"):
            job = executor.submit(_job(run.launcher), str(run.run_dir), index)
        rd.record_launch(run.run_dir, {
            "kind": run.launcher["kind"], "job_ids": [str(job.job_id)], "launch_index": index,
            "submitit_folder": str(run.run_dir / "submitit"), "overrides": run.overrides, "resumed": run.resumes,
        })
    return job


def _follow_hint(path: Path, sweep: bool = False) -> str:
    logs = f"{path}/<point>/logs/rank0.log" if sweep else f"{path}/logs/rank0.log"
    return (f"  follow:  audiollm status {path}\n"
            f"  logs:    tail -f {logs}\n"
            f"  cancel:  audiollm cancel {path}")


# submitit's own start/finish notices ("submitit INFO (<time>) - Starting with
# JobEnvironment(...)"): they stay in its log files, not on the console.
_SUBMITIT_NOTICE = "submitit INFO ("


def _stream_local(job, timeout_s: float | None = None, run_dir: Path | None = None) -> int:
    """Print rank 0's stdout/stderr while the local job runs (whole lines, without
    submitit's own notices); Ctrl-C stops it gracefully."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(job.paths.folder, job_id=job.job_id, task_id=0)
    offsets = {paths.stdout: 0, paths.stderr: 0}
    partial = {paths.stdout: "", paths.stderr: ""}  # a line not yet ended
    deadline = None if timeout_s is None else time.time() + timeout_s

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

    # The job runs in its own session (own_session): a terminal's Ctrl-C, and the hang-up
    # when the terminal closes, reach this process only. The first Ctrl-C, SIGTERM or
    # SIGHUP asks the job to checkpoint at its next step boundary and stop (a rerun of the
    # same command resumes there); a second Ctrl-C stops it at once.
    stop = _StopRequests()
    with stop.handling():
        while not job.done():
            pump()
            if deadline is not None and time.time() > deadline:
                job.cancel()
                print(f"local job {job.job_id} exceeded {timeout_s} s; cancelled", file=sys.stderr)
                return EXIT_FAILED
            if stop.count == 1 and not stop.asked:
                stop.asked = True
                print(f"\n{stop.name}: asking the job to checkpoint at its next step and stop (Ctrl-C again stops "
                      f"it at once, losing the steps since its last checkpoint) ...", file=sys.stderr, flush=True)
                _signal_local(str(job.job_id), signal.SIGTERM)
            elif stop.count > 1:
                _kill_local(str(job.job_id))
                pump(final=True)
                print(f"stopped at once: the steps since the last checkpoint are lost; the same command resumes "
                      f"from {_latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
                return stop.exit_code
            time.sleep(0.2)
    pump(final=True)
    if stop.count:
        print(f"stopped; the same command resumes from {_latest_checkpoint(run_dir) or 'the start'}", file=sys.stderr)
        return stop.exit_code
    try:
        job.results()
    except Exception as exc:  # noqa: BLE001 - submitit re-raises the task's failure
        print(f"job failed: {_failure_line(job, run_dir, exc)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _failure_line(job, run_dir: Path | None, exc: BaseException) -> str:
    """The cause in one line (launchers/failures.py), else the last line of submitit's
    report."""
    from launchers import failures
    from launchers.local_controller import exit_codes_path

    cause = None
    if run_dir is not None:
        codes = (rd.read_json(exit_codes_path(job.paths.folder, str(job.job_id))) or {}).get("exit_codes")
        if codes is None and job.paths.stderr.is_file():  # SLURM: srun's own report of its tasks
            world = int((rd.read_json(Path(run_dir) / "plan.json") or {}).get("world_size") or 0)
            codes = failures.srun_exit_codes(job.paths.stderr.read_text(errors="replace"), world)
        cause = failures.explain(run_dir, str(job.job_id), codes)
    last = str(exc).strip().splitlines()
    return cause or (last[-1] if last else repr(exc))


def _wait_slurm(jobs, run_dirs: Sequence[Path]) -> int:
    failed = 0
    for job, run_dir in zip(jobs, run_dirs):
        try:
            job.results()
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"job {job.job_id} failed: {_failure_line(job, run_dir, exc)}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


class DemoCorpusError(RuntimeError):
    """Writing the demo corpus failed (its own message is already on stderr)."""


def ensure_demo_corpus(runs: Sequence[PreparedRun]) -> None:
    """data.demo_corpus: write the espeak-ng demo corpus into that directory first unless
    it holds one already (manifest.json, written last). A subprocess, so that this side
    never imports torch."""
    wanted = {}
    for run in runs:
        data = run.container["data"]
        if data.get("demo_corpus"):
            wanted[str(data["demo_corpus"])] = (int(data["demo_corpus_samples"]), data.get("demo_corpus_accent"))
    for root, (samples, accent) in wanted.items():
        manifest = Path(root) / "manifest.json"
        if manifest.is_file():
            _check_demo_corpus(root, json.loads(manifest.read_text()), samples, accent)
            continue
        print(f"data.demo_corpus={root} holds no corpus yet: synthesizing {samples} training utterances "
              f"with espeak-ng first", flush=True)
        proc = subprocess.run([sys.executable, "-m", "orchestrator.data.cli", "demo", root,
                               "--num-samples", str(samples), "--no-progress",
                               *(["--accent", str(accent)] if accent else [])])
        if proc.returncode != 0:
            raise DemoCorpusError(f"writing the demo corpus into {root} failed (exit {proc.returncode}); fix what "
                                  f"it printed above, or point data.demo_corpus (or $AUDIOLLM_DEMO_DATA) elsewhere")


def _check_demo_corpus(root: str, manifest: dict, samples: int, accent: Optional[str]) -> None:
    """The corpus already in data.demo_corpus is the one the config asks for: its format,
    number of training utterances and accent (a silent reuse would train on another corpus)."""
    from orchestrator.data.demo import CORPUS_FORMAT, CORPUS_FORMAT_CHANGE

    again = (f"delete {root} to have it written again, or point data.demo_corpus (or $AUDIOLLM_DEMO_DATA) "
             f"elsewhere")
    found = manifest.get("format", 1)
    if found != CORPUS_FORMAT:
        raise DemoCorpusError(f"data.demo_corpus={root} holds a demo corpus of format {found}; this version writes and "
                              f"reads format {CORPUS_FORMAT} ({CORPUS_FORMAT_CHANGE}): {again}")
    if manifest.get("num_samples") != samples:
        raise DemoCorpusError(f"data.demo_corpus={root} holds a demo corpus of {manifest.get('num_samples')} training "
                              f"utterances, but data.demo_corpus_samples={samples}: set "
                              f"data.demo_corpus_samples={manifest.get('num_samples')} to train on it, or {again}")
    if (manifest.get("accent") or None) != (accent or None):
        found_accent = manifest.get("accent") or "null"
        raise DemoCorpusError(f"data.demo_corpus={root} holds the demo corpus of accent {found_accent}, but "
                              f"data.demo_corpus_accent={accent or 'null'}: {again}")


def local_dataset_problems(runs: Sequence[PreparedRun]) -> list[str]:
    """Every local dataset path (data.train, data.validation; globs expanded) that is not an
    MDS dataset as seen from this machine, one line each; remote ones are checked by the
    job (orchestrator/data/remote.py). Runs after the demo corpus is written."""
    from orchestrator.data.sources import is_remote, resolve_entries

    problems: list[str] = []
    for run in runs:
        data = run.container["data"]
        for split in ("train", "validation"):
            for entry in data.get(split) or []:
                if is_remote(str(entry["path"])):
                    continue
                try:
                    resolve_entries([_Entry(entry)])
                except (OSError, ValueError) as exc:
                    problem = f"data.{split}[{entry['name']}]: {exc}"
                    if problem not in problems:
                        problems.append(problem)
    return problems


class _Entry:
    """A dataset entry of the composed config (a dict) as resolve_entries reads it."""

    def __init__(self, entry: dict):
        self.name, self.path, self.weight = entry["name"], entry["path"], entry.get("weight", 1.0)


def check_local_datasets(runs: Sequence[PreparedRun]) -> bool:
    """False (after saying why) when a local job could not open its datasets; a SLURM job's
    nodes may see paths this machine does not, so there it is a warning."""
    problems = local_dataset_problems(runs)
    if not problems:
        return True
    if runs[0].launcher["kind"] == "slurm":
        _print_errors(problems, header="warning: these datasets are not found from this machine (the job fails "
                                       "at start unless the compute nodes see them)")
        return True
    _print_errors(problems, header="not submitted: datasets not found")
    return False


def cluster_problems(launcher: dict) -> list[str]:
    """Why this SLURM cluster could never start the job (launchers/slurm_fit.py); [] if it
    could or nothing was checked."""
    from launchers.slurm_fit import check_request

    check = check_request(launcher)
    if check.skipped:
        print(f"cluster check skipped: {check.skipped}", file=sys.stderr)
    return check.problems or []


NEVER_STARTS = "not submitted: this cluster could never start the job (it would pend forever)"


def _print_errors(errors: Sequence[str], header: str = "invalid configuration") -> None:
    print(f"{header}:", file=sys.stderr)
    for error in errors:
        print("  - " + error.replace("\n", "\n    "), file=sys.stderr)


def train(overrides: Sequence[str], multirun: bool = False) -> int:
    """`audiollm train [-m] OVERRIDES...`; returns the process exit code."""
    if multirun:
        return train_sweep(overrides)
    run, errors = prepare(overrides)
    if run is None:
        _print_errors(errors)
        return EXIT_INVALID
    launcher = run.launcher
    problems = cluster_problems(launcher)
    if launcher["dry_run"]:
        print(dry_run_text(run), end="")
        if problems:
            _print_errors(problems, header="this cluster could never start the job")
        return EXIT_OK
    if problems:
        _print_errors(problems, header=NEVER_STARTS)
        return EXIT_INVALID
    try:
        ensure_demo_corpus([run])
        if not check_local_datasets([run]):
            return EXIT_INVALID
        job = submit_run(run)
    except (RunActive, rd.RunBusy, DemoCorpusError) as exc:
        _print_errors([str(exc)], header="not submitted")
        return EXIT_INVALID
    except OSError as exc:  # run.output_root read-only, on a full disk, under a file, ...
        _print_errors([f"cannot write the run directory {run.run_dir}: {exc}; set run.output_root to a writable "
                       f"directory"], header="not submitted")
        return EXIT_INVALID
    verb = "resuming" if run.resumes else "starting"
    if run.continuation:
        print(run.continuation)
    if launcher["kind"] == "slurm":
        print(f"{verb} run {run.run_dir}\nsubmitted SLURM job {job.job_id} "
              f"({launcher['nodes']} node(s) x {launcher['gpus_per_node']} tasks)\n{_follow_hint(run.run_dir)}")
        return _wait_slurm([job], [run.run_dir]) if launcher.get("wait") else EXIT_OK
    print(f"{verb} run {run.run_dir} ({launcher['nodes'] * launcher['gpus_per_node']} local processes, "
          f"job {job.job_id})", flush=True)
    if launcher.get("wait") is False:
        print(_follow_hint(run.run_dir))
        return EXIT_OK
    return _stream_local(job, run_dir=run.run_dir)


def prepare_only(overrides: Sequence[str]) -> int:
    """`audiollm prepare OVERRIDES...`: validate, resolve and write the run directory, and
    print how to start it by hand (inside a SLURM allocation, or with torchrun); nothing
    is submitted. The job then runs on whatever starts it, with the same entry."""
    run, errors = prepare(overrides)
    if run is None:
        _print_errors(errors)
        return EXIT_INVALID
    try:
        ensure_not_active(run.run_dir)
        ensure_demo_corpus([run])
    except (RunActive, DemoCorpusError) as exc:
        _print_errors([str(exc)], header="not prepared")
        return EXIT_INVALID
    rd.prepare(run.run_dir, _config_yaml(run), run.plan)
    nodes, per_node = int(run.launcher["nodes"]), int(run.launcher["gpus_per_node"])
    entry = f"-m orchestrator.train.entry {run.run_dir}"
    print(f"prepared run {run.run_dir} for {nodes} node(s) x {per_node} processes; start it with one of\n"
          f"  inside a SLURM allocation (salloc -N{nodes} --ntasks-per-node={per_node} ...):\n"
          f"    srun --nodes={nodes} --ntasks-per-node={per_node} {sys.executable} {entry}\n"
          f"  torchrun, once on every node (HOST: the first node):\n"
          f"    {Path(sys.executable).parent / 'torchrun'} --nnodes={nodes} --nproc-per-node={per_node} "
          f"--rdzv-backend=c10d --rdzv-endpoint=HOST:29500 {entry}")
    return EXIT_OK


def prepare_main(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: audiollm prepare [OVERRIDES...]\n\nValidate and resolve like `audiollm train`, write the run "
              "directory, and print the srun and torchrun commands that start it; submits nothing.")
        return EXIT_OK
    return prepare_only(list(argv))


# ---------------------------------------------------------------------------- sweeps


def _sweep_dir(points: list[PreparedRun], overrides: Sequence[str]) -> Path:
    first = points[0].container
    name = first["run"].get("name")
    if not name:
        digest = hashlib.sha256("\n".join(rd.config_identity(p.container) for p in points).encode()).hexdigest()
        name = f"sweep-{first.get('recipe') or 'run'}-{digest[:8]}"
    return (Path(first["run"]["output_root"]) / str(first["run"]["experiment"]) / str(name)).absolute()


def prepare_sweep(overrides: Sequence[str]) -> tuple[Path | None, list[tuple[list[str], PreparedRun]], list[str]]:
    """Expand, compose, validate and plan every point; all errors of all points together."""
    from launchers.sweep import SweepError, expand, swept_keys

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
    """One SLURM job array per distinct launcher section (usually one); local: sequential."""
    from launchers.executors import make_executor

    rd.write_json(sweep_dir / "sweep.json", {
        "points": [{"dir": run.run_dir.name, "swept": swept, "overrides": run.overrides} for swept, run in points],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
    })
    for _, run in points:
        rd.prepare(run.run_dir, _config_yaml(run), run.plan)
    groups: dict[str, list[PreparedRun]] = {}
    for _, run in points:
        groups.setdefault(json.dumps(run.launcher, sort_keys=True), []).append(run)
    jobs = []
    for runs in groups.values():
        launcher = runs[0].launcher
        indices = [_launch_index(run.run_dir) for run in runs]
        executor = make_executor(launcher, sweep_dir / "submitit", f"audiollm-{sweep_dir.name}")
        group_jobs = executor.map_array(_job(launcher), [str(r.run_dir) for r in runs], indices)
        for run, index, job in zip(runs, indices, group_jobs):
            rd.record_launch(run.run_dir, {
                "kind": launcher["kind"], "job_ids": [str(job.job_id)], "launch_index": index,
                "submitit_folder": str(sweep_dir / "submitit"), "overrides": run.overrides,
                "resumed": run.resumes, "sweep": str(sweep_dir),
            })
        jobs += group_jobs
    write_sweep_summary(sweep_dir, query_scheduler=False)
    return jobs


def train_sweep(overrides: Sequence[str]) -> int:
    sweep_dir, points, errors = prepare_sweep(overrides)
    if errors:
        _print_errors(errors, header="invalid sweep; nothing was submitted")
        return EXIT_INVALID
    launcher = points[0][1].launcher
    problems = []
    for launcher_json in sorted({json.dumps(run.launcher, sort_keys=True) for _, run in points}):
        problems += [p for p in cluster_problems(json.loads(launcher_json)) if p not in problems]
    if problems and not launcher["dry_run"]:
        _print_errors(problems, header="sweep " + NEVER_STARTS)
        return EXIT_INVALID
    if launcher["dry_run"]:
        print(f"# sweep of {len(points)} points in {sweep_dir}")
        for swept, run in points:
            print(f"#   {run.run_dir.name}: {' '.join(swept)}")
        print(dry_run_text(points[0][1], array_size=len(points)), end="")
        if problems:
            _print_errors(problems, header="this cluster could never start the sweep's jobs")
        return EXIT_OK
    try:
        for _, run in points:
            ensure_not_active(run.run_dir)
        ensure_demo_corpus([run for _, run in points])
    except (RunActive, DemoCorpusError) as exc:
        _print_errors([str(exc)], header="sweep not submitted")
        return EXIT_INVALID
    if not check_local_datasets([run for _, run in points]):
        return EXIT_INVALID
    if launcher["kind"] == "slurm":
        jobs = submit_sweep(sweep_dir, points)
        print(f"sweep {sweep_dir}: {len(points)} points\nsubmitted SLURM job array "
              f"{jobs[0].job_id.split('_')[0]}\n{_follow_hint(sweep_dir, sweep=True)}")
        return _wait_slurm(jobs, [run.run_dir for _, run in points]) if launcher.get("wait") else EXIT_OK
    # local: one point after another (they share this machine's cores)
    rd.write_json(sweep_dir / "sweep.json", {
        "points": [{"dir": run.run_dir.name, "swept": swept, "overrides": run.overrides} for swept, run in points],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
    })
    code = EXIT_OK
    for swept, run in points:
        print(f"=== point {run.run_dir.name}: {' '.join(swept)}", flush=True)
        job = submit_run(run)
        point_code = _stream_local(job, run_dir=run.run_dir)
        code = max(code, point_code)
        if point_code >= 128:  # stopped by Ctrl-C / SIGTERM / SIGHUP: the later points are not started
            break
    print(write_sweep_summary(sweep_dir))
    return code


# ---------------------------------------------------------------------------- status, cancel


def status(path: str | os.PathLike) -> int:
    path = Path(path)
    if (path / "sweep.json").exists():
        print(write_sweep_summary(path))
        return EXIT_OK
    if rd.is_run_dir(path):
        print(format_run(path, run_state(path)))
        return EXIT_OK
    print(f"{path} is neither a run directory (no plan.json) nor a sweep directory (no sweep.json)", file=sys.stderr)
    return EXIT_INVALID


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
def own_session(enabled: bool = True):
    """submitit's local executor starts its controller (which starts the ranks) with a
    plain Popen, in this command's process group: a terminal's Ctrl-C, sent to the whole
    foreground group, would kill every rank mid-step and lose the steps since the last
    checkpoint. Within this block, processes start in a session of their own; this
    command forwards the stop request itself (_stream_local). The controller is
    launchers.local_controller, which records how each task ended."""
    if not enabled:
        yield
        return
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


def _kill_local(job_id: str) -> None:
    """Every process of a local job at once: its controller started a session of its own."""
    try:
        os.killpg(os.getpgid(int(job_id)), signal.SIGKILL)
    except (ValueError, ProcessLookupError, PermissionError):
        pass


def _latest_checkpoint(run_dir: Path | None) -> str | None:
    latest = Path(run_dir) / "checkpoints" / "latest" if run_dir is not None else None
    return f"checkpoints/{latest.read_text().strip()}" if latest is not None and latest.is_file() else None


def _signal_local(job_id: str, sig: int) -> bool:
    try:
        os.kill(int(job_id), sig)  # the local controller forwards it to every task
    except (ValueError, ProcessLookupError, PermissionError):
        return False
    return True


def cancel(path: str | os.PathLike) -> int:
    path = Path(path)
    run_dirs = list(rd.point_dirs(path)) if (path / "sweep.json").exists() else [path]
    if not all(rd.is_run_dir(d) for d in run_dirs):
        print(f"{path} is neither a run directory nor a sweep directory", file=sys.stderr)
        return EXIT_INVALID
    code = EXIT_OK
    for run_dir in run_dirs:
        launch = rd.last_launch(run_dir)
        if not launch:
            print(f"{run_dir}: never submitted")
            continue
        for job_id in launch["job_ids"]:
            if launch["kind"] == "slurm":
                done = subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=60)
                ok = done.returncode == 0
                detail = done.stderr.strip()
            else:
                ok = _signal_local(str(job_id), signal.SIGTERM)
                detail = "process not running"
            print(f"{run_dir}: {'cancelled' if ok else 'could not cancel'} job {job_id}"
                  + ("" if ok else f" ({detail})"))
            code = code if ok else EXIT_FAILED
    return code


# ---------------------------------------------------------------------------- argv entry points (cli.py)


def train_main(argv: Sequence[str]) -> int:
    """`audiollm train [-m|--multirun] OVERRIDES...`"""
    import argparse

    parser = argparse.ArgumentParser(
        prog="audiollm train",
        description="Compose, validate, resolve and launch a run; with -m, one run per point of a sweep. "
        "launcher=local (default recipe) runs here and streams rank 0; launcher=slurm returns once queued. "
        "launcher.dry_run=true prints the config, plan, argv and sbatch script and submits nothing.",
    )
    parser.add_argument("-m", "--multirun", action="store_true", help="sweep: a=1,2 b=x,y runs every combination")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +recipe=tiny_cpu optim.lr=1e-3")
    args = parser.parse_args(list(argv))
    return train(args.overrides, multirun=args.multirun)


def _path_main(argv: Sequence[str], prog: str, text: str, fn) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=text)
    parser.add_argument("path", help="a run directory (outputs/<experiment>/<run>) or a sweep directory")
    return fn(parser.parse_args(list(argv)).path)


def status_main(argv: Sequence[str]) -> int:
    return _path_main(argv, "audiollm status", "State, last step and last loss of a run, or a sweep's table.", status)


def cancel_main(argv: Sequence[str]) -> int:
    return _path_main(argv, "audiollm cancel", "Cancel the job of a run, or every job of a sweep.", cancel)
