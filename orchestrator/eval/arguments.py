"""`audiollm eval`'s arguments, read where it runs here (orchestrator/eval/evaluate.py)
and where it is submitted as a job (launchers/eval_job.py, which must not import torch).

Launcher overrides (`launcher=slurm`, `launcher.partition=gpu`, ...) are taken out of
the command line before this parser sees it: they choose where the evaluation runs,
not what it computes."""

from __future__ import annotations

import argparse
from typing import Dict, Optional, Sequence

from orchestrator.plan.tasks import DEFAULT_NORMALISER, NORMALISERS


def eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiollm eval",
        description="Evaluate a run's checkpoint (validation loss per dataset; WER, exact match or BLEU when the "
                    "model provides generation). With launcher=slurm (or launcher=local) and launcher.* settings, "
                    "as a job through the run's launcher: audiollm status RUN/eval/job follows it.")
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: the run's latest)")
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size to evaluate at (default 1)")
    parser.add_argument("--pp", type=int, default=None, help="pipeline parallel size to evaluate at (default 1)")
    parser.add_argument("--cp", type=int, default=None, help="context parallel size to evaluate at (default 1)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="processes (one per GPU); default tp x pp x cp, the rest data parallel")
    parser.add_argument("--ctc-weight", type=float, default=None,
                        help="joint CTC/attention decoding at this weight (default: the run's "
                             "train.eval_generation_ctc_weight; 0: the decoder alone)")
    parser.add_argument("--examples", type=int, default=0,
                        help="also write the first N (reference, answer) pairs of each validation dataset into the JSON")
    parser.add_argument("--normaliser", action="append", default=[], metavar="[DATASET=]NAME",
                        help=f"score WER and exact match under this normaliser ({', '.join(NORMALISERS)}): every "
                             f"such validation dataset, or DATASET= one of them (repeatable); default: each "
                             f"dataset's data.validation[].normaliser, else {DEFAULT_NORMALISER}, the project's own")
    parser.add_argument("--all", action="store_true",
                        help="score every kept checkpoint not scored yet (one model, loaded with each in turn), then "
                             "write RUN/eval/steps.tsv, RUN/eval_curve.png and RUN/eval/best.json")
    parser.add_argument("--best-by", default=None, metavar="KEY",
                        help="with --all: the figure that names the best checkpoint, e.g. wer/all, "
                             "wer/DATASET, exact/all, val_loss (default: wer/all, exact/all, bleu/all or val_loss, "
                             "the first the run measures); WER and loss lower is better, exact match and BLEU higher")
    return parser


def split_launcher_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the evaluation's own arguments, the launcher overrides among them)."""
    def is_launcher(token: str) -> bool:
        return "=" in token and token.lstrip("+~").split("=")[0].split(".")[0] == "launcher"

    return [t for t in argv if not is_launcher(t)], [t for t in argv if is_launcher(t)]


def layout_of(args: argparse.Namespace) -> tuple[tuple[int, int, int] | None, int, str | None]:
    """(tp, pp, cp) asked for (None: none of --tp/--pp/--cp/--gpus given), the processes
    that evaluate (--gpus, else tp x pp x cp; 1 without a layout), and what is wrong with
    them (None when nothing)."""
    if all(v is None for v in (args.tp, args.pp, args.cp, args.gpus)):
        return None, 1, None
    layout = tuple(1 if size is None else size for size in (args.tp, args.pp, args.cp))
    if min(layout) < 1 or (args.gpus is not None and args.gpus < 1):
        return layout, 1, (f"--tp, --pp, --cp and --gpus must be >= 1 "
                           f"(got {args.tp}, {args.pp}, {args.cp}, {args.gpus})")
    return layout, args.gpus or layout[0] * layout[1] * layout[2], None


def normaliser_choice(values: Sequence[str]) -> tuple[Dict[Optional[str], str], Optional[str]]:
    """--normaliser's values as {dataset (None: every dataset): name}, and what is wrong
    with them (None when nothing)."""
    chosen: Dict[Optional[str], str] = {}
    for value in values:
        dataset, _, name = value.rpartition("=")
        if name not in NORMALISERS:
            return chosen, (f"--normaliser {value}: unknown normaliser {name!r}; use one of {', '.join(NORMALISERS)}, "
                            f"alone or as DATASET=NAME")
        chosen[dataset or None] = name
    return chosen, None
