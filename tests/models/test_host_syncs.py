"""No host sync in a training micro-batch's forward and backward (tests/models/
host_sync_script.py counts the aten operations that wait for the GPU): placeholder
counts are checked on the host copy of the batch, clip lengths and rows arrive as host
lists, the embedding scale is a Python number, and host-made masks reach the device by
asynchronous copies."""

import json
import re
from pathlib import Path

from tests.distributed_run import torchrun


def test_a_training_forward_and_backward_reads_no_device_value():
    output = torchrun(Path(__file__).with_name("host_sync_script.py"), 1)
    (result,) = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    assert result["loss"] > 0
    # SpecAugment draws its spans from each clip's CPU generator: host tensors on any
    # device (and no GPU recipe enables it). Nothing else may read a value.
    reads = {where: n for where, n in result["reads"].items() if not where.startswith("__int__ at models/spec_augment.py:")}
    assert reads == {}, result["reads"]
    assert result["reads"], "the recorder saw nothing: SpecAugment's draws should show"
