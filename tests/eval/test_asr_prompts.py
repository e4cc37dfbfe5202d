"""Prompts and clips of each sample, recovered from real collated micro-batches
(packed rows with two samples, and one sample per row)."""

import numpy as np
import pytest

from orchestrator.data.packing import Example, collate
from orchestrator.data.prompts import Tokenized
from orchestrator.eval.asr import prompts_from_batch

AUDIO, PAD = 7, 0


def _example(position, prompt, answer, audio_runs):
    ids = np.asarray(prompt + answer, dtype=np.int64)
    trained = np.zeros(len(ids), dtype=np.float32)
    trained[len(prompt):] = 1.0
    clips = [np.zeros(160 * n, dtype=np.float32) for n in audio_runs]
    return Example(position, 0, Tokenized(ids[:-1], ids[1:], trained[1:], list(audio_runs)), clips)


SAMPLES = [
    ([1, AUDIO, AUDIO, AUDIO, 2], [11, 12, 3]),            # one clip of 3 tokens
    ([1, AUDIO, AUDIO, AUDIO, AUDIO, AUDIO, 2], [13, 3]),   # two clips (3 + 2 tokens, a chunked long clip)
    ([1, AUDIO, AUDIO, 2], [14, 15, 16, 3]),               # one clip of 2 tokens
]
RUNS = [[3], [3, 2], [2]]


@pytest.mark.parametrize("packed", [True, False])
def test_prompts_and_clips_in_token_order(packed):
    examples = [_example(i, p, a, r) for i, ((p, a), r) in enumerate(zip(SAMPLES, RUNS))]
    rows = [examples[:2], examples[2:]] if packed else [[e] for e in examples]
    batch = collate(rows, seq_length=16, pad_id=PAD, pad_multiple=1, dataset_names=["val"], audio_token_id=AUDIO,
                    num_rows=len(rows) + 1, packed=packed)  # one empty row at the end: padding only
    found = prompts_from_batch(batch)
    assert [s["prompt"] for s in found] == [p for p, _ in SAMPLES]
    assert [s["clips"] for s in found] == [[0], [1, 2], [3]]


def test_placeholders_that_split_a_clip_are_refused():
    ex = _example(0, [1, AUDIO, AUDIO, 2], [11, 3], [2])
    batch = collate([[ex]], seq_length=8, pad_id=PAD, pad_multiple=1, dataset_names=["val"], audio_token_id=AUDIO,
                    packed=False)
    batch["audio_num_tokens"][0] = 3
    with pytest.raises(ValueError, match="outnumber|whole clips"):
        prompts_from_batch(batch)
