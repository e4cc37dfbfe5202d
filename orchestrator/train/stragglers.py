"""Stragglers named: every log interval each rank's step time, split into what it spent
on its own (data wait, forward/backward, optimizer) and what it waited for others
(the collectives that end the step), is gathered on rank 0; a rank whose own time is
more than `train.straggler_threshold` above the median of all ranks is named on the
console and in metrics.jsonl.

Why its own time: ranks of a synchronous step end it together, so their step times are
equal; a slow rank shows as more time of its own, its peers as more time waiting for
it in the gradient reduction."""

from __future__ import annotations

import statistics
import time
from typing import List, Optional

# The parts of a step, in the order gathered; `own` is the sum of the first three.
PARTS = ("data_wait", "compute", "optimizer", "sync")


class StepTimer:
    """This rank's step parts, summed over the steps since the last gather (the process's
    first step left out)."""

    def __init__(self):
        self.sums = dict.fromkeys(PARTS, 0.0)
        self.steps = 0
        self._mark = None
        self._first = True  # this process's first step

    def start(self) -> None:
        self._mark = time.perf_counter()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        if self._mark is not None:  # (a schedule run outside train_step times nothing)
            self.sums[part] += now - self._mark
        self._mark = now

    def step_done(self) -> None:
        if self._first:  # one-time costs (allocation, compilation, caches) differ by rank: not counted
            self.sums, self._first = dict.fromkeys(PARTS, 0.0), False
            return
        self.steps += 1

    def gather(self, rank: int, world: int) -> Optional[List[dict]]:
        """Collective: every rank's per-step averages on rank 0 (None elsewhere); resets."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([self.sums[p] / max(self.steps, 1) for p in PARTS], dtype=torch.float64)
        self.sums, self.steps = dict.fromkeys(PARTS, 0.0), 0
        if not (dist.is_available() and dist.is_initialized()) or world == 1:
            return [dict(zip(PARTS, mine.tolist()))]
        on_gpu = dist.get_backend() == "nccl"
        mine = mine.cuda() if on_gpu else mine
        everyone = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        if rank != 0:
            return None
        return [dict(zip(PARTS, t.cpu().tolist())) for t in everyone]


def own_time(part: dict) -> float:
    return part["data_wait"] + part["compute"] + part["optimizer"]


def stragglers(per_rank: List[dict], threshold: float) -> List[dict]:
    """Ranks whose own time per step exceeds the median by more than `threshold` (a
    fraction), slowest first: {"rank", "own_s", "median_s", "over", and each part}."""
    if len(per_rank) < 2:
        return []
    median = statistics.median(own_time(p) for p in per_rank)
    slow = [{"rank": r, "own_s": own_time(p), "median_s": median, "over": own_time(p) / median - 1, **p}
            for r, p in enumerate(per_rank) if median > 0 and own_time(p) > median * (1 + threshold)]
    return sorted(slow, key=lambda s: -s["over"])


def straggler_line(first_step: int, last_step: int, slow: List[dict]) -> str:
    named = "; ".join(f"rank {s['rank']} {s['own_s']:.3f} s/step of its own (+{100 * s['over']:.0f}% over the "
                      f"median {s['median_s']:.3f} s: data {s['data_wait']:.3f}, forward/backward "
                      f"{s['compute']:.3f}, optimizer {s['optimizer']:.3f})" for s in slow)
    return f"stragglers over steps {first_step}-{last_step}: {named}"
