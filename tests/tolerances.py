"""Tolerances derived from fp32 arithmetic, not from what one CPU happened to produce.

Two fp32 computations of the same value that differ only in the order of their sums
(other matrix shapes, batch sizes, thread counts, CPUs) can differ by up to about
K * eps * sum(|terms|) per dot product of length K (Higham, Accuracy and Stability of
Numerical Algorithms, 3.1), and such errors add up over the chained operations of a
network. `reorder_tolerance` takes that worst case, with the magnitude of the result
standing for sum(|terms|): a bound any machine meets, and still orders of magnitude
below what a real bug (a wrong mask, a missing scale) changes.
"""

from __future__ import annotations

import torch

FP32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7

# Compiled against eager layers of the tiny model (tests/models/test_compile.py, the
# rehearsal): fp32 results of the same arithmetic in another order (inductor fuses and
# reorders the reductions: norms over 64 hidden values, attention over up to 96 keys, the
# loss over a 250-token vocabulary): each reduction of n terms may differ by up to about n x eps
# (eps = 1.19e-7) relative to its largest term, and a layer's output carries its
# inputs' differences on. 2e-5 of a tensor's largest value is 168 eps: a few hundred-term
# reductions deep; a wrong fusion (a dropped softcap, a norm offset) is orders larger.
FP32_REORDER = 2e-5


def reorder_tolerance(scale: float, reduction: int, depth: int) -> float:
    """Bound on |a - b| for fp32 results of magnitude `scale`, computed by `depth` chained
    reductions of length at most `reduction` in two different orders."""
    return depth * reduction * FP32_EPS * max(float(scale), 1.0)
