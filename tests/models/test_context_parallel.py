"""Context parallelism of the AudioLLM: CP=2 (alone, with TP=2 + sequence parallel, with
PP=2, on the flex_attention path) gives the logits and per-token losses of CP=1 at the
same TP size, on a micro-batch with a sequence four windows long, packed documents and
audio straddling the CP ranks (tests/models/cp_parity_script.py, one 4-process launch);
and at CP 2 (alone and with TP 2 + SP) with each released model's adapter kind.

Bound: 1e-5 (fp32). CP changes no sum the model computes: keys and values are gathered
whole and put back in global order, so every dot product, softmax and norm runs over the
same terms in the same order as at CP=1; only the number of rows per matmul changes.
Compared with CP=1 at the same TP size, since TP does split the row-parallel sums."""

import json
import re
from pathlib import Path

import pytest

from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("cp_parity_script.py")
GOOD = ["cp2", "cp2_tp2_sp", "cp2_pp2", "cp2_flex"]


@pytest.fixture(scope="module")
def cp_results():
    output = torchrun(SCRIPT, 4, timeout=600)
    found = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    by_case = {r["case"]: r for r in found}
    assert len(by_case) == len(found), "a case was reported twice"
    return by_case


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", GOOD)
def test_context_parallel_equals_cp1(cp_results, case):
    r = cp_results[case]
    assert r["max_abs_logit_diff"] <= 1e-5, r
    assert r["max_abs_loss_diff"] <= 1e-5, r
    assert r["max_abs_logit"] > 1.0 and r["max_abs_loss"] > 1.0, r  # not a comparison of zeros


@pytest.mark.multiprocess
def test_rank_zero_gets_the_audio_frames_of_its_chunks(cp_results):
    """CP rank 0 holds slots 0-7 and 24-31 of each 32-token row. Clip 0 (placeholders at
    5-10 of row 0) gives it frames 0-2, clip 2 (20-27 of row 1, global frames 10-17) frames
    14-17; clip 1 (15-18) lies on rank 1 only."""
    r = cp_results["cp2"]
    assert r["rank_frames"] == [0, 1, 2, 14, 15, 16, 17]
    assert r["rank_clips"] == [0, 2]


@pytest.mark.multiprocess
def test_queries_at_contiguous_slots_break_parity(cp_results):
    """The port that assumes each rank holds one contiguous half is caught."""
    assert cp_results["bad_cp2_contiguous_slots"]["max_abs_logit_diff"] > 1e-1


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["voxtral", "qwen2_audio"])
def test_context_parallel_equals_cp1_with_a_released_models_adapter(kind):
    """Each CP rank makes the audio tokens of the clips its chunks hold, by the kind's own
    arithmetic (Voxtral's stack of 4, Qwen2-Audio's pool of 2 after a masked encoder); at
    CP 2, alone and with TP 2 + SP, the logits and losses of CP 1 (the released classes'
    own logits at CP 1: tests/models/test_released_parity.py)."""
    output = torchrun(SCRIPT, 4, kind, timeout=600)
    found = {r["case"]: r for r in map(json.loads, re.findall(r"^RESULT (.*)$", output, re.M))}
    assert sorted(found) == sorted([f"cp2_{kind}", f"cp2_tp2_sp_{kind}"]), output[-3000:]
    for case, r in found.items():
        assert r["max_abs_logit_diff"] <= 1e-5 and r["max_abs_loss_diff"] <= 1e-5, (case, r)
        assert r["max_abs_logit"] > 1.0 and r["max_abs_loss"] > 1.0, (case, r)
        assert r["adapter"] == {"voxtral": "StackProjector", "qwen2_audio": "PoolProjector"}[kind], (case, r)
        assert len(r["rank_clips"]) >= 1, (case, r)
