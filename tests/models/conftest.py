import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

PARITY_SCRIPT = Path(__file__).with_name("parity_script.py")


@pytest.fixture(scope="session")
def parity_results():
    """All parity cases of parity_script.py, from one 2-process launch."""
    output = torchrun(PARITY_SCRIPT, 2)
    found = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    by_case = {r["case"]: r for r in found}
    assert len(by_case) == len(found), "a case was reported twice"
    by_case["inventory"] = json.loads(re.search(r"^INVENTORY (.*)$", output, re.M).group(1))
    return by_case
