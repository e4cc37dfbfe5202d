from __future__ import annotations

import pytest


def tiny_overrides(root, *extra: str, ranks: int = 2, iters: int = 6) -> list[str]:
    """The default tiny recipe as a `ranks`-process CPU job writing under `root`."""
    return [
        "launcher.accelerator=cpu", f"launcher.gpus_per_node={ranks}", f"optim.micro_batch_size={16 // ranks}",
        "optim.lr_warmup_iters=0", f"train.iters={iters}", "train.log_interval=1", f"run.output_root={root}",
        *extra,
    ]


@pytest.fixture
def tiny():
    return tiny_overrides
