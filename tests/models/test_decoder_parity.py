"""Megatron Gemma2 decoder == HF Gemma2 (CPU, fp32) at TP=1, TP=2, PP=2, TP=2 with
sequence parallel, packed sequences; each known porting mistake breaks parity."""

import pytest

GOOD = ["tp1", "tp2", "pp2", "tp2_sp", "packed_tp1", "packed_tp2_sp"]
BAD = ["bad_norm_offset", "bad_window_parity", "bad_window_off_by_one", "bad_swiglu",
       "bad_no_attn_softcap", "bad_no_final_softcap"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", GOOD)
def test_logits_and_loss_match_hf(parity_results, case):
    r = parity_results[case]
    assert r["max_abs_logit_diff"] <= 1e-4, r
    assert r["loss_diff"] <= 1e-5, r


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", BAD)
def test_known_mistake_breaks_parity(parity_results, case):
    r = parity_results[case]
    assert r["max_abs_logit_diff"] > 1e-2, r
