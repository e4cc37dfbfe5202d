"""The two interfaces the training loop uses, so that the model and the data
pipeline can be swapped without touching the loop.

A ModelProvider builds one model chunk (a megatron module whose parameter names follow
the project's naming contract) and runs its forward on a micro-batch. A BatchSource
yields this data-parallel rank's micro-batches and can save and restore its position.

Micro-batch keys the loop itself reads: `loss_mask` [b, s] (float; 0 where no target)
and `dataset_index` [b, s] (long; index into BatchSource.dataset_names, -1 where no
dataset). Everything else (tokens, labels, position_ids, cu_seqlens, audio features)
is for the provider's forward.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch


class ModelProvider(Protocol):
    def build(self, config, pre_process: bool, post_process: bool, vp_stage: Optional[int],
              decisions) -> torch.nn.Module:
        """One model chunk for this pipeline stage (virtual stage `vp_stage`) from the job's
        one TransformerConfig (`config`: the loop builds it from the Plan), for the
        machine `decisions` describe (orchestrator.runtime.machine.Decisions: GPU or CPU,
        attention kernel)."""

    def forward(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        """On the last pipeline stage the per-token loss [b, s]; elsewhere the stage output."""

    def flop_counter(self, trained: set):
        """`trained`: patterns of the parameter names that train (layer numbers as `*`).
        Returns micro-batch -> {'model', 'hardware' FLOPs, 'tokens' (real), 'slots'}:
        FLOPs counted from what each batch holds (orchestrator.plan.step_flops)."""


class BatchSource(Protocol):
    dataset_names: list

    def next_microbatch(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def merge_states(self, states: list) -> dict:
        """The saved states of every rank of a checkpoint as one state that
        load_state_dict takes on any rank of a job at another parallel layout."""

    def sample_counts(self) -> dict:
        """Counters of the samples read so far, as metric names (e.g. skipped bad
        samples per dataset); {} when there is nothing to count."""
