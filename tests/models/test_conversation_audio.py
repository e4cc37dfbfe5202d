"""Conversations reach the model with each audio segment on its own placeholders."""

import json
import re
from pathlib import Path

import pytest

from tests.data.conftest import tokenizer_dir  # noqa: F401 (the fixture)
from tests.distributed_run import torchrun

SCRIPT = Path(__file__).with_name("conversation_audio_script.py")


@pytest.mark.multiprocess
def test_each_segment_of_a_conversation_lands_on_its_own_placeholders(tokenizer_dir):
    """Three conversations in two packed rows (segments before a question, inside one,
    and two segments of one turn in the order the turn lists them): the fused decoder
    input at each segment's placeholders equals that segment encoded alone from its
    column, within the fp32 reordering bound (the batch encodes the clips together; the
    bound is ~2e-3, the errors seen ~3e-6); the segment of another turn on those
    placeholders differs by about 100 times the bound."""
    output = torchrun(SCRIPT, 1, str(tokenizer_dir))
    report = json.loads(re.search(r"^RESULT (.*)$", output, re.M).group(1))
    segments = report["segments"]
    assert len(segments) == 6 and report["placeholders_covered"] == report["placeholders"]
    for seg in segments:
        assert seg["contiguous"] and seg["max_error"] is not None and seg["max_error"] <= seg["atol"], seg
    assert {s["row"] for s in segments} == {0, 1}
    # The turn-order segments of the third conversation are adjacent runs: b, then a.
    third = [s for s in segments if s["row"] == 1]
    assert [s["column"] for s in third] == ["clip_b", "clip_a"] and third[0]["span"][1] + 1 == third[1]["span"][0]
    assert report["swap_error"] > 20 * max(s["atol"] for s in segments)
