"""CTC prefix scores (orchestrator/models/ctc_prefix.py) against their definition, summed
over every frame alignment of a small CTC output: the prefix score of g is the
probability that the collapsed labels begin with g, the completion score that they are g."""

import itertools
import math

import torch

from orchestrator.models.ctc_prefix import LOG_ZERO, CTCPrefixScorer

LABELS = 3  # blank is index 3
FRAMES = (5, 4)  # two rows; the second is shorter (its last frame is padding)


def _collapse(path):
    out, prev = [], None
    for symbol in path:
        if symbol != prev and symbol != LABELS:
            out.append(symbol)
        prev = symbol
    return out


def _brute_force(log_probs: torch.Tensor, frames: int):
    """{collapsed label sequence: probability} over every alignment of `frames` frames."""
    sequences = {}
    for path in itertools.product(range(LABELS + 1), repeat=frames):
        p = math.exp(sum(float(log_probs[t, s]) for t, s in enumerate(path)))
        key = tuple(_collapse(path))
        sequences[key] = sequences.get(key, 0.0) + p
    return sequences


def test_prefix_and_completion_scores_equal_the_sums_over_alignments():
    torch.manual_seed(0)
    log_probs = torch.log_softmax(2 * torch.randn(2, max(FRAMES), LABELS + 1, dtype=torch.float64), dim=-1)
    totals = [_brute_force(log_probs[r], FRAMES[r]) for r in range(2)]
    assert all(abs(sum(t.values()) - 1) < 1e-9 for t in totals)
    scorer = CTCPrefixScorer(log_probs, torch.tensor(FRAMES))
    # Row 0 follows 1, 1, 2 (a repeated label needs a blank between); row 1 follows 0, 2, 0.
    paths = [[1, 1, 2], [0, 2, 0]]
    candidates = torch.arange(LABELS + 1).repeat(2, 1)  # every label, and the blank's index (not a label)
    for step in range(3):
        scores, _, _ = extended = scorer.extend(candidates)
        for r in range(2):
            prefix = tuple(paths[r][:step])
            for c in range(LABELS):
                want = sum(p for seq, p in totals[r].items() if seq[:step + 1] == prefix + (c,))
                got = math.exp(float(scores[r, c]))
                assert abs(got - want) < 1e-6, (r, prefix, c, got, want)
            assert float(scores[r, LABELS]) <= LOG_ZERO / 2  # outside the head's labels: probability 0
            complete = math.exp(float(scorer.complete()[r]))
            assert abs(complete - totals[r].get(prefix, 0.0)) < 1e-6, (r, prefix)
        choice = torch.tensor([paths[0][step], paths[1][step]])
        scorer.advance(candidates, choice, extended, keep=torch.tensor([True, True]))
    for r in range(2):
        assert abs(math.exp(float(scorer.complete()[r])) - totals[r].get(tuple(paths[r]), 0.0)) < 1e-6


def test_a_row_that_is_not_advanced_keeps_its_prefix():
    log_probs = torch.log_softmax(torch.randn(2, 4, LABELS + 1), dim=-1)
    scorer = CTCPrefixScorer(log_probs, torch.tensor([4, 4]))
    candidates = torch.tensor([[0, 1], [0, 1]])
    before = scorer.complete().clone()
    scorer.advance(candidates, torch.tensor([1, 1]), scorer.extend(candidates), keep=torch.tensor([True, False]))
    assert scorer.last.tolist() == [1, -1] and scorer.empty.tolist() == [False, True]
    assert float(scorer.complete()[1]) == float(before[1]) and float(scorer.complete()[0]) != float(before[0])
