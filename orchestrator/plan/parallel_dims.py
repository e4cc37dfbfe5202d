"""The parallel sizes of a run, as one object: their arithmetic, its checks and the mesh.

Planning computes them once from the config (validate.py checks them, resolve.py writes
them into the Plan), the launchers size their tasks from them, and every rank of the job
initialises megatron's parallel state from the Plan's (orchestrator/runtime/distributed.py).
Pure Python: the submit side and the job side both import it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Optional

from orchestrator.plan.topology import RANK_ORDERS, RankLayout, rank_layout


def world_size(nodes: int, gpus_per_node: int) -> int:
    """The ranks a launch starts: one per GPU (or per CPU process) of every node."""
    return int(nodes) * int(gpus_per_node)


@dataclass(frozen=True)
class ParallelDims:
    """tp x pp x cp x dp ranks (megatron's order of the digits: `order`).

    `dp` None: the rest of whatever world the ranks are started in (a test or a by-hand
    run that names the model-parallel sizes only); `at_world` fills it in. `vpp`: virtual
    pipeline stages per rank, None without interleaving (and always None at pp 1)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: Optional[int] = None
    vpp: Optional[int] = None
    sp: bool = False
    order: str = RANK_ORDERS[0]

    def __post_init__(self):
        # One spelling of "no interleaving": megatron reads 0, 1 and None alike only in places.
        if self.vpp is not None and (self.vpp <= 1 or self.pp <= 1):
            object.__setattr__(self, "vpp", None)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        if self.dp is None:
            raise ValueError(f"data-parallel size unknown (tp {self.tp} x pp {self.pp} x cp {self.cp} x dp ?): "
                             f"use ParallelDims.at_world")
        return self.model_parallel * self.dp

    @staticmethod
    def world_problem(tp: int, pp: int, cp: int, world: int, where: str) -> Optional[str]:
        """Why tp x pp x cp cannot tile `world` ranks (`where`: what sets the world), or None."""
        model_parallel = tp * pp * cp
        if model_parallel >= 1 and world >= 1 and world % model_parallel == 0:
            return None
        return (f"tensor_model_parallel_size ({tp}) x pipeline_model_parallel_size ({pp}) x "
                f"context_parallel_size ({cp}) = {model_parallel} does not divide world size {world} ({where}); "
                f"choose parallel sizes whose product divides {world}, or change the number of ranks")

    def at_world(self, world: int, where: str = "the ranks started") -> "ParallelDims":
        """These sizes on `world` ranks, dp the rest; ValueError naming every factor where
        they do not tile it (or a dp already set disagrees)."""
        problem = self.world_problem(self.tp, self.pp, self.cp, world, where)
        if problem:
            raise ValueError(problem)
        dp = world // self.model_parallel
        if self.dp is not None and self.dp != dp:
            raise ValueError(f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp} = {self.world_size} ranks "
                             f"planned, but world size is {world} ({where}): re-plan the run or start it on "
                             f"{self.world_size} ranks")
        return replace(self, dp=dp)

    def microbatches(self, global_batch_size: int, micro_batch_size: int) -> int:
        """Micro-batches per step on each data-parallel rank; ValueError where the global
        batch is not a whole number of them."""
        problem = self.batch_problem(global_batch_size, micro_batch_size)
        if problem:
            raise ValueError(problem)
        return global_batch_size // (micro_batch_size * (self.dp or 1))

    def batch_problem(self, global_batch_size: int, micro_batch_size: int) -> Optional[str]:
        per_step = micro_batch_size * (self.dp or 1)
        if micro_batch_size >= 1 and global_batch_size >= 1 and global_batch_size % per_step == 0:
            return None
        return (f"optim.global_batch_size ({global_batch_size}) is not divisible by optim.micro_batch_size "
                f"({micro_batch_size}) x data-parallel size ({self.dp or 1}) = {per_step}; use a multiple of {per_step}")

    def mesh(self) -> RankLayout:
        """Which global ranks form each tp/cp/dp/pp group (megatron's own layout)."""
        return rank_layout(self.tp, self.cp, self.dp if self.dp is not None else 1, self.pp, self.order)

    def as_dict(self) -> dict[str, Any]:
        """plan.json's keys: world_size, tp, pp, cp, dp, vpp, sp, rank_order."""
        out = asdict(self)
        out["rank_order"] = out.pop("order")
        return {"world_size": self.world_size, **out}

    @classmethod
    def of(cls, parallel: Any) -> "ParallelDims":
        """The model-parallel sizes of a `parallel` config section (orchestrator/plan/schema:
        tp, pp, cp, vpp, sp, rank_order); dp is the launcher's to set (at_world)."""
        return cls(tp=parallel.tp, pp=parallel.pp, cp=parallel.cp, vpp=parallel.vpp, sp=parallel.sp,
                   order=parallel.rank_order)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ParallelDims":
        return cls(tp=int(data.get("tp", 1)), pp=int(data.get("pp", 1)), cp=int(data.get("cp", 1)),
                   dp=int(data["dp"]) if data.get("dp") is not None else None,
                   vpp=int(data["vpp"]) if data.get("vpp") else None, sp=bool(data.get("sp", False)),
                   order=str(data.get("rank_order") or RANK_ORDERS[0]))


def canonical_nodes_problem(nodes: int, dp: int, fixed: bool, configured: int | None = None) -> str | None:
    """Why data-parallel size `dp` cannot read a training order of `nodes` canonical nodes
    (fixed: by the run's first start, where data.canonical_nodes, `configured`, must
    agree; else set by data.canonical_nodes), or None."""
    if fixed and configured is not None and configured != nodes:
        return (f"data.canonical_nodes={configured}, but this run's sample order was fixed at {nodes} canonical nodes "
                f"at its first start; unset data.canonical_nodes or set it to {nodes}")
    if nodes >= 1 and dp >= 1 and nodes % dp == 0:
        return None
    sizes = [d for d in range(1, nodes + 1) if nodes % d == 0]
    if fixed:
        return (f"data-parallel size {dp} does not divide the run's {nodes} canonical nodes (its sample order was "
                f"fixed at its first start); data-parallel sizes that continue it: {', '.join(map(str, sizes))}")
    return (f"data.canonical_nodes ({nodes}) is not a multiple of the data-parallel size ({dp}): each data-parallel "
            f"rank reads a whole number of canonical nodes; use a multiple of {dp}, or a data-parallel size among "
            f"{sizes}")
