"""`audiollm` command line. Most commands hand their arguments to the module that does
the work (DELEGATED, CONVERSIONS); `audiollm plan` (one plan, or a sweep's table
with -m) is implemented here, on the planning side's functions. Commands that plan or
submit import neither torch nor megatron, so `audiollm --help` and `audiollm plan` stay
fast."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from typing import Callable, Sequence

# Commands implemented elsewhere: name -> (module, function, one-line help). The
# function takes the remaining argv and returns an exit code.
DELEGATED: dict[str, tuple[str, str, str]] = {
    "train": ("launchers.train", "train_main", "compose, validate, resolve and launch a run (or a sweep with -m)"),
    "prepare": ("launchers.prepare", "prepare_main", "write a run directory to start by hand (srun in an allocation, "
                "or torchrun); submits nothing"),
    "recipes": ("orchestrator.plan.config_path", "recipes_main", "list the recipes (shipped and your own, "
                "--config-dir / $AUDIOLLM_CONFIG_PATH / audiollm.yaml) with where each comes from"),
    "status": ("launchers.status", "status_main", "state, last step and last loss of a run or sweep directory"),
    "cancel": ("launchers.status", "cancel_main", "cancel the jobs of a run or sweep directory"),
    "eval": ("launchers.eval_job", "eval_main", "validation loss and WER / exact match / BLEU of a run's "
             "checkpoint, or of every one (--all); here, or as a job with launcher=slurm|local"),
    "transcribe": ("orchestrator.eval.transcribe", "main", "answer audio files (wav, flac, ogg, mp3) with a run's "
                   "checkpoint or an exported model directory"),
    "data": ("orchestrator.data.cli", "main", "data tools: `audiollm data demo` (the speech demo corpus), `import` (NeMo, HF datasets, Kaldi, WebDataset -> MDS), `show`"),
    "compare-weights": ("orchestrator.convert.compare_weights", "main", "list parameters whose statistics differ between two checkpoints"),
    "wheels": ("launchers.offline_wheels", "main", "write the wheels a GPU machine without internet needs (setup.sh --from-wheels)"),
}
# `audiollm convert DIRECTION ...`
CONVERSIONS: dict[str, tuple[str, str]] = {
    "hf-to-megatron": ("orchestrator.convert.hf_to_megatron", "main"),
    "megatron-to-hf": ("orchestrator.convert.megatron_to_hf", "main"),
}


def convert_main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in CONVERSIONS:
        print("usage: audiollm convert {" + ",".join(CONVERSIONS) + "} [--help] ...", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module_name, function_name = CONVERSIONS[argv[0]]
    return int(getattr(importlib.import_module(module_name), function_name)(list(argv[1:])) or 0)


def _plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiollm plan",
        description="Show what would run: topology, rank layout, memory per GPU, Megatron argv. Submits nothing.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +recipe=gemma2_whisper_tp4pp2 parallel.tp=2")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    parser.add_argument("--params", action="store_true", help="also list every parameter name and shape")
    parser.add_argument("--probe", action="store_true",
                        help="also build and step each pipeline stage at full size on fake tensors (one CPU process "
                             "per stage, no GPU, under a minute) and set its memory beside the estimate")
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="plan every point of a sweep (Hydra's syntax, as `audiollm train -m`: "
                             "parallel.tp=1,2,4 parallel.pp=1,2) and print one row each, best estimate first")
    parser.add_argument("--probe-best", type=int, default=0, metavar="N",
                        help="with -m: also probe (as --probe) the N best valid points")
    return parser


def plan_main(argv: Sequence[str]) -> int:
    """Everything the configuration allows to compute, then its errors (exit 2 when there
    are any): a user sees the layout, memory and argv of a recipe before converting its
    weights, and `audiollm train` still refuses it."""
    from launchers.runs import run_command

    return run_command(_plan_parser(), argv, "not planned", _plan)


def _plan(args: argparse.Namespace) -> int:
    from orchestrator.plan.compose import ComposeError, compose
    from orchestrator.plan.resolve import resolve, to_object
    from orchestrator.plan.rules.findings import ConfigInvalid
    from orchestrator.plan.validate import validate

    if args.multirun:
        return _plan_sweep(args)
    try:
        cfg = compose(args.overrides)
    except ComposeError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        plan = resolve(cfg, purpose="plan", keep_errors=True)
    except Exception:
        findings = validate(to_object(cfg), "plan")
        if not any(f.severity == "error" for f in findings):
            raise  # a defect of the planner, not of the configuration
        print(f"{ConfigInvalid(findings)}\n(no plan can be computed until they are fixed)", file=sys.stderr)
        return 2
    from launchers.kinds import launcher_for

    check = launcher_for(plan.config["launcher"]["kind"]).cluster_check(plan.config["launcher"])
    problems = check.problems  # None: a launcher without a queue, no SLURM here, or no answer in time (check.skipped)
    continuation, layout_problems = _continuation(cfg, plan)
    errors = [*plan.errors, *layout_problems]
    if args.json:
        print(json.dumps({**plan.to_dict(), "cluster_problems": problems, "cluster_check_skipped": check.skipped,
                          "continuation": continuation, "continuation_problems": layout_problems},
                         allow_nan=False))
    else:
        from orchestrator.plan.report import render

        print(render(plan, with_params=args.params))
        if problems is not None:
            print("\ncluster check (this SLURM cluster's partitions and nodes): "
                  + ("the request fits" if not problems else "it could never start the job"))
            for problem in problems:
                print("  - " + problem)
        if check.skipped:
            print(f"\ncluster check skipped: {check.skipped}")
        if continuation:
            print(f"\nresumes its run directory: {continuation}")
    if args.probe:
        from orchestrator.plan.probe_report import ProbeFailed, render as render_probe, run_probe

        try:
            print("\n" + render_probe(plan.to_dict(), run_probe(plan.to_dict())), flush=True)
        except ProbeFailed as exc:
            print(f"\n{exc}", file=sys.stderr)
            return 1
    if errors:
        print(f"\n{len(errors)} configuration error(s): the plan above is what would run once they are fixed; "
              f"`audiollm train` refuses it until then:\n" + "\n".join(f"  {e}" for e in errors), file=sys.stderr)
        return 2
    return 0


def _plan_sweep(args: argparse.Namespace) -> int:
    """`audiollm plan -m`: the table of every point (exit 2 when no point can run)."""
    from orchestrator.plan.sweep import SweepError
    from orchestrator.plan.sweep_table import plan_rows, render, to_json

    try:
        rows = plan_rows(args.overrides)
    except SweepError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    report = to_json(rows)
    print(json.dumps(report, allow_nan=False) if args.json else render(rows, args.overrides))
    runnable = [p for p in report["points"] if p["runs"]]
    if args.probe_best:
        from orchestrator.plan.compose import compose
        from orchestrator.plan.probe_report import ProbeFailed, render as render_probe, run_probes
        from orchestrator.plan.resolve import resolve

        # The probe steps fake weights on synthetic batches: an error every point shares (a
        # checkpoint not converted yet, say) does not stop it; a point's own broken rule does.
        best = [p for p in report["points"] if p["valid"]][:args.probe_best]
        if not best:
            print(f"\n--probe-best {args.probe_best}: nothing to probe, no point is valid (each breaks a rule of "
                  f"its own or does not fit)", file=sys.stderr)
        elif report["shared_errors"]:
            print(f"\nprobing the {len(best)} best valid point(s) despite the error(s) every point shares: the "
                  f"probe runs on fake weights and synthetic batches", flush=True)
        plans = [resolve(compose(point["overrides"]), purpose="plan", keep_errors=True).to_dict() for point in best]
        try:
            results = run_probes([(plan, None) for plan in plans])  # their roles share this machine's cores
        except ProbeFailed as exc:
            point = "" if exc.probe is None else f" of {' '.join(best[exc.probe]['overrides'])}"
            print(f"\nprobe{point}: {exc}", file=sys.stderr)
            return 1
        for point, plan, probed in zip(best, plans, results):
            print(f"\nprobe of {' '.join(point['overrides'])}:\n" + render_probe(plan, probed), flush=True)
    return 0 if runnable and not report["shared_errors"] else 2


def _continuation(cfg, plan) -> tuple:
    """How this plan continues its run directory's latest checkpoint at another parallel
    layout, and why it cannot: what `audiollm train` would say before submitting."""
    from omegaconf import OmegaConf

    from launchers.runs import continuation_of
    from orchestrator.plan import rundir

    container = OmegaConf.to_container(cfg, resolve=True)
    run_dir = rundir.run_dir_for(container).absolute()
    if container["run"]["resume"] != "auto" or not rundir.has_checkpoint(run_dir):
        return None, []
    return continuation_of(run_dir, plan.to_dict())


def _top_parser(commands: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiollm",
        description="Declarative training orchestrator for Megatron-core AudioLLMs (Whisper -> adapter -> Gemma2).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<16} {text}" for name, text in commands.items())
        + "\n\nexamples:\n  audiollm plan +recipe=gemma2_whisper_tp4pp2\n  audiollm train\n"
        "  audiollm train -m +recipe=tiny_cpu optim.lr=1e-3,3e-4",
    )
    parser.add_argument("command", choices=sorted(commands), metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the command (COMMAND --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `audiollm plan --json | head` should end quietly, like other command-line tools.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    commands = {"plan": "what would run, and will it fit (--json for scripts)"}
    commands.update({name: text for name, (_, _, text) in DELEGATED.items()})
    commands["convert"] = "checkpoint conversion: convert hf-to-megatron | megatron-to-hf (--verify)"
    parser = _top_parser(commands)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    ns = parser.parse_args(argv[:1])
    rest = argv[1:]
    if ns.command == "plan":
        return plan_main(rest)
    if ns.command == "convert":
        return convert_main(rest)
    module_name, function_name, _ = DELEGATED[ns.command]
    handler: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function_name)
    return int(handler(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
