"""`audiollm eval RUN [--all] [--tp N --pp N --cp N --gpus N] launcher=slurm [launcher.X=Y ...]`:
the evaluation as a job, through the launcher that trains (submitit, locally or on SLURM).

Without a launcher override `audiollm eval` runs where it is typed, as before
(orchestrator/eval/evaluate.py: one process, or torchrun on this machine's GPUs). With
one, it becomes a job of its own, in RUN/eval/job/ (its launch.json, state.json, logs/
and submitit/ folder; its results in RUN/eval/ as an evaluation run here writes them):

* where: the training run's config composed again from its own recorded overrides (and
  its --config-dir folders) with this command's launcher overrides after them, so the
  job runs where the training ran (its partition, account, setup lines) unless told
  otherwise;
* how big: the processes the evaluation asks for (--gpus, else tp x pp x cp; one
  without a layout): on SLURM one node when they fit the run's launcher.gpus_per_node,
  else whole nodes of it; locally all on this machine. launcher.nodes and
  launcher.gpus_per_node are not settings here;
* the same checks and controls as training: the cluster check before submission (a job
  the cluster could never start is refused, naming why), one job at a time per run
  (`audiollm status RUN/eval/job`, `audiollm cancel RUN/eval/job`), and preemption: the
  job stops between two checkpoints and requeues, and the next attempt (`--all`) scores
  only the checkpoints without a result.

Imports neither torch nor megatron: the job's ranks import them (launchers/job.py runs
orchestrator.eval.evaluate.job_entry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from launchers.checks import dry_run_or_refusal
from launchers.follow import follow_hint
from launchers.kinds import launcher_for, size_text
from launchers.runs import EXIT_INVALID, EXIT_OK, print_errors
from launchers.submit import RunActive, submit_job
from orchestrator.eval.arguments import eval_parser, layout_of, split_launcher_overrides
from orchestrator.plan import config_path
from orchestrator.plan.checkpoint_dirs import frozen_source_problem, step_dirs
from orchestrator.plan import rundir as rd

EVAL_ENTRY = "orchestrator.eval.evaluate.job_entry"
SIZE_KEYS = ("launcher.nodes", "launcher.gpus_per_node")


def eval_job_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "eval" / "job"


def eval_main(argv: Sequence[str]) -> int:
    """`audiollm eval ...`: here, or as a job when a launcher override is given."""
    own, overrides = split_launcher_overrides(argv)
    if not overrides:
        from orchestrator.eval.evaluate import main

        return main(own)
    return submit_eval(own, overrides)


def submit_eval(argv: Sequence[str], overrides: Sequence[str]) -> int:
    args = eval_parser().parse_args(list(argv))
    run_dir = Path(args.run_dir).absolute()
    if not (run_dir / "plan.json").is_file():
        print_errors([f"{run_dir} is not a run directory (no plan.json): pass the directory `audiollm train` "
                      f"printed"], header="not submitted")
        return EXIT_INVALID
    layout, processes, problem = layout_of(args)
    sized = [o for o in overrides if o.lstrip("+~").split("=")[0] in SIZE_KEYS]
    if problem or sized:
        print_errors([problem] if problem else [
            f"{' '.join(sized)}: an evaluation job's size comes from --tp/--pp/--cp/--gpus ({processes} process(es) "
            f"here); drop the override and pass --gpus N for N processes"], header="not submitted")
        return EXIT_INVALID
    launcher, errors = eval_launcher(run_dir, overrides, processes)
    newest = step_dirs(run_dir)[:1]  # a run's checkpoints all leave frozen weights in the same place
    errors += [problem for problem in map(frozen_source_problem, newest) if problem]
    if errors:
        print_errors(errors, header="not submitted")
        return EXIT_INVALID
    verdict = dry_run_or_refusal(launcher, f"# dry run: nothing submitted\n# evaluation job of {run_dir}: "
                                           f"{size_text(launcher)}, launcher={launcher['kind']}\n")
    if verdict is not None:
        return verdict
    job_dir = eval_job_dir(run_dir)
    try:
        job = _submit(job_dir, launcher, _job_argv(args, run_dir), overrides, run_dir.name)
    except (RunActive, rd.RunBusy) as exc:
        print_errors([str(exc)], header="not submitted")
        return EXIT_INVALID
    kind = launcher_for(launcher["kind"])
    print(f"evaluating {run_dir}\n{kind.submitted(job, launcher)}; results in {run_dir / 'eval'}", flush=True)
    if not kind.waits(launcher):
        print(follow_hint(job_dir))
        return EXIT_OK
    return kind.wait([job], [job_dir])


def eval_launcher(run_dir: Path, overrides: Sequence[str], processes: int) -> tuple[dict | None, list[str]]:
    """The job's launcher section: the run's config composed again with `overrides` after
    its own, sized for `processes`; or (None, why not)."""
    from omegaconf import OmegaConf

    from orchestrator.plan.compose import ComposeError, compose

    launch = rd.last_launch(run_dir) or {}
    recorded = list(launch.get("overrides") or [])
    dirs = [entry["dir"] for entry in (launch.get("source") or {}).get("config_path") or []
            if entry.get("from") == "--config-dir"]
    try:
        with config_path.command_line_dirs(dirs):
            cfg = compose([*recorded, *overrides])
    except ComposeError as exc:
        return None, [f"the run's launcher settings with {' '.join(overrides)}: {exc}"]
    launcher = OmegaConf.to_container(cfg.launcher, resolve=True)
    try:
        kind = launcher_for(launcher["kind"])
    except ValueError as exc:
        return None, [str(exc)]
    per_node = int(launcher["gpus_per_node"])
    if processes <= per_node or kind.one_machine:  # one machine runs them all
        launcher.update(nodes=1, gpus_per_node=processes)
    elif processes % per_node:
        return None, [f"{processes} evaluation processes do not fill whole nodes of launcher.gpus_per_node="
                      f"{per_node}: pass --gpus as a multiple of {per_node}, or at most {per_node}"]
    else:
        launcher["nodes"] = processes // per_node
    return launcher, []


def _job_argv(args, run_dir: Path) -> list[str]:
    """The evaluation's own arguments, for the job's ranks (the run directory absolute:
    the job may start elsewhere)."""
    argv = [str(run_dir)]
    for flag, value in (("--checkpoint", args.checkpoint and str(Path(args.checkpoint).absolute())),
                        ("--tp", args.tp), ("--pp", args.pp), ("--cp", args.cp), ("--gpus", args.gpus),
                        ("--ctc-weight", args.ctc_weight), ("--examples", args.examples or None),
                        ("--best-by", args.best_by)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--all"] if args.all else [])


def _submit(job_dir: Path, launcher: dict, argv: list[str], overrides: Sequence[str], name: str):
    from launchers.job import RankJob

    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    task = RankJob(EVAL_ENTRY, launcher["accelerator"], int(launcher["max_requeues"]))
    return submit_job(job_dir, launcher, task, f"audiollm-eval-{name}",
                      write=lambda: rd.write_json(job_dir / "eval_job.json", {"argv": argv, "launcher": launcher}),
                      record={"overrides": list(overrides), "resumed": False, "evaluates": argv})
