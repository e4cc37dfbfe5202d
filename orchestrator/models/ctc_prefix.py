"""CTC prefix scores for joint CTC/attention greedy decoding (orchestrator/models/generate.py).

The adapter's CTC head (model.adapter.ctc_weight > 0) gives, for each audio token of a
clip, log-probabilities over the vocabulary plus a blank. The prefix score of a token
sequence g is log P(the clip's transcript begins with g) under CTC: the sum over every
frame alignment whose collapsed labels start with g. Hybrid CTC/attention decoding
(Watanabe et al., 2017, "Hybrid CTC/Attention Architecture for End-to-End Speech
Recognition") adds its gain over the current prefix to the decoder's log-probability of
each candidate token, so the decoder cannot drift off what the audio says: on the demo's
held-out accents the decoder alone sometimes starts a sentence as a digit string ("the
frog ..." -> "zero one ...") and the language prior carries it on, while the CTC head
still hears "the".

One greedy hypothesis per row: `CTCPrefixScorer` keeps, for the row's prefix so far, the
log-probabilities of having emitted it by each frame and ending in a label (r_n) or a
blank (r_b), scores candidate extensions of it, and advances with the chosen one.
"""

from __future__ import annotations

from typing import Tuple

import torch

# Log of zero, finite: sums and logaddexp of it stay finite in fp32 (-inf - -inf is nan).
LOG_ZERO = -1e30


class CTCPrefixScorer:
    """`log_probs` [rows, frames, vocab + 1] (blank last) of each row's clips, `lengths`
    [rows] its frames (0: the row has no CTC scores). The prefix of every row starts empty."""

    def __init__(self, log_probs: torch.Tensor, lengths: torch.Tensor):
        rows, frames, _ = log_probs.shape
        self.x = log_probs.float()
        self.blank = log_probs.shape[-1] - 1
        self.lengths = lengths.to(log_probs.device)
        self.valid = torch.arange(frames, device=log_probs.device)[None] < self.lengths[:, None]  # [rows, frames]
        # The empty prefix: all blanks up to each frame.
        self.r_b = torch.cumsum(torch.where(self.valid, self.x[:, :, self.blank], 0.0), dim=1)
        self.r_n = torch.full((rows, frames), LOG_ZERO, device=log_probs.device)
        self.prefix = torch.zeros(rows, device=log_probs.device)  # log P(prefix ...): 0 for the empty one
        self.last = torch.full((rows,), -1, dtype=torch.long, device=log_probs.device)
        self.empty = torch.ones(rows, dtype=torch.bool, device=log_probs.device)

    def extend(self, candidates: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefix scores of the row's prefix extended by each candidate token ([rows, k]
        ids): ([rows, k] scores, and the states r_n, r_b [rows, k, frames] for `advance`).
        A candidate outside the CTC head's vocabulary scores LOG_ZERO."""
        rows, k = candidates.shape
        frames = self.x.shape[1]
        inside = candidates < self.blank
        x_c = torch.gather(self.x, 2, torch.where(inside, candidates, 0)[:, None, :].expand(rows, frames, k))
        x_c = torch.where(inside[:, None, :], x_c, torch.full_like(x_c, LOG_ZERO)).transpose(1, 2)  # [rows, k, frames]
        x_blank = self.x[:, None, :, self.blank]  # [rows, 1, frames]
        # phi: the prefix has been emitted by frame t and a new label may follow; a repeat
        # of its last label needs a blank in between.
        repeat = (candidates == self.last[:, None])[:, :, None]
        phi = torch.where(repeat, self.r_b[:, None, :], torch.logaddexp(self.r_b, self.r_n)[:, None, :])
        r_n = torch.full((rows, k, frames), LOG_ZERO, device=self.x.device)
        r_b = torch.full((rows, k, frames), LOG_ZERO, device=self.x.device)
        r_n[:, :, 0] = torch.where(self.empty[:, None], x_c[:, :, 0], torch.full_like(x_c[:, :, 0], LOG_ZERO))
        score = r_n[:, :, 0].clone()
        for t in range(1, frames):
            valid = self.valid[:, t, None]
            n = torch.logaddexp(r_n[:, :, t - 1], phi[:, :, t - 1]) + x_c[:, :, t]
            b = torch.logaddexp(r_b[:, :, t - 1], r_n[:, :, t - 1]) + x_blank[:, :, t]
            r_n[:, :, t] = torch.where(valid, n, r_n[:, :, t - 1])
            r_b[:, :, t] = torch.where(valid, b, r_b[:, :, t - 1])
            score = torch.where(valid, torch.logaddexp(score, phi[:, :, t - 1] + x_c[:, :, t]), score)
        return score, r_n, r_b

    def complete(self) -> torch.Tensor:
        """[rows] log P(the transcript is exactly the prefix): what ending the row scores."""
        end = (self.lengths - 1).clamp(min=0)[:, None]
        return torch.logaddexp(self.r_b.gather(1, end), self.r_n.gather(1, end))[:, 0]

    def advance(self, candidates: torch.Tensor, choice: torch.Tensor, extended, keep: torch.Tensor) -> None:
        """Extend the prefix of each row where `keep` by its chosen candidate
        (`candidates[row, choice[row]]`, with `extend`'s output for those candidates)."""
        score, r_n, r_b = extended
        rows = torch.arange(candidates.shape[0], device=candidates.device)
        self.r_n = torch.where(keep[:, None], r_n[rows, choice], self.r_n)
        self.r_b = torch.where(keep[:, None], r_b[rows, choice], self.r_b)
        self.prefix = torch.where(keep, score[rows, choice], self.prefix)
        self.last = torch.where(keep, candidates[rows, choice], self.last)
        self.empty = self.empty & ~keep
