"""Checkpoints on a wall-clock interval (train.save_interval_minutes), beside the step
interval: a node lost between two step-count checkpoints costs at most that many
minutes of training, whatever a step takes.

Rank 0's clock decides and every rank learns it in the same collective, so all ranks
save after the same step (a save is collective)."""

from __future__ import annotations

import time


class SaveClock:
    def __init__(self, minutes: float, rank: int):
        self.seconds = max(float(minutes or 0), 0.0) * 60
        self.rank = rank
        self.last = time.monotonic()

    def due(self) -> bool:
        """Collective when the interval is set: True on every rank once rank 0's
        interval since the last save has passed."""
        if not self.seconds:
            return False
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(self.rank == 0 and time.monotonic() - self.last >= self.seconds)], dtype=torch.int32)
        if dist.is_available() and dist.is_initialized():
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.broadcast(flag, src=0)
        return bool(flag.item())

    def saved(self) -> None:
        self.last = time.monotonic()
