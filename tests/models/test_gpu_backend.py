import json
import re
from pathlib import Path

import pytest
import torch

from tests.distributed_run import torchrun


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (TransformerEngine + compiled flex_attention)")
def test_te_backend_bf16_close_to_hf_fp32():
    output = torchrun(Path(__file__).with_name("gpu_te_script.py"), 1)
    result = json.loads(re.search(r"^RESULT (.*)$", output, re.M).group(1))
    assert result["missing"] == [] and result["unexpected"] == [], result  # every weight loaded
    # bf16 weights and activations against an fp32 reference; logits are capped at 3
    assert result["max_abs_logit_diff"] < 0.1, result
    # bf16 gradients (8 mantissa bits, accumulated over 128 positions): a few percent of
    # the fp32 ones in norm; a wrong backward is off by order one
    assert result["nonfinite_grads"] == [] and result["no_grad"] == [], result
    assert all(v < 0.05 for v in result["grad_rel_diff"].values()), result
