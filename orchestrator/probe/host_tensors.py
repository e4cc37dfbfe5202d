"""Host tensors stay real: an operator whose tensor inputs are all real runs for real, and
so does a random draw from an explicit generator.

The job reads values from its micro-batches on the host (placeholder counts, clip rows,
CTC targets, document masks) before and while the model runs. The micro-batches are
real, so those reads work, as long as FakeTensorMode does not turn the batch's tensors
into fake ones at the first operator: this mode, entered inside it, runs such operators
outside every mode. The job draws its augmentation (SpecAugment masks, adapter dropout)
on the host from each clip's own generator, and reads the draws. Other factory calls (no
tensor input) and anything touching a fake tensor stay fake, so the model's tensors
never get real storage. The real results are still
counted by the memory measurement.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves


class RealOnRealInputs(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled regions run under it (orchestrator/probe/compiled.py)

    def __init__(self, memory):
        super().__init__()
        self.memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        host_draw = any(isinstance(leaf, torch.Generator) for leaf in leaves)
        if (tensors or host_draw) and not any(isinstance(t, FakeTensor) for t in tensors):
            with _disable_current_modes():
                out = func(*args, **kwargs)
            self.memory.count(out)
            return out
        return func(*args, **kwargs)
