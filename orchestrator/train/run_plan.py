"""The run directory as the job sees it: plan.json (resolved Plan) and config.yaml.

The job reads the resolved Plan, never the raw Hydra config, so what runs is what was
planned. plan.json is `Plan.to_dict()`: world_size, tp, pp, cp, dp, vpp, sp,
num_microbatches, padded_vocab_size, tokens_per_step, argv, megatron_args (dict keyed
by Megatron-LM argparse dest names) and config (the full composed config as a dict).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


class PlanError(ValueError):
    """plan.json is missing, unreadable or disagrees with the running job."""


@dataclass
class RunPlan:
    run_dir: Path
    plan: dict

    @property
    def megatron_args(self) -> dict:
        return self.plan["megatron_args"]

    @property
    def config(self) -> dict:
        return self.plan["config"]

    def section(self, name: str) -> dict:
        """One group of the composed config (model, optim, lora, logger, train, run, ...)."""
        return dict(self.config.get(name) or {})

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.megatron_args.get(name)
        return default if value is None else value

    @property
    def tp(self) -> int:
        return int(self.plan.get("tp", 1))

    @property
    def pp(self) -> int:
        return int(self.plan.get("pp", 1))

    @property
    def cp(self) -> int:
        return int(self.plan.get("cp", 1))

    @property
    def dp(self) -> int:
        return int(self.plan.get("dp", 1))

    @property
    def vpp(self) -> Optional[int]:
        vpp = self.plan.get("vpp")
        return int(vpp) if vpp not in (None, 0, 1) else None

    @property
    def num_microbatches(self) -> int:
        return int(self.plan["num_microbatches"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.arg("micro_batch_size", self.section("optim").get("micro_batch_size", 1)))

    @property
    def global_batch_size(self) -> int:
        return int(self.arg("global_batch_size", self.section("optim").get("global_batch_size", 1)))

    @property
    def seq_length(self) -> int:
        return int(self.arg("seq_length", self.section("data").get("seq_length", 0)))

    @property
    def train_iters(self) -> int:
        return int(self.arg("train_iters", self.section("train").get("iters", 0)))

    @property
    def padded_vocab_size(self) -> int:
        return int(self.plan["padded_vocab_size"])

    def check_world(self, world_size: int) -> None:
        """The job must run on exactly the ranks the plan was made for."""
        planned = int(self.plan["world_size"])
        if planned != world_size:
            raise PlanError(
                f"plan.json was resolved for world_size {planned} (tp {self.tp} x pp {self.pp} x "
                f"cp {self.cp} x dp {self.dp}) but the job runs on WORLD_SIZE {world_size}: "
                f"re-plan the run or launch it with {planned} ranks"
            )
        if self.tp * self.pp * self.cp * self.dp != planned:
            raise PlanError(
                f"plan.json is inconsistent: tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp} "
                f"!= world_size {planned}"
            )
        expected_mb = self.global_batch_size // (self.micro_batch_size * self.dp)
        if expected_mb * self.micro_batch_size * self.dp != self.global_batch_size or expected_mb != self.num_microbatches:
            raise PlanError(
                f"plan.json is inconsistent: global_batch_size {self.global_batch_size} != "
                f"micro_batch_size {self.micro_batch_size} x dp {self.dp} x num_microbatches {self.num_microbatches}"
            )


def load_run_plan(run_dir: str | Path) -> RunPlan:
    run_dir = Path(run_dir)
    path = run_dir / "plan.json"
    if not path.is_file():
        raise PlanError(f"{path} does not exist: a run directory is written by `audiollm train` before launch")
    try:
        plan = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    missing = [k for k in ("world_size", "num_microbatches", "padded_vocab_size", "megatron_args", "config") if k not in plan]
    if missing:
        raise PlanError(f"{path} lacks keys {missing}")
    return RunPlan(run_dir=run_dir, plan=plan)
