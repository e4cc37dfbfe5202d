import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("packed_vs_unpacked_script.py")


@pytest.mark.multiprocess
def test_packed_row_gives_the_unpacked_loss_through_the_real_model(tmp_path):
    output = torchrun(SCRIPT, 1, str(tmp_path), timeout=600)
    result = json.loads(re.search(r"^RESULT (.*)$", output, re.M).group(1))
    assert result["rows"][0][0] == 1 and result["rows"][1][0] == 4
    assert result["masked_tokens"][0] == result["masked_tokens"][1] > 0
    assert result["packed"] == pytest.approx(result["unpacked"], abs=1e-6)
    assert result["packed_row_mask"] == pytest.approx(result["unpacked"], abs=1e-6)
