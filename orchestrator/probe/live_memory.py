"""Live tensor storage by category, and its peak: the probe's memory measurement.

A dispatch mode sees every tensor an operator returns; each new storage is counted
under the phase it appeared in until it is freed (a weak reference's callback). The
storages that exist after set-up are then sorted by what holds them: the parameters'
(weights), the gradient buffers' (grads), the rest (the optimizer's fp32 master copies).
What appears later is counted by phase: forward (activations: what the forward keeps
for the backward, and the stage's output), backward (temporaries: gradients of
activations, the recomputed forward, work buffers), optimizer (its state, created at the
first step, and the step's own temporaries).

Counted bytes are the storages' sizes, as an allocator would be asked for them;
allocator rounding and fragmentation, the CUDA context and communication buffers are
not tensors and are not counted (the plan's margin covers them).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("weights", "grads", "optimizer", "activations", "temporaries")
_PHASE_CATEGORY = {"forward": "activations", "backward": "temporaries", "optimizer": "optimizer"}


class LiveMemory(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled regions run under it (orchestrator/probe/compiled.py)

    def __init__(self):
        super().__init__()
        self.phase = "setup"
        self.where = ""  # the module running now (forward), for the activations' breakdown
        self._storages: dict[int, list] = {}  # id(storage) -> [weakref, category, bytes, where]
        self.live: dict[str, int] = defaultdict(int)
        self.live_where: dict[str, int] = defaultdict(int)  # activations by module
        self.where_at_peak: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self._paused = 0

    # ---- counting -------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out if self._paused else self.count(out)

    @contextlib.contextmanager
    def paused(self):
        """Operators run uncounted (a compiled graph's insides: orchestrator/probe/compiled.py)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def count(self, out):
        """Counts the storages of an operator's outputs under the current phase."""
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf, _PHASE_CATEGORY.get(self.phase, "setup"))
        return out

    def add(self, tensor: torch.Tensor, category: str) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._storages:
            return
        size = storage.nbytes()
        where = self.where if category == "activations" else ""
        self._storages[key] = [weakref.ref(storage, lambda _ref, key=key: self._freed(key)), category, size, where]
        self.live[category] += size
        if where:
            self.live_where[where] += size
        self.total += size
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.live)
            self.where_at_peak = dict(self.live_where)

    def _freed(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None:
            self.live[entry[1]] -= entry[2]
            if entry[3]:
                self.live_where[entry[3]] -= entry[2]
            self.total -= entry[2]

    # ---- set-up ---------------------------------------------------------------------------
    def sort_setup(self, weights: Iterable[torch.Tensor], grads: Iterable[torch.Tensor]) -> None:
        """After set-up: storages of `weights` and `grads` (and any tensor made outside this
        mode, counted now) are weights and grads; the rest of set-up's is the optimizer's."""
        for category, tensors in (("weights", weights), ("grads", grads)):
            for tensor in tensors:
                self.add(tensor, category)
                entry = self._storages[id(tensor.untyped_storage())]
                self._move(entry, category)
        for entry in self._storages.values():
            if entry[1] == "setup":
                self._move(entry, "optimizer")
        self.reset_peak()

    def _move(self, entry: list, category: str) -> None:
        self.live[entry[1]] -= entry[2]
        self.live[category] += entry[2]
        entry[1] = category

    def reset_peak(self) -> None:
        self.peak = self.total
        self.at_peak = dict(self.live)
        self.where_at_peak = dict(self.live_where)

    def snapshot(self) -> dict:
        """Bytes by category now and at the peak since the last reset, and the activations
        at the peak by the module whose forward made them."""
        return {"peak": self.peak, "peak_by_category": {c: self.at_peak.get(c, 0) for c in CATEGORIES},
                "now_by_category": {c: self.live.get(c, 0) for c in CATEGORIES},
                "peak_activations_by_module": {k: v for k, v in sorted(self.where_at_peak.items(),
                                                                       key=lambda kv: -kv[1]) if v}}
