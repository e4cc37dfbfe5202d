"""Evaluate a run's checkpoint: validation loss and the dataset's generation metric (WER,
exact match or BLEU of greedy decoding, orchestrator/train/generation_eval.py) per validation
dataset, whatever the run's train.eval_generation. Writes <run_dir>/eval/<checkpoint name>.json
(rank 0).

    audiollm eval RUN_DIR [--checkpoint DIR]
        one process: the checkpoint is loaded resharded to TP=PP=1 (dist_checkpointing
        reshards on load), so any run can be evaluated without its cluster layout;
    torchrun --nproc_per_node=N -m orchestrator.train.evaluate RUN_DIR [--checkpoint DIR]
        N ranks with the run's own layout (N = the plan's world size).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from launchers.rundir import write_text_atomic
from orchestrator.checkpoint_dirs import checkpoint_problem, step_dirs
from orchestrator.train.run_plan import PlanError


class DamagedCheckpoint(RuntimeError):
    """The checkpoint to evaluate does not match its manifest."""


def single_rank_plan(plan):
    """The plan with a one-rank layout: TP=PP=CP=DP=1, same model and batch sizes
    (num_microbatches = global batch / micro batch)."""
    from orchestrator.train.run_plan import RunPlan

    data = copy.deepcopy(plan.plan)
    data.update(world_size=1, tp=1, pp=1, cp=1, dp=1, vpp=None, sp=False,
                num_microbatches=plan.global_batch_size // plan.micro_batch_size)
    data["megatron_args"].update(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                 context_parallel_size=1, cp_comm_type=None, sequence_parallel=False,
                                 use_distributed_optimizer=False,
                                 num_virtual_stages_per_pipeline_rank=None)
    # The model is built from the config's parallel section: it must say the same.
    data["config"]["parallel"].update(tp=1, pp=1, cp=1, vpp=None, sp=False, distributed_optimizer=False)
    return RunPlan(run_dir=plan.run_dir, plan=data)


def _single_process_env() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def evaluate_run(run_dir: str | Path, checkpoint: Optional[str | Path] = None,
                 components_factory: Optional[Callable] = None) -> dict:
    """`components_factory`: as orchestrator.train.entry.make_trainer's (the AudioLLM's by default)."""
    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import checkpoint as ckpt
    from orchestrator.train.entry import make_trainer, setup_logging
    from orchestrator.train.run_plan import load_run_plan

    run_dir = Path(run_dir)
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
    plan = load_run_plan(run_dir)
    if plan.section("data").get("validation"):
        plan.config["train"]["eval_generation"] = True  # what this command is for, whatever the run's setting
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        _single_process_env()
        plan = single_rank_plan(plan)
    rank = int(os.environ["RANK"])
    setup_logging(rank)
    try:
        trainer = make_trainer(run_dir, components_factory, plan=plan, training=False)
        ckpt.load_model_weights(path, trainer.chunks)
        results = trainer.evaluate()
        if rank == 0:
            out = run_dir / "eval" / f"{path.name}.json"
            out.parent.mkdir(exist_ok=True)
            write_text_atomic(out, json.dumps({"checkpoint": path.name, **results}, indent=1) + "\n")
            print(" | ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)
    finally:
        shutdown()
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm eval", description="Evaluate a run's checkpoint "
                                     "(validation loss per dataset; WER, exact match or BLEU when the model "
                                     "provides generation).")
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: the run's latest)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        evaluate_run(args.run_dir, args.checkpoint)
    except (FileNotFoundError, DamagedCheckpoint, PlanError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
