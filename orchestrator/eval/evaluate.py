"""Evaluate a run's checkpoint: validation loss and the dataset's generation metric (WER,
exact match or BLEU of greedy decoding, orchestrator/train/generation_eval.py) per validation
dataset, whatever the run's train.eval_generation. Writes <run_dir>/eval/<checkpoint name>.json
(rank 0), with the joint CTC weight it decoded at.

    audiollm eval RUN_DIR [--checkpoint DIR] [--ctc-weight W] [--examples N]
        one process: the checkpoint is loaded resharded to TP=PP=1 (dist_checkpointing
        reshards on load), so any run can be evaluated without its cluster layout;
    audiollm eval RUN_DIR --all [--best-by KEY]
        every kept checkpoint not scored yet, then the table over steps, its plot and the
        best checkpoint (orchestrator/eval/checkpoint_table.py), and the scores into the
        training run's W&B run when it logs there;
    audiollm eval RUN_DIR --tp 2 [--pp P] [--cp C] [--gpus N]
        N processes on this machine (default tp x pp x cp; the rest is data parallel),
        the checkpoint resharded to that layout: a 9B model split over 2 GPUs;
    torchrun --nproc_per_node=N -m orchestrator.eval.evaluate RUN_DIR [--checkpoint DIR]
        N ranks with the run's own layout (N = the plan's world size);
    audiollm eval RUN_DIR ... launcher=slurm [launcher.partition=P ...]
        any of the above as a job through the training's launcher (launchers/eval_job.py,
        RUN_DIR/eval/job), whose ranks run job_entry below.

--ctc-weight W decodes with joint CTC/attention scores at weight W (the run's
train.eval_generation_ctc_weight otherwise; 0: the decoder alone).
--examples N also writes the first N (reference, answer) pairs of each validation
dataset into the JSON (those rank 0 decoded: its data- and context-parallel share).
--normaliser [DATASET=]NAME scores WER and exact match under another normaliser
(orchestrator/scoring/normalisers.py) than the datasets' data.validation[].normaliser.

Besides the scores, each evaluation writes, per checkpoint:
  RUN/eval/<checkpoint>.json    the figures; `scoring`: each dataset's metric, normaliser
                                and scorer, and its RTFx (audio seconds over decode seconds,
                                after a warm-up batch) with the device and the most samples
                                decoded together; `rtfx/<dataset>` and `rtfx/all` among
                                the figures (the table over steps and W&B show them)
  RUN/eval/hypotheses/<checkpoint>.jsonl
                                every answer: {"dataset", "metric", "normaliser",
                                "reference", "hypothesis", "reference_normalised",
                                "hypothesis_normalised"}, from every rank, so that another
                                convention can rescore it without decoding again
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

from orchestrator.plan.rundir import write_text_atomic
from orchestrator.plan.checkpoint_dirs import checkpoint_problem, frozen_source_problem, step_dirs
from orchestrator.runtime.ports import free_port
from orchestrator.plan.resolved import PlanError


class DamagedCheckpoint(RuntimeError):
    """The checkpoint to evaluate does not match its manifest."""


def single_rank_plan(plan):
    """The plan with a one-rank layout: TP=PP=CP=DP=1, same model and batch sizes."""
    return plan_at_layout(plan, tp=1, pp=1, cp=1, world_size=1)


def plan_at_layout(plan, tp: int, pp: int, cp: int, world_size: int):
    """The plan at another layout (data parallel: the rest of `world_size`), same model and
    batch sizes (num_microbatches = global batch / (micro batch x dp)); sequence parallel
    as the run had it where TP > 1, no virtual pipeline, no distributed optimizer."""
    from orchestrator.plan.parallel_dims import ParallelDims

    sp = plan.dims.sp and tp > 1
    try:
        dims = ParallelDims(tp=tp, pp=pp, cp=cp, sp=sp, order=plan.dims.order).at_world(world_size, "--gpus")
        num_microbatches = dims.microbatches(plan.global_batch_size, plan.micro_batch_size)
    except ValueError as exc:
        raise PlanError(f"cannot evaluate at this layout: {exc}") from None
    decoder = (plan.config.get("model") or {}).get("decoder")  # (a test's stand-in model has none)
    if decoder:  # the rules a training run at this layout meets (orchestrator/plan/rules/topology.py)
        import dataclasses

        from orchestrator.plan.rules.topology import check_heads, check_layers
        from orchestrator.plan.schema import DecoderConfig, ModelConfig, ParallelConfig

        known = {f.name for f in dataclasses.fields(DecoderConfig)}
        model = ModelConfig(decoder=DecoderConfig(**{k: v for k, v in decoder.items() if k in known}))
        parallel = ParallelConfig(tp=tp, pp=pp, cp=cp)
        bad = [f.message for f in (*check_heads(parallel, model), *check_layers(parallel, model))]
        if bad:
            raise PlanError("cannot evaluate at this layout: " + "; ".join(bad))
    return plan.at_layout(dims, num_microbatches)


def single_process_env() -> None:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def evaluate_run(run_dir: str | Path, checkpoint: Optional[str | Path] = None,
                 components_factory: Optional[Callable] = None, layout: Optional[Tuple[int, int, int]] = None,
                 ctc_weight: Optional[float] = None, examples: int = 0,
                 normalisers: Optional[Dict[Optional[str], str]] = None) -> dict:
    """`components_factory`: as orchestrator.train.entry.make_trainer's (the AudioLLM's by
    default). `layout` (tp, pp, cp): evaluate at it, on this process group's ranks (the
    rest data parallel); None: one process, or the run's own layout under torchrun.
    `ctc_weight`: train.eval_generation_ctc_weight for this evaluation (None: the run's).
    `examples`: (reference, answer) pairs per dataset to write into the JSON.
    `normalisers`: {dataset, or None for every one: normaliser name} (--normaliser)."""
    from orchestrator.train import checkpoint as ckpt

    run_dir = Path(run_dir)
    plan = evaluation_plan(run_dir, ctc_weight, normalisers)  # its errors before anything is looked for
    path = Path(checkpoint) if checkpoint else ckpt.latest_checkpoint(run_dir)
    if path is None or not path.is_dir():
        raise FileNotFoundError(f"{run_dir}: no checkpoint to evaluate ({path or 'checkpoints/latest is missing'}); "
                                f"train first or pass --checkpoint DIR")
    problem = checkpoint_problem(path)
    if problem:
        others = [p for p in step_dirs(run_dir) if p.name != path.name and checkpoint_problem(p) is None]
        raise DamagedCheckpoint(f"checkpoint {path} is damaged: {problem}; "
                                + (f"evaluate the newest complete one with --checkpoint {others[0]}" if others
                                   else "the run has no other complete checkpoint"))
    check_frozen_source(path)
    return _score(run_dir, plan, [path], components_factory, layout, examples)[path.name]


def check_frozen_source(path: Path) -> None:
    """Before the model is built: FrozenSourceError where the checkpoint's frozen weights,
    left in its run's model.init_checkpoint, are gone or changed."""
    from orchestrator.train.dist_format import FrozenSourceError

    problem = frozen_source_problem(path)
    if problem:
        raise FrozenSourceError(problem)


def evaluate_every_checkpoint(run_dir: str | Path, components_factory: Optional[Callable] = None,
                              layout: Optional[Tuple[int, int, int]] = None, ctc_weight: Optional[float] = None,
                              examples: int = 0,
                              normalisers: Optional[Dict[Optional[str], str]] = None) -> tuple[dict, list]:
    """Score each kept checkpoint that RUN/eval/ has no result for yet, oldest first, with
    the model built once: an evaluation stopped half-way (a preempted job) goes on where
    it stopped. Returns ({checkpoint name: results} of those scored now, [damaged ones
    left out, with why])."""
    run_dir = Path(run_dir)
    plan = evaluation_plan(run_dir, ctc_weight, normalisers)
    kept = list(reversed(step_dirs(run_dir)))
    damaged = [f"{p.name}: {checkpoint_problem(p)}" for p in kept if checkpoint_problem(p)]
    todo = [p for p in kept if checkpoint_problem(p) is None and not (run_dir / "eval" / f"{p.name}.json").is_file()]
    if not kept:
        raise FileNotFoundError(f"{run_dir}: no checkpoint to evaluate (checkpoints/step_N); train first")
    for path in todo:
        check_frozen_source(path)
    return (_score(run_dir, plan, todo, components_factory, layout, examples) if todo else {}), damaged


def evaluation_plan(run_dir: Path, ctc_weight: Optional[float],
                    normalisers: Optional[Dict[Optional[str], str]] = None):
    """The run's plan as an evaluation runs it: generation on, the decoding weight asked
    for (refused, naming both weights, where the model has no CTC head), the normalisers
    asked for (`normalisers`: set_normalisers)."""
    from orchestrator.plan.resolved import Plan

    plan = Plan.load(run_dir)
    trained_ctc = float(plan.section("model").get("adapter", {}).get("ctc_weight", 0.0))
    head = trained_ctc > 0  # the model has the CTC head
    if ctc_weight is not None:
        if not 0 <= ctc_weight <= 1 or (ctc_weight > 0 and not head):
            raise PlanError(f"--ctc-weight {ctc_weight}: joint CTC/attention decoding takes a weight within [0, 1] and "
                            f"the adapter's CTC head, which the run's model has only when trained with "
                            f"model.adapter.ctc_weight > 0 (its is {trained_ctc}); use --ctc-weight 0")
        plan.config["train"]["eval_generation_ctc_weight"] = ctc_weight
    if plan.section("data").get("validation"):
        plan.config["train"]["eval_generation"] = True  # what this command is for, whatever the run's setting
    set_normalisers(plan.config["data"].get("validation") or [], normalisers or {})
    return plan


def set_normalisers(entries: list, chosen: Dict[Optional[str], str]) -> None:
    """--normaliser into the plan's data.validation entries: `chosen[None]` into every
    entry scored by WER or exact match (BLEU reads raw strings), `chosen[name]` into that
    one (refused, naming the value and why, on a BLEU dataset or a name the run has not)."""
    from orchestrator.plan.tasks import NORMALISED_METRICS, entry_metric, normaliser_problems

    names = [str(e.get("name")) for e in entries]
    unknown = sorted(d for d in chosen if d is not None and d not in names)
    if unknown:
        raise PlanError(f"--normaliser {unknown[0]}={chosen[unknown[0]]}: the run has no validation dataset "
                        f"{unknown[0]!r}; it has: {', '.join(names) or 'none'}")
    for entry in entries:
        name, metric = str(entry.get("name")), entry_metric(entry)
        if name in chosen:
            if normaliser_problems(chosen[name], metric, name):
                raise PlanError(f"--normaliser {name}={chosen[name]}: {name} is scored by {metric}, which reads the "
                                f"raw strings; a normaliser applies to {' and '.join(NORMALISED_METRICS)} only")
            entry["normaliser"] = chosen[name]
        elif None in chosen and metric in NORMALISED_METRICS:
            entry["normaliser"] = chosen[None]


def _score(run_dir: Path, plan, paths: list, components_factory, layout, examples) -> dict:
    """Load each checkpoint of `paths` into one model and evaluate it; rank 0 writes
    RUN/eval/<checkpoint>.json after each."""
    from orchestrator.runtime import job_control
    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import checkpoint as ckpt
    from orchestrator.train.entry import make_trainer, setup_logging

    head = float(plan.section("model").get("adapter", {}).get("ctc_weight", 0.0)) > 0  # the model has the CTC head
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        single_process_env()
        plan = single_rank_plan(plan)
    elif layout is not None:
        plan = plan_at_layout(plan, *layout, world_size=int(os.environ["WORLD_SIZE"]))
    # The weight decoded at: without the head, the decoder alone (generation_eval).
    joint = float(plan.section("train").get("eval_generation_ctc_weight", 0.0)) if head else 0.0
    if plan.dims.pp > 1 and joint > 0:
        raise PlanError(f"joint CTC/attention decoding (train.eval_generation_ctc_weight={joint}) runs at pipeline "
                        f"size 1: the CTC head is on the first stage and the tokens are chosen on the last "
                        f"(got pp {plan.dims.pp}); evaluate at --pp 1 or pass --ctc-weight 0")
    rank = int(os.environ["RANK"])
    setup_logging(rank)
    scores = {}
    try:
        trainer = make_trainer(run_dir, components_factory, plan=plan, training=False)
        generation = trainer.components.generation_eval
        if generation is not None:  # what this command adds to training's evaluation
            generation.examples, generation.timing, generation.keep_hypotheses = examples, True, True
        for done, path in enumerate(paths):
            # A job asked to stop (preemption, a time limit, a cancel) stops between two
            # checkpoints, after the first of its attempt (so that every attempt gets
            # somewhere): what is scored is written, the requeued job scores the rest.
            if done and job_control.should_stop():
                print(f"stopped by {job_control.stop_signal()} before {path.name}: {done} checkpoint(s) scored and "
                      f"kept", flush=True)
                break
            ckpt.load_model_weights(path, trainer.chunks)
            results = scores[path.name] = trainer.evaluate()
            if rank == 0:
                out = run_dir / "eval" / f"{path.name}.json"
                out.parent.mkdir(exist_ok=True)
                shown = {}
                if generation is not None:
                    shown = {"scoring": generation.last_scoring}
                    if examples:
                        shown["examples"] = generation.last_examples
                    write_hypotheses(run_dir / "eval" / "hypotheses" / f"{path.name}.jsonl", generation)
                write_text_atomic(out, json.dumps({"checkpoint": path.name, "eval_generation_ctc_weight": joint,
                                                   **results, **shown}, indent=1) + "\n")
                print(f"{path.name}: " + " | ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)
                if generation is not None and generation.last_scoring:
                    print(speed_line(generation.last_scoring), flush=True)
    finally:
        shutdown()
    return scores


def write_hypotheses(path: Path, generation) -> None:
    """Every answer of the last evaluation, one JSON object a line, dataset by dataset."""
    lines = []
    for name, pairs in generation.last_hypotheses.items():
        scoring = generation.last_scoring[name]
        for pair in pairs:
            lines.append(json.dumps({"dataset": name, "metric": scoring["metric"], "normaliser": scoring["normaliser"],
                                     **pair}, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(line + "\n" for line in lines))


def speed_line(scoring: dict) -> str:
    """Each dataset's RTFx with what it was measured on, and how each was scored."""
    parts = [f"{name} {s['rtfx']:.1f}x ({s['audio_seconds']:.1f} s of audio in {s['decode_seconds']:.2f} s, batches "
             f"of up to {s['batch_samples']})" for name, s in scoring.items() if "rtfx" in s]
    device = next((s["device"] for s in scoring.values() if "device" in s), "?")
    scored = ", ".join(f"{name} {s['metric']}" + (f" under {s['normaliser']}" if s["normaliser"] else "")
                       for name, s in scoring.items())
    return f"RTFx after a warm-up batch on {device}: {'; '.join(parts)}\nscored: {scored}"


def _launch(argv: Sequence[str], processes: int) -> int:
    """This command again on `processes` local ranks (torchrun), which take its arguments."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "orchestrator.eval.evaluate", *argv]
    return subprocess.call(cmd)


def main(argv: Optional[Sequence[str]] = None, raise_errors: bool = False) -> int:
    """`audiollm eval` here: 0, or 2 with the reason on stderr (`raise_errors`: raised
    instead, for a job, whose failure record then names it)."""
    from orchestrator.eval.arguments import eval_parser, layout_of, normaliser_choice

    def refuse(message: str) -> int:
        if raise_errors:
            raise RuntimeError(message)
        print(message, file=sys.stderr)
        return 2

    parser = eval_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.all and args.checkpoint:
        return refuse("--all scores every kept checkpoint; --checkpoint names one: pass one of them")
    layout, processes, problem = layout_of(args)
    normalisers, wrong = normaliser_choice(args.normaliser)
    if problem or wrong:
        return refuse(problem or wrong)
    if processes > 1 and "WORLD_SIZE" not in os.environ:
        return _launch(argv, processes)
    try:
        if not args.all:
            evaluate_run(args.run_dir, args.checkpoint, layout=layout, ctc_weight=args.ctc_weight,
                         examples=args.examples, normalisers=normalisers)
            return 0
        _, damaged = evaluate_every_checkpoint(args.run_dir, layout=layout, ctc_weight=args.ctc_weight,
                                               examples=args.examples, normalisers=normalisers)
    except (FileNotFoundError, DamagedCheckpoint, PlanError) as exc:
        if raise_errors:
            raise
        return refuse(str(exc))
    from orchestrator.runtime import job_control

    if int(os.environ.get("RANK", "0")) != 0 or job_control.stopped_early():  # the table once all are scored
        return 0
    from orchestrator.eval.checkpoint_table import write_summary

    try:
        rows, chosen = write_summary(Path(args.run_dir), args.best_by)
    except ValueError as exc:  # --best-by names a figure the run has not
        return refuse(str(exc))
    return _summarize(Path(args.run_dir), rows, chosen, damaged)


def _summarize(run_dir: Path, rows: list, chosen: Optional[dict], damaged: list) -> int:
    """Print the table over steps and the best checkpoint; log the scores to W&B."""
    from orchestrator.eval.checkpoint_table import table_text

    print(table_text(rows), end="")
    scoring = json.loads((run_dir / "eval" / f"{rows[-1]['checkpoint']}.json").read_text()).get("scoring") \
        if rows else None
    if scoring:  # the newest checkpoint's: what the rtfx columns were measured on, and the normalisers
        print(speed_line(scoring))
    for line in damaged:
        print(f"left out, damaged: {line}")
    from orchestrator.train.metrics import log_evaluations_to_wandb
    from orchestrator.plan.resolved import Plan

    plan = Plan.load(run_dir)
    devices = {s["device"] for s in (scoring or {}).values() if "device" in s}
    said = log_evaluations_to_wandb(run_dir, plan.section("logger"), plan.section("run"), rows,
                                    {"eval/rtfx_device": devices.pop()} if len(devices) == 1 else None)
    if said:
        print(said)
    if chosen:
        print(f"best by {chosen['by']} ({'lower' if chosen['lower_is_better'] else 'higher'} is better): "
              f"{chosen['checkpoint']} ({chosen['value']:.4g}); export it with `audiollm convert megatron-to-hf "
              f"--megatron {run_dir} --step best --out DIR`")
    return 0


def job_entry(job_dir: str) -> None:
    """launchers/job.py's entry for an evaluation submitted as a job (launchers/eval_job.py):
    every rank runs this command with the arguments JOB_DIR/eval_job.json holds."""
    main(json.loads((Path(job_dir) / "eval_job.json").read_text())["argv"], raise_errors=True)


if __name__ == "__main__":
    sys.exit(main())
