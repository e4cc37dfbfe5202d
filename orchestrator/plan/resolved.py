"""The resolved Plan: one typed object that planning writes and every rank of the job loads.

resolve.py makes it from a validated config; the launcher writes it into the run
directory as plan.json (`Plan.to_dict`); the job reads it back with `Plan.load(run_dir)`
and builds megatron-core's parallel state (`Plan.dims`), its TransformerConfig
(`Plan.transformer_fields`) and its optimizer from it, never from the YAML Hydra composed:
what `audiollm plan` prints is what runs. Pure Python (no omegaconf at import, no
validation): the job side imports it.

plan.json's keys: the sizes (`ParallelDims.as_dict`: world_size, tp, pp, cp, dp, vpp, sp,
rank_order) and every other field below by its name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from orchestrator.plan.parallel_dims import ParallelDims


class PlanError(ValueError):
    """plan.json is missing, unreadable or disagrees with the running job."""


# What a job cannot run without; the estimates may be absent (a plan.json written by hand).
REQUIRED = ("world_size", "num_microbatches", "padded_vocab_size", "megatron_args", "transformer_fields", "config")


@dataclass
class Plan:
    recipe: Optional[str]
    dims: ParallelDims
    num_microbatches: int
    padded_vocab_size: int
    tokens_per_step: int
    megatron_args: dict[str, Any]  # Megatron-LM argparse dest -> value, the sizes (dims) left out
    argv: list[str]  # the same, as Megatron-LM command-line flags
    # The model's megatron-core TransformerConfig fields (orchestrator/plan/megatron_fields.py):
    # the job's one config is built from them as they are, with dims' sizes.
    transformer_fields: dict[str, Any]
    # What the plan says of the model beside those fields: where the job implements argv
    # flags itself, the attention kernel, the encoder's precision, what is compiled.
    model_extensions: dict[str, Any]
    rank_layout: dict[str, list[list[int]]]
    parameters: dict[str, Any]
    memory: dict[str, Any]
    # Context parallel plans: the same run at CP=1 on the same GPUs (DP x CP as DP), for
    # comparison; None at CP=1.
    memory_at_cp1: Optional[dict[str, Any]]
    flops: dict[str, Any]
    # On GPUs: step time, tokens/s, bubble and communication per kind (layout_estimate.py)
    step_estimate: Optional[dict[str, Any]]
    warnings: list[str]
    config: dict[str, Any]  # the full composed config
    # Configuration errors of a plan resolved to be shown (`audiollm plan`), not run; a run's
    # plan.json never has any (train refuses an invalid config before writing it).
    errors: list[str] = field(default_factory=list)
    # Where it was loaded from (Plan.load); not part of plan.json.
    run_dir: Optional[Path] = field(default=None, compare=False)

    # -- the file ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and infinite numbers (CPU runs have no device memory limit or
        peak FLOPs) become None."""
        out = {**self.dims.as_dict(),
               **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("dims", "run_dir")}}
        out["memory_per_gpu_gib"] = self.memory_per_gpu_gib
        out["fits"] = self.fits
        return _finite(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any], run_dir: Optional[Path] = None, source: str = "plan") -> "Plan":
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise PlanError(f"{source} lacks keys {missing}" + (
                ": it was written by an older audiollm; plan the run again (`audiollm train` with the same "
                "arguments writes a new plan.json and resumes from the run's checkpoints)"
                if missing == ["transformer_fields"] else ""))
        dims = ParallelDims.from_dict(data)
        if dims.world_size != int(data["world_size"]):
            raise PlanError(f"{source} is inconsistent: tp {dims.tp} x pp {dims.pp} x cp {dims.cp} x dp {dims.dp} "
                            f"!= world_size {data['world_size']}")
        optional = {"recipe": None, "tokens_per_step": 0, "argv": [], "model_extensions": {}, "rank_layout": {},
                    "parameters": {}, "memory": {}, "memory_at_cp1": None, "flops": {}, "step_estimate": None,
                    "warnings": [], "errors": []}
        values = {name: data.get(name, default) for name, default in optional.items()}
        return cls(dims=dims, num_microbatches=int(data["num_microbatches"]),
                   padded_vocab_size=int(data["padded_vocab_size"]), megatron_args=dict(data["megatron_args"]),
                   transformer_fields=dict(data["transformer_fields"]),
                   config=data["config"], run_dir=run_dir, **values)

    @classmethod
    def load(cls, run_dir: str | Path) -> "Plan":
        """The plan of a run directory, as `audiollm train` / `prepare` wrote it."""
        run_dir = Path(run_dir)
        path = run_dir / "plan.json"
        if not path.is_file():
            raise PlanError(f"{path} does not exist: a run directory is written by `audiollm train` before launch")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(data, run_dir, source=str(path))

    # -- what the job reads -----------------------------------------------------------
    @property
    def memory_per_gpu_gib(self) -> Optional[float]:
        return self.memory.get("total_gib")

    @property
    def fits(self) -> Optional[bool]:
        return self.memory.get("fits")

    def section(self, name: str) -> dict:
        """One group of the composed config (model, optim, lora, logger, train, run, ...)."""
        return dict(self.config.get(name) or {})

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.megatron_args.get(name)
        return default if value is None else value

    @property
    def seed(self) -> int:
        """train.seed: every rank's RNG, LoRA's draws and the data order start from it."""
        return int(self.config["train"]["seed"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.megatron_args["micro_batch_size"])

    @property
    def global_batch_size(self) -> int:
        return int(self.megatron_args["global_batch_size"])

    @property
    def seq_length(self) -> int:
        return int(self.megatron_args["seq_length"])

    @property
    def train_iters(self) -> int:
        return int(self.megatron_args["train_iters"])

    def at_layout(self, dims: ParallelDims, num_microbatches: int) -> "Plan":
        """This run at other sizes (an evaluation at another layout), a new Plan: `dims`,
        and every value that follows from the sizes made anew from them (the padded
        vocabulary, the rank layout, the parallel arguments and section), without the
        distributed optimizer and virtual stages. The training layout's argv and estimates
        describe another run: left out."""
        from orchestrator.plan.megatron_args import padded_vocab_size, parallel_args, plan_args
        from orchestrator.plan.schema import ParallelConfig, RecomputeConfig

        section = {**self.section("parallel"), "tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "vpp": dims.vpp,
                   "sp": dims.sp, "distributed_optimizer": False}
        parallel = ParallelConfig(**{**section, "recompute": RecomputeConfig(**(section.get("recompute") or {}))})
        args = parallel_args(parallel)
        vocab = int(self.config["model"]["decoder"]["vocab_size"]) if "decoder" in self.section("model") else None
        return replace(
            self, dims=dims, num_microbatches=num_microbatches,
            padded_vocab_size=padded_vocab_size(vocab, dims.tp) if vocab else self.padded_vocab_size,
            megatron_args={**self.megatron_args, **plan_args(args)},
            argv=[], rank_layout=dims.mesh().as_dict(), parameters={}, memory={},
            memory_at_cp1=None, flops={}, step_estimate=None,
            config={**self.config, "parallel": {**section, "recompute": section.get("recompute")}})

    def check_world(self, world_size: int) -> None:
        """The job must run on exactly the ranks the plan was made for, in whole steps."""
        try:
            self.dims.at_world(world_size, where="WORLD_SIZE of the job")
        except ValueError as exc:
            raise PlanError(f"plan.json: {exc}") from None
        try:
            microbatches = self.dims.microbatches(self.global_batch_size, self.micro_batch_size)
        except ValueError as exc:
            raise PlanError(f"plan.json is inconsistent: {exc}") from None
        if microbatches != self.num_microbatches:
            raise PlanError(f"plan.json is inconsistent: num_microbatches {self.num_microbatches} != global batch "
                            f"{self.global_batch_size} / (micro batch {self.micro_batch_size} x dp {self.dims.dp})")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
