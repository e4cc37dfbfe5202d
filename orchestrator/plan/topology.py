"""Which global ranks form each tensor/context/data/pipeline-parallel group.

Megatron lays ranks out as a mixed-radix number whose digits are the parallel
ranks, fastest-varying first, in the order named by `rank_order`. megatron-core's
default is "tp-cp-ep-dp-pp" (Megatron-LM's `--use-tp-pp-dp-mapping` switches to
"tp-cp-ep-pp-dp"). Expert parallelism is not used by this project (ep = 1).

Pure Python, no megatron import: tests/orchestrator/test_topology.py checks
these groups against megatron-core's own RankGenerator.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

RANK_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")


@dataclass(frozen=True)
class RankLayout:
    tp: list[list[int]]
    cp: list[list[int]]
    dp: list[list[int]]
    pp: list[list[int]]

    def as_dict(self) -> dict[str, list[list[int]]]:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}


def global_rank(coords: dict[str, int], sizes: dict[str, int], order: str = RANK_ORDERS[0]) -> int:
    """The global rank of the parallel ranks `coords` (tp, cp, ep, dp, pp; ep 0) for the
    group `sizes`: the mixed-radix number of `order`, fastest-varying digit first."""
    rank, stride = 0, 1
    for dim in order.split("-"):
        rank += coords.get(dim, 0) * stride
        stride *= sizes.get(dim, 1)
    return rank


def rank_layout(tp: int, cp: int, dp: int, pp: int, order: str = RANK_ORDERS[0]) -> RankLayout:
    if order not in RANK_ORDERS:
        raise ValueError(f"rank order {order!r} is not one of {RANK_ORDERS}")
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    dims = order.split("-")

    def groups(varying: str) -> list[list[int]]:
        fixed_dims = [d for d in dims if d != varying]
        out = []
        # Enumerate the fixed coordinates with the fastest dimension varying first, so
        # groups come out sorted by their smallest rank, as megatron lists them.
        for fixed in product(*(range(sizes[d]) for d in reversed(fixed_dims))):
            coords = dict(zip(reversed(fixed_dims), fixed))
            out.append([global_rank({**coords, varying: i}, sizes, order) for i in range(sizes[varying])])
        return sorted(out)

    return RankLayout(tp=groups("tp"), cp=groups("cp"), dp=groups("dp"), pp=groups("pp"))
