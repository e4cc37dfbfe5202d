"""The decoder families beside Gemma2 equal their HF models (CPU, fp32) at TP=1, TP=2
with sequence parallelism, PP=2, packed sequences and the flex kernel; each known
porting mistake breaks parity; the plan's parameter inventory is the built AudioLLM's
(tests/models/family_parity_script.py, one launch)."""

import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("family_parity_script.py")
GOOD = ["llama_tp1", "llama_tp2_sp", "llama_pp2", "llama_packed_tp2_sp", "llama_flex_tp1"]
BAD = ["llama_bad_zero_centered_norm", "llama_bad_geglu", "llama_bad_no_rope_scaling"]


@pytest.fixture(scope="module")
def family_results():
    output = torchrun(SCRIPT, 2)
    found = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    by_case = {r["case"]: r for r in found}
    assert sorted(by_case) == sorted(GOOD + BAD) and len(found) == len(by_case), sorted(by_case)
    by_case["inventory"] = json.loads(re.search(r"^INVENTORY (.*)$", output, re.M).group(1))
    return by_case


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", GOOD)
def test_logits_and_loss_match_hf(family_results, case):
    # The Gemma2 check's bounds (tests/models/test_decoder_parity.py): fp32 sums in another
    # order over logits of a few units.
    r = family_results[case]
    assert r["max_abs_logit_diff"] <= 1e-4, r
    assert r["loss_diff"] <= 1e-5, r


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", BAD)
def test_known_mistake_breaks_parity(family_results, case):
    r = family_results[case]
    assert r["max_abs_logit_diff"] > 1e-2, r


@pytest.mark.multiprocess
def test_the_plans_parameter_inventory_is_the_built_audiollms(family_results):
    r = family_results["inventory"]
    assert r["real"] == r["analytic"]
    names = {name for name, _, _ in r["real"]}
    assert "language_model.output_layer.weight" in names  # Llama 3's own output layer
    assert not any("post_attention_layernorm" in n or "post_mlp_layernorm" in n for n in names)
