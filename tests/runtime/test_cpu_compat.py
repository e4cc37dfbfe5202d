import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("tp_train_script.py")


def _losses(output: str) -> list[float]:
    return json.loads(re.search(r"^LOSSES (.*)$", output, re.M).group(1))


@pytest.mark.multiprocess
def test_megatron_trains_on_cpu_with_tp2_and_matches_tp1():
    """With the CPU layer, TP=2 training over gloo runs and gives TP=1's losses."""
    tp1 = _losses(torchrun(SCRIPT, 1, "--tp", "1"))
    tp2 = _losses(torchrun(SCRIPT, 2, "--tp", "2"))
    assert tp1[-1] < tp1[0], tp1
    assert tp2 == pytest.approx(tp1, abs=1e-5)
