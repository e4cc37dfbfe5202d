"""Which training samples a job consumed: the ids of the samples the MDS loader packs
into the micro-batches it hands to the step (not its look-ahead, not validation), logged
by the job's processes and read back by the test."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path


def record_consumed(directory: str | Path) -> None:
    """From now on, this process appends the id of every sample a training micro-batch
    holds to DIRECTORY/consumed_<rank>_<pid>, on one rank of each data-parallel rank's
    group (its tensor-parallel peers read the same samples)."""
    from megatron.core import parallel_state as ps

    from orchestrator.data import loader

    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"consumed_{os.environ.get('RANK', '0')}_{os.getpid()}"
    take = loader.TrainLoader.__next__

    def recording(self):
        pop = self.packer.pop_rows

        def popping():
            rows = pop()
            if ps.get_tensor_model_parallel_rank() == 0:
                with open(path, "a") as f:
                    f.write("".join(f"{ex.sample_id}\n" for row in rows for ex in row))
            return rows

        self.packer.pop_rows = popping
        try:
            return take(self)
        finally:
            del self.packer.pop_rows

    loader.TrainLoader.__next__ = recording


def consumed(directory: str | Path) -> Counter:
    return Counter(int(line) for f in Path(directory).glob("consumed_*") for line in f.read_text().split())


def main(run_dir: str) -> int:
    """A `launcher.entry` for tests: the job's own entry, recording into RUN_DIR/consumed."""
    from orchestrator.train.entry import main as entry_main

    record_consumed(Path(run_dir) / "consumed")
    return entry_main(run_dir)
