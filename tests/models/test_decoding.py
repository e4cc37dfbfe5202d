"""Greedy decoding with the KV cache: HF-exact tokens, the same tokens at every layout
and either padding side, per-row stops, joint CTC/attention decoding (tests/models/
decode_script.py, one launch of two ranks); what each layer's cache keeps (no process group)."""

import json
import re
from pathlib import Path

import pytest
import torch

from orchestrator.models.kv_cache import KVCache
from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("decode_script.py")
# The project's fp32 logits are within 1e-4 of HF's (tests/models/test_audiollm.py): a
# greedy token can differ from HF's only where HF's lead over the runner-up is below 2e-4.
LOGIT_BOUND = 1e-4


@pytest.fixture(scope="module")
def result():
    out = torchrun(SCRIPT, 2, timeout=400)
    return json.loads(re.search(r"^RESULT (.*)$", out, re.M).group(1))


@pytest.mark.multiprocess
def test_greedy_tokens_equal_hf_generate_with_and_without_cache(result):
    assert result["min_margin"] > 2 * LOGIT_BOUND, f"the fixture has a near tie: {result['min_margin']}"
    hf = result["hf_cached"]
    assert result["hf_uncached"] == hf
    assert all(len(row) == 20 for row in hf) and len({t for row in hf for t in row}) > 10, hf  # not degenerate
    assert result["tp1"]["cached_left"] == hf
    assert result["tp1"]["uncached"] == hf


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["tp1", "tp2_sp", "pp2", "cp2"])
def test_every_layout_and_padding_side_decodes_the_same_tokens(result, layout):
    run = result[layout]
    assert run["cached_left"] == result["hf_cached"]
    assert run["cached_right"] == result["hf_cached"]
    assert run["all_ranks_equal"]


@pytest.mark.multiprocess
def test_joint_ctc_decoding_is_the_same_at_every_layout_and_changes_only_the_audio_rows(result):
    joint, greedy = result["tp1"]["joint"], result["hf_cached"]
    assert result["tp1"]["joint_uncached"] == joint
    for layout in ("tp2_sp", "cp2"):
        assert result[layout]["joint"] == joint, layout
    assert joint[2] == greedy[2]  # the text-only row has no CTC scores: greedy
    assert joint[:2] != greedy[:2]  # the CTC head moved the audio rows
    # only the rows marked in ctc_rows are rescored
    assert result["tp1"]["joint_row1_only"] == [greedy[0], joint[1], greedy[2]]
    assert "pipeline size 1" in result["pp2"]["joint_refused"]


@pytest.mark.multiprocess
def test_per_row_stop_ids_and_max_new_tokens(result):
    hf, run = result["hf_cached"], result["tp1"]
    cut = run["row0_stop_at"]
    assert cut >= 2 and run["per_row_stop"] == [hf[0][:cut], hf[1], hf[2]]
    assert run["capped"] == [row[:3] for row in hf]
    assert run["training_after"] is True


def _step(cache, positions, real=None):
    positions = torch.tensor(positions)
    cache.begin(positions, torch.ones_like(positions, dtype=torch.bool) if real is None else torch.tensor(real),
                inv_freqs=(torch.ones(2), None))


def test_a_windowed_layer_keeps_only_what_its_window_can_see():
    """Window 4: a query sees itself and 3 earlier keys, so 3 slots in a ring; a global
    layer keeps every position up to the capacity."""
    cache = KVCache(capacity=12)
    like = torch.zeros(6, 2, 1, 4)  # [s, b, groups, dim]
    window, full = cache.layer(1, 4, like), cache.layer(2, None, like)
    assert window.keys.shape[1] == 3 and full.keys.shape[1] == 12
    # prefill: row 0 has 6 real tokens, row 1 is left-padded to 4 real tokens
    _step(cache, [[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]], [[True] * 6, [False, False, True, True, True, True]])
    key = torch.arange(12.0).reshape(6, 2, 1, 1).expand(6, 2, 1, 4)
    for layer in (window, full):
        layer.store(key, key, cache.step)
    assert sorted(window.positions[0].tolist()) == [3, 4, 5] and sorted(window.positions[1].tolist()) == [1, 2, 3]
    assert full.positions[0].tolist()[:6] == [0, 1, 2, 3, 4, 5] and full.positions[1].tolist()[:5] == [0, 1, 2, 3, -1]
    _step(cache, [[6], [4]])
    window.store(key[:1], key[:1], cache.step)
    assert sorted(window.positions[0].tolist()) == [4, 5, 6] and sorted(window.positions[1].tolist()) == [2, 3, 4]
    # the slot a position lands in holds that position's key (row 1's position 3 came from column 5)
    slot = window.positions[1].tolist().index(3)
    assert float(window.keys[1, slot, 0, 0]) == float(key[5, 1, 0, 0])


def test_a_position_past_the_capacity_is_refused():
    cache = KVCache(capacity=4)
    layer = cache.layer(2, None, torch.zeros(1, 1, 1, 2))
    _step(cache, [[4]])
    with pytest.raises(ValueError, match=r"position 4 is past the KV cache's capacity \(4 positions\)"):
        layer.store(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), cache.step)
