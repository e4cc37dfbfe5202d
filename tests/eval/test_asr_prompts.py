"""Prompts and clips of each sample, recovered from real collated micro-batches
(packed rows with two samples, and one sample per row), from the batch's answer_starts
and, without them, from the first trained label."""

import numpy as np
import pytest

from orchestrator.data.packing import Example, collate
from orchestrator.data.prompts import Tokenized
from orchestrator.scoring.asr import prompts_from_batch

AUDIO, PAD = 7, 0


def _example(position, prompt, answer, audio_runs):
    return _conversation(position, [(prompt, answer)], audio_runs)


def _conversation(position, turns, audio_runs):
    """(user, answer) turns; every answer is trained."""
    ids, trained = [], []
    for user, answer in turns:
        ids += user + answer
        trained += [0.0] * len(user) + [1.0] * len(answer)
    ids, trained = np.asarray(ids, dtype=np.int64), np.asarray(trained, dtype=np.float32)
    clips = [np.zeros(160 * n, dtype=np.float32) for n in audio_runs]
    return Example(position, 0, Tokenized(ids[:-1], ids[1:], trained[1:], list(audio_runs)), clips)


def _batch(rows, seq_length, answer_starts=None, **kw):
    batch = collate(rows, seq_length=seq_length, pad_id=PAD, dataset_names=["val"],
                    audio_token_id=AUDIO, **kw)
    batch.pop("answer_starts", None)  # the collated ones, where collate makes them, are not under test here
    if answer_starts is not None:
        batch["answer_starts"] = answer_starts
    return batch


SAMPLES = [
    ([1, AUDIO, AUDIO, AUDIO, 2], [11, 12, 3]),            # one clip of 3 tokens
    ([1, AUDIO, AUDIO, AUDIO, AUDIO, AUDIO, 2], [13, 3]),   # two clips (3 + 2 tokens, a chunked long clip)
    ([1, AUDIO, AUDIO, 2], [14, 15, 16, 3]),               # one clip of 2 tokens
]
RUNS = [[3], [3, 2], [2]]


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("packed", [True, False])
def test_prompts_and_clips_in_token_order(packed, explicit):
    examples = [_example(i, p, a, r) for i, ((p, a), r) in enumerate(zip(SAMPLES, RUNS))]
    rows = [examples[:2], examples[2:]] if packed else [[e] for e in examples]
    # one empty row at the end: padding only
    batch = _batch(rows, 16, [len(p) for p, _ in SAMPLES] if explicit else None, num_rows=len(rows) + 1,
                   packed=packed)
    found = prompts_from_batch(batch)
    assert [s["prompt"] for s in found] == [p for p, _ in SAMPLES]
    assert [s["clips"] for s in found] == [[0], [1, 2], [3]]


# A single-turn sample and a two-turn conversation packed in one row, one more sample in
# the next row. The conversation's clips: 2 placeholders in its first user turn, 3 in
# its second; its scored answer is the last one, after both.
SINGLE = ([1, AUDIO, AUDIO, AUDIO, 2], [11, 12, 3])
CHAT = [([1, AUDIO, AUDIO, 2], [21, 3]), ([4, AUDIO, AUDIO, AUDIO, 2], [22, 23, 3])]
NEXT = ([1, AUDIO, AUDIO, 2], [14, 3])


def _chat_batch(answer_starts):
    rows = [[_example(0, *SINGLE, [3]), _conversation(1, CHAT, [2, 3])], [_example(2, *NEXT, [2])]]
    return _batch(rows, 24, answer_starts, packed=True)


def test_answer_starts_prompt_a_conversation_with_every_earlier_turn():
    chat_prompt = CHAT[0][0] + CHAT[0][1] + CHAT[1][0]
    found = prompts_from_batch(_chat_batch([len(SINGLE[0]), len(chat_prompt), len(NEXT[0])]))
    assert [s["prompt"] for s in found] == [SINGLE[0], chat_prompt, NEXT[0]]
    assert [s["clips"] for s in found] == [[0], [1, 2], [3]]


def test_clips_after_the_prompt_are_skipped_and_the_next_samples_line_up():
    # Without answer_starts the first trained label ends the conversation's prompt after
    # its first turn: its second clip is not the prompt's, and the next sample keeps clip 3.
    for answer_starts in (None, [len(SINGLE[0]), len(CHAT[0][0]), len(NEXT[0])]):
        found = prompts_from_batch(_chat_batch(answer_starts))
        assert [s["prompt"] for s in found] == [SINGLE[0], CHAT[0][0], NEXT[0]]
        assert [s["clips"] for s in found] == [[0], [1], [3]]


@pytest.mark.parametrize("answer_starts,error", [
    ([3, 13, 4], "whole clips"),                    # the first prompt ends inside its clip
    ([0, 11, 4], "leaves no prompt"),
    ([5, 14, 4], "outside the sample"),             # the conversation has 13 tokens
    ([5, 11], "more samples than answer_starts"),
    ([5, 11, 4, 4], "4 answer_starts for 3 samples"),
])
def test_bad_answer_starts_are_refused(answer_starts, error):
    with pytest.raises(ValueError, match=error):
        prompts_from_batch(_chat_batch(answer_starts))


def test_placeholders_that_split_a_clip_are_refused():
    batch = _batch([[_example(0, [1, AUDIO, AUDIO, 2], [11, 3], [2])]], 8, packed=False)
    batch["audio_num_tokens"][0] = 3
    with pytest.raises(ValueError, match="outnumber|whole clips"):
        prompts_from_batch(batch)
