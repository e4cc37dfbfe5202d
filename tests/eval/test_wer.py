"""Transcript normalisation and pooled word error rates."""

import pytest

from orchestrator.scoring.text import normalize_transcript
from orchestrator.scoring.wer import wer, word_errors


def test_normalisation():
    assert normalize_transcript("  The  Cat, sees\tthe DOG! ") == "the cat sees the dog"
    assert normalize_transcript("Don't stop-now") == "dont stop now"
    assert normalize_transcript("<end_of_turn>three") == "end of turn three"  # leftovers count as errors
    assert normalize_transcript("３ one") == "3 one"  # NFKC; digits stay digits
    assert normalize_transcript("...") == ""


def test_counts_are_pooled_over_utterances():
    refs = ["one two three four", "the cat"]
    hyps = ["one too three", "the cat sees"]
    counts = word_errors(refs, hyps)
    assert counts == {"substitutions": 1, "deletions": 1, "insertions": 1, "words": 6, "utterances": 2, "errors": 3}
    assert wer(refs, hyps) == pytest.approx(0.5)  # 3 / 6, not the mean of 0.5 and 0.5 by accident:
    assert wer(["a b c d e f g h", "x"], ["a b c d e f g h", "y"]) == pytest.approx(1 / 9)


def test_empty_hypothesis_is_all_deletions_and_empty_reference_is_refused():
    assert word_errors(["one two"], [""])["deletions"] == 2
    assert wer(["one two", "three"], ["", "three"]) == pytest.approx(2 / 3)
    assert wer(["Three, ONE."], ["three one"]) == 0.0
    with pytest.raises(ValueError, match="empty after normalisation"):
        wer(["..."], ["x"])
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        wer(["a", "b"], ["a"])
