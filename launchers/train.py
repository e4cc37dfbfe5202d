"""`audiollm train [-m] OVERRIDES...`: compose -> validate (every point of a sweep, before
anything is submitted) -> plan -> run directory written -> submit. launcher=local blocks
and streams rank 0's output; launcher=slurm returns once the job is queued (unless
launcher.wait=true): the launcher kind's `queues` (launchers/kinds/). launcher.dry_run=true
prints and submits nothing. -m: a sweep (launchers/sweep.py).
"""

from __future__ import annotations

from typing import Sequence

from launchers.checks import DemoCorpusError, dry_run_or_refusal, ensure_demo_corpus
from launchers.follow import follow_hint
from launchers.kinds import launcher_for
from launchers.runs import EXIT_INVALID, EXIT_OK, dry_run_text, prepare, print_errors, run_command
from launchers.submit import RunActive, submit_run
from launchers.sweep import train_sweep
from orchestrator.plan import rundir as rd


def train(overrides: Sequence[str], multirun: bool = False) -> int:
    """`audiollm train [-m] OVERRIDES...`; returns the process exit code."""
    if multirun:
        return train_sweep(overrides)
    run, errors = prepare(overrides)
    if run is None:
        print_errors(errors)
        return EXIT_INVALID
    launcher = run.launcher
    verdict = dry_run_or_refusal(launcher, dry_run_text(run) if launcher["dry_run"] else "")
    if verdict is not None:
        return verdict
    try:
        ensure_demo_corpus([run])
        job = submit_run(run)
    except (RunActive, rd.RunBusy, DemoCorpusError) as exc:
        print_errors([str(exc)], header="not submitted")
        return EXIT_INVALID
    except OSError as exc:  # run.output_root read-only, on a full disk, under a file, ...
        print_errors([f"cannot write the run directory {run.run_dir}: {exc}; set run.output_root to a writable "
                       f"directory"], header="not submitted")
        return EXIT_INVALID
    verb = "resuming" if run.resumes else "starting"
    if run.continuation:
        print(run.continuation)
    kind = launcher_for(launcher["kind"])
    print(f"{verb} run {run.run_dir}\n{kind.submitted(job, launcher)}", flush=True)
    if not kind.waits(launcher):
        print(follow_hint(run.run_dir))
        return EXIT_OK
    return kind.wait([job], [run.run_dir])


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
    return run_command(parser, argv, "not started", lambda args: train(args.overrides, multirun=args.multirun))
