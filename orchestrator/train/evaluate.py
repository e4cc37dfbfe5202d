"""Evaluate a run's checkpoint on every rank: validation loss per dataset, plus the
generation metrics (greedy decoding, WER per validation dataset) when the components
provide `generation_eval`. `audiollm eval RUN_DIR` launches this like training:
  torchrun --nproc_per_node=N -m orchestrator.train.evaluate RUN_DIR [CHECKPOINT_DIR]
Writes <run_dir>/eval/<checkpoint name>.json (rank 0)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional


def main(run_dir: str | Path, checkpoint: Optional[str | Path] = None) -> int:
    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import checkpoint as ckpt
    from orchestrator.train.entry import make_trainer, setup_logging

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    run_dir = Path(run_dir)
    try:
        path = Path(checkpoint) if checkpoint else ckpt.latest_checkpoint(run_dir)
        if path is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint to evaluate (checkpoints/latest is missing)")
        trainer = make_trainer(run_dir)
        ckpt.load_model_weights(path, trainer.chunks)
        results = trainer.evaluate()
        if rank == 0:
            out = run_dir / "eval" / f"{path.name}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps({"checkpoint": path.name, **results}, indent=1) + "\n")
            print(" | ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m orchestrator.train.evaluate RUN_DIR [CHECKPOINT_DIR]")
    sys.exit(main(*sys.argv[1:]))
