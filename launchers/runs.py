"""One run, prepared: compose -> validate -> plan -> the run directory it will use.

What every command that starts a run shares (train, prepare, a sweep's points): the
PreparedRun, its dry-run text, and how errors are printed. Nothing is written or
submitted here.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from orchestrator.plan import rundir as rd


EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


@dataclass
class PreparedRun:
    overrides: list[str]
    cfg: Any  # DictConfig
    container: dict
    plan: dict
    run_dir: Path
    resumes: bool = False
    # How the layout differs from the latest checkpoint's (rules/topology.layout_change).
    continuation: str | None = None
    # The recipe's file and the search path it was found on (compose.source).
    source: dict | None = None

    @property
    def launcher(self) -> dict:
        return self.container["launcher"]

    @property
    def job_name(self) -> str:
        return f"audiollm-{self.run_dir.name}"


def _compose(overrides: Sequence[str]):
    from orchestrator.plan.compose import compose

    return compose(list(overrides))


def prepare(overrides: Sequence[str], run_dir: Path | None = None) -> tuple[PreparedRun | None, list[str]]:
    """Compose, validate and plan one run; (None, errors) when it is not valid."""
    from omegaconf import OmegaConf

    from orchestrator.plan.compose import ComposeError, source
    from orchestrator.plan.resolve import resolve, to_object
    from orchestrator.plan.rules.findings import ERROR, ConfigInvalid
    from orchestrator.plan.validate import validate

    try:
        cfg = _compose(overrides)
    except ComposeError as exc:
        return None, [str(exc)]
    where = source(overrides)
    # A dry run shows what would run (like `audiollm plan`); a real launch is checked for training.
    purpose = "plan" if cfg.launcher.dry_run else "train"
    findings = validate(to_object(cfg), purpose)
    errors = [str(f) for f in findings if f.severity == ERROR]
    if errors:
        return None, errors
    for warning in (str(f) for f in findings if f.severity != ERROR):
        print(warning, file=sys.stderr)
    try:
        plan = resolve(cfg, purpose).to_dict()
    except ConfigInvalid as exc:  # what only the plan's estimates find: a layout that does not fit
        return None, [str(f) for f in exc.findings if f.severity == ERROR]
    container = OmegaConf.to_container(cfg, resolve=True)
    run_dir = Path(run_dir or rd.run_dir_for(container)).absolute()
    try:
        resumes = rd.check_resume(run_dir, container["run"]["resume"])
    except rd.RunDirError as exc:
        return None, [str(exc)]
    continuation, problems = continuation_of(run_dir, plan) if resumes else (None, [])
    if problems:
        return None, problems
    return PreparedRun(list(overrides), cfg, container, plan, run_dir, resumes, continuation, where), []


def continuation_of(run_dir: Path, plan: dict) -> tuple[str | None, list[str]]:
    """How this plan continues the run directory's latest checkpoint at another parallel
    layout (None: the same layout, or a checkpoint that did not record its own), and why
    it cannot, each naming the checkpoint (its frozen weights, left elsewhere, gone)."""
    from orchestrator.plan.checkpoint_dirs import frozen_source_problem, saved_layout
    from orchestrator.plan.rules.topology import layout_change

    name, saved = saved_layout(run_dir)
    frozen_problem = frozen_source_problem(run_dir / "checkpoints" / name) if name else None
    if frozen_problem:
        return None, [f"{frozen_problem}; the run resumes from that checkpoint"]
    if saved is None:
        return None, []
    line, problems = layout_change(saved, plan)
    return (f"{name} {line}" if line else None), [f"{run_dir / 'checkpoints' / name}: {p}" for p in problems]


def config_yaml(run: PreparedRun) -> str:
    """The composed config, headed by where its recipe came from (comments: whatever reads
    config.yaml as YAML reads the same values)."""
    from omegaconf import OmegaConf

    head = ""
    if run.source:
        searched = "".join(f"\n#   {entry['dir']} ({entry['from']})" for entry in run.source["config_path"])
        head = (f"# recipe {run.source['recipe']}: {run.source['recipe_file']}\n"
                f"# config path, the first file of a name winning:{searched}\n")
    return head + OmegaConf.to_yaml(run.cfg, resolve=True)


def launch_index(run_dir: Path) -> int:
    return len((rd.read_json(run_dir / "launch.json", default={}) or {}).get("launches") or [])


def rank_job(launcher: dict):
    from launchers.job import RankJob

    return RankJob(launcher["entry"], launcher["accelerator"], int(launcher["max_requeues"]))


def dry_run_text(run: PreparedRun, array_size: int | None = None) -> str:
    from launchers.kinds import launcher_for

    launcher = run.launcher
    parts = [
        f"# dry run: nothing written, nothing submitted\n# run directory: {run.run_dir}"
        + (f"\n# {run.continuation}" if run.continuation else ""),
        "# composed config (config.yaml)\n" + config_yaml(run),
        # The plan's copy of the config is left out: it is printed just above.
        "# plan (plan.json)\n" + json.dumps({k: v for k, v in run.plan.items() if k != "config"}, indent=2, default=str),
        "# argv\n" + " ".join(str(a) for a in run.plan.get("argv") or []),
    ]
    parts.append(launcher_for(launcher["kind"]).dry_run_text(launcher, run.run_dir / "submitit", run.job_name,
                                                             array_size=array_size))
    return "\n\n".join(parts) + "\n"


def print_errors(errors: Sequence[str], header: str = "invalid configuration") -> None:
    print(f"{header}:", file=sys.stderr)
    for error in errors:
        print("  - " + error.replace("\n", "\n    "), file=sys.stderr)


def run_command(parser, argv: Sequence[str], refused_header: str, run) -> int:
    """The start the commands that compose a config share (train, prepare, plan): OVERRIDES
    and --config-dir parsed, the user's config folders searched for the whole command, a
    config group chosen without a recipe refused; then `run(args)`."""
    from orchestrator.plan import config_path
    from orchestrator.plan.compose import group_choice_without_recipe

    config_path.add_argument(parser)
    args = parser.parse_intermixed_args(list(argv))
    with config_path.command_line_dirs(args.config_dir):
        refused = group_choice_without_recipe(args.overrides)
        if refused:
            print_errors([refused], header=refused_header)
            return EXIT_INVALID
        return run(args)
