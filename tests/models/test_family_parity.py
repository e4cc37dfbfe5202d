"""The decoder families beside Gemma2 (llama, qwen2, qwen3) equal their HF models (CPU,
fp32) at TP=1, TP=2 with sequence parallelism, PP=2, CP=2, packed sequences and the flex
kernel; each known porting mistake breaks parity; the plan's parameter inventory is the
built AudioLLM's (tests/models/family_parity_script.py, one launch)."""

import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("family_parity_script.py")
GOOD = ["llama_tp1", "llama_tp2_sp", "llama_pp2", "llama_packed_tp2_sp", "llama_flex_tp1", "llama_cp2",
        "qwen2_tp1", "qwen2_tp2_sp", "qwen2_pp2", "qwen2_cp2",
        "qwen3_tp1", "qwen3_tp2_sp", "qwen3_pp2", "qwen3_packed_tp2_sp", "qwen3_cp2",
        "gemma3_tp1", "gemma3_tp2_sp", "gemma3_pp2", "gemma3_cp2", "gemma3_packed_tp2_sp", "gemma3_flex_tp1"]
BAD = ["llama_bad_zero_centered_norm", "llama_bad_geglu", "llama_bad_no_rope_scaling", "qwen2_bad_no_qkv_bias",
       "qwen3_bad_no_qk_norm", "qwen3_bad_q_and_k_norms_swapped", "qwen3_bad_cp2_contiguous_halves",
       "gemma3_bad_one_rope", "gemma3_bad_window_every_other_layer", "gemma3_bad_no_rope_scaling"]
FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]
GRADS = ["qwen3_grad_tp2", "qwen3_grad_tp2_sp", "qwen3_bad_grad_tp2_without_qk_layernorm"]
DECODES = ["gemma3_decode"]


@pytest.fixture(scope="module")
def family_results():
    output = torchrun(SCRIPT, 2)
    found = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    by_case = {r["case"]: r for r in found}
    assert sorted(by_case) == sorted(GOOD + BAD + GRADS + DECODES) and len(found) == len(by_case), sorted(by_case)
    inventories = [json.loads(m) for m in re.findall(r"^INVENTORY (.*)$", output, re.M)]
    by_case["inventory"] = {r["family"]: r for r in inventories}
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
@pytest.mark.parametrize("family", FAMILIES)
def test_the_plans_parameter_inventory_is_the_built_audiollms(family_results, family):
    r = family_results["inventory"][family]
    assert r["real"] == r["analytic"]
    shapes = {name: shape for name, shape, _ in r["real"]}
    layer = "language_model.decoder.layers.0.self_attention."
    # Gemma's sandwich norms only
    assert any("post_attention_layernorm" in n for n in shapes) == (family == "gemma3")
    assert any("post_mlp_layernorm" in n for n in shapes) == (family == "gemma3")
    # Llama 3 8B and Qwen3 8B have their own output layer; small Qwen2.5 and Gemma 3 tie it.
    assert ("language_model.output_layer.weight" in shapes) == (family in ("llama", "qwen3"))
    assert (layer + "linear_qkv.bias" in shapes) == (family == "qwen2")
    # QK-norm over head_dim (32 in the tiny Qwen3, twice hidden / heads; 16 in Gemma 3)
    head_dim = {"qwen3": [32], "gemma3": [16]}.get(family)
    assert shapes.get(layer + "q_layernorm.weight") == head_dim
    assert shapes.get(layer + "k_layernorm.weight") == head_dim


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", GRADS[:2])
def test_qk_norm_gradients_at_tp2_equal_tp1s(family_results, case):
    # fp32 sums of a few terms in another order over gradients of order one
    r = family_results[case]
    assert r["max_abs_grad_diff"] <= 1e-6 * max(1.0, r["max_abs_grad"]), r


@pytest.mark.multiprocess
def test_qk_norm_gradients_stay_partial_unless_the_config_says_qk_layernorm(family_results):
    r = family_results["qwen3_bad_grad_tp2_without_qk_layernorm"]
    assert r["max_abs_qk_grad_diff"] > 1e-3, r


@pytest.mark.multiprocess
def test_gemma3_decodes_as_hf_generate_with_and_without_the_kv_cache(family_results):
    """Each layer type rotates with its own RoPE through the cache too; the prompts outrun
    the window, so the sliding layers' ring cache is read (margins well above fp32 noise)."""
    r = family_results["gemma3_decode"]
    assert r["min_margin"] > 1e-3, r
    assert r["cached"] == r["hf"] and r["uncached"] == r["hf"], r
    assert r["bad_cached_one_rope"] != r["hf"], r  # the cache's rotation: one RoPE for every layer

