"""Long recordings cut and joined (orchestrator/hf_model/longform_audiollm.py, which
`audiollm transcribe` and an exported model's pipeline share): the windows cover the
recording, end in its pauses and overlap by a tenth of a window; the answers join with the
words an overlap repeats said once, a word the cut went through taken whole from the next
answer, and nothing dropped where the answers share nothing."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.hf_model.longform_audiollm import FRAME, merge, windows

RATE, WINDOW = 16000, 5 * 16000


def speech_like(seconds: float, seed: int = 0) -> tuple:
    """Bursts of noise ("words", 0.4-0.9 s) between pauses of 0.2-0.4 s at 1/300 of their
    level; (samples, [(start, end)] of the pauses)."""
    rng = np.random.default_rng(seed)
    parts, pauses, at = [], [], 0
    while at < seconds * RATE:
        word = int(rng.uniform(0.4, 0.9) * RATE)
        pause = int(rng.uniform(0.2, 0.4) * RATE)
        parts += [rng.normal(0, 0.3, word), rng.normal(0, 0.001, pause)]
        pauses.append((at + word, at + word + pause))
        at += word + pause
    return np.concatenate(parts)[:int(seconds * RATE)].astype(np.float32), pauses


@pytest.mark.parametrize("seconds,seed", [(23.0, 0), (61.5, 1), (12.0, 2)])
def test_windows_cover_the_recording_end_in_pauses_and_overlap_by_a_tenth(seconds, seed):
    samples, pauses = speech_like(seconds, seed)
    cut = windows(samples, WINDOW)
    assert cut[0][0] == 0 and cut[-1][1] == len(samples)
    assert all(0 < end - start <= WINDOW for start, end in cut)
    for (_, end), (start, _) in zip(cut, cut[1:]):
        assert end - start == WINDOW // 10  # the overlap
        # the cut: in a pause (in these recordings every search region, the last second, meets one)
        assert any(a + FRAME // 2 <= end <= b - FRAME // 2 for a, b in pauses), (end / RATE, pauses)
    # consecutive windows advance by at least 7/10 of a window: the count is bounded
    assert len(cut) <= int(np.ceil(len(samples) / (0.7 * WINDOW))) + 1


def test_a_recording_within_the_window_is_one_window():
    samples, _ = speech_like(4.0)
    assert windows(samples, WINDOW) == [(0, len(samples))]
    assert windows(np.zeros(WINDOW, np.float32), WINDOW) == [(0, WINDOW)]


def test_silence_throughout_still_advances():
    cut = windows(np.zeros(17 * RATE, np.float32), WINDOW)
    assert cut[-1][1] == 17 * RATE and all(b[0] > a[0] for a, b in zip(cut, cut[1:]))


@pytest.mark.parametrize("answers,joined", [
    # the overlap's words said once, compared without case and punctuation
    (["the cat sat on the", "on the mat, and then", "And then it slept."], "the cat sat on the mat, and then it slept."),
    # the cut went through "five": the next answer's whole word stands for the part
    (["one two three four fi", "four five six seven"], "one two three four five six seven"),
    # a garbled edge word: the longest run the two share joins them, the edge left out
    (["a b c d e f", "x d e f g h"], "a b c d e f g h"),
    # nothing shared: both kept whole (a repeat is possible, a loss is not)
    (["hello world", "completely different text"], "hello world completely different text"),
    # one shared word that only begins the next answer's first: chance, not a repeat
    (["we saw the", "theatre at night"], "we saw the theatre at night"),
    (["just one window"], "just one window"),
    ([], ""),
])
def test_merge_says_the_overlaps_words_once(answers, joined):
    assert merge(answers) == joined
