"""Forward a (possibly TP/PP-split) megatron model through megatron's pipeline
schedule and collect the last stage's output, gathered over tensor parallelism.
Used by `--verify` and the parity tests; forward only, one micro-batch."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.pipeline_parallel import get_forward_backward_func


def pipeline_forward(model: torch.nn.Module, step: Callable[[torch.nn.Module], torch.Tensor],
                     seq_length: int, micro_batch_size: int, gather_vocab: bool = True) -> Optional[torch.Tensor]:
    """Run `step(model)` on every stage (activations pass between stages by megatron's
    p2p schedule). Returns the last stage's output (vocab-parallel logits gathered
    when `gather_vocab`), or None on other stages."""
    collected = []

    def loss_func(output):
        collected.append(output.detach())
        return output.sum() * 0.0, {}

    def forward_step(data_iterator, module):
        next(data_iterator)
        return step(module), loss_func

    with torch.no_grad():
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([None]), model=[model],
            num_microbatches=1, seq_length=seq_length, micro_batch_size=micro_batch_size,
            forward_only=True,
        )
    if not parallel_state.is_pipeline_last_stage():
        return None
    out = collected[0]
    if gather_vocab and parallel_state.get_tensor_model_parallel_world_size() > 1:
        out = tensor_parallel.gather_from_tensor_model_parallel_region(out)
    return out
