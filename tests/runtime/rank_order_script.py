"""Writes this rank's megatron DP and PP groups for a given rank order (world 4: DP 2 x PP 2)
to OUT_DIR/rank<N>.json (a file per rank: lines printed by several ranks can interleave).
Run: torchrun --nproc_per_node=4 tests/runtime/rank_order_script.py ORDER OUT_DIR"""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown


def main() -> None:
    init_distributed(ParallelDims(pp=2, order=sys.argv[1]), seed=1)
    from megatron.core import parallel_state as ps

    groups = {
        "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
        "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
    }
    (Path(sys.argv[2]) / f"rank{dist.get_rank()}.json").write_text(json.dumps(groups))
    shutdown()


if __name__ == "__main__":
    main()
