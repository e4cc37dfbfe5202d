import json
from pathlib import Path

import pytest

from orchestrator.plan.topology import rank_layout
from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("rank_order_script.py")


@pytest.mark.multiprocess
def test_job_groups_follow_the_planned_non_default_rank_order(tmp_path):
    """The default order is megatron's own; the other one proves the order reaches megatron."""
    order = "tp-cp-ep-pp-dp"
    torchrun(SCRIPT, 4, order, str(tmp_path))
    seen = {int(p.stem[len("rank"):]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(seen) == [0, 1, 2, 3]
    planned = rank_layout(tp=1, cp=1, dp=2, pp=2, order=order)
    for rank, groups in seen.items():
        assert groups["dp"] in planned.dp and rank in groups["dp"]
        assert groups["pp"] in planned.pp and rank in groups["pp"]
