"""`audiollm prepare OVERRIDES...`: the run directory written, nothing submitted; prints
the srun and torchrun commands that start it by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from launchers.checks import DemoCorpusError, ensure_demo_corpus
from launchers.runs import EXIT_INVALID, EXIT_OK, config_yaml, prepare, print_errors, run_command
from launchers.submit import RunActive, ensure_not_active
from orchestrator.plan import rundir as rd


def prepare_only(overrides: Sequence[str]) -> int:
    """`audiollm prepare OVERRIDES...`: validate, resolve and write the run directory, and
    print how to start it by hand (inside a SLURM allocation, or with torchrun); nothing
    is submitted. The job then runs on whatever starts it, with the same entry."""
    run, errors = prepare(overrides)
    if run is None:
        print_errors(errors)
        return EXIT_INVALID
    try:
        ensure_not_active(run.run_dir)
        ensure_demo_corpus([run])
    except (RunActive, DemoCorpusError) as exc:
        print_errors([str(exc)], header="not prepared")
        return EXIT_INVALID
    rd.prepare(run.run_dir, config_yaml(run), run.plan)
    nodes, per_node = int(run.launcher["nodes"]), int(run.launcher["gpus_per_node"])
    entry = f"-m launchers.by_hand {run.run_dir}"
    # torchrun kills its workers 30 s after it passed them a stop (Ctrl-C, SIGTERM): too
    # short for a large model's checkpoint. The time the run allows for it, as a
    # submitted job's signal comes launcher.signal_delay_s before its limit (torch 2.14
    # reads the variable; 2.11 keeps 30 s).
    grace = int(run.launcher["signal_delay_s"])
    print(f"prepared run {run.run_dir} for {nodes} node(s) x {per_node} processes; start it with one of\n"
          f"  inside a SLURM allocation (salloc -N{nodes} --ntasks-per-node={per_node} ...):\n"
          f"    srun --nodes={nodes} --ntasks-per-node={per_node} {sys.executable} {entry}\n"
          f"  torchrun, once on every node (HOST: the first node; a stop gives the ranks {grace} s, "
          f"launcher.signal_delay_s, to checkpoint):\n"
          f"    TORCH_ELASTIC_SHUTDOWN_TIMEOUT={grace} {Path(sys.executable).parent / 'torchrun'} --nnodes={nodes} "
          f"--nproc-per-node={per_node} --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 {entry}")
    return EXIT_OK


def prepare_main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="audiollm prepare",
        description="Validate and resolve like `audiollm train`, write the run directory, and print the srun and "
                    "torchrun commands that start it; submits nothing.")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +recipe=gemma2_whisper_tp4pp2")
    return run_command(parser, argv, "not prepared", lambda args: prepare_only(args.overrides))
