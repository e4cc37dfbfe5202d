"""Training steps of a decoder through megatron's DDP and pipeline schedule, for tests that
compare gradients and training across layouts and against HF (tests/models/parity_script.py,
family_parity_script.py, training_curve_script.py): the weights loaded at the layout from
the TP=1 state dict, the mean token loss over all but the last column."""

from __future__ import annotations

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed


def decoder_under_ddp(full: dict, shape, dec, tp: int, sp: bool, finalize: bool = True, ddp_config=None,
                      prepare=None, **overrides):
    """The project's decoder at TP `tp` (PP 1) holding `full`'s weights, wrapped in
    megatron's DDP (`ddp_config`, megatron's defaults if None), with finalize_model_grads
    where `finalize`; `overrides` go to the decoder's TransformerConfig. With `prepare`,
    (the DDP model, prepare(decoder)): it runs on the decoder before DDP wraps it."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from orchestrator.models.decoder_config import decoder_transformer_config

    from orchestrator.models.decoder_model import DecoderModel
    from tests.models.sharding import shard_megatron

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(tp=tp), seed=0)
    cfg = decoder_transformer_config(dec, ParallelDims(tp=tp, sp=sp), **overrides)
    model = DecoderModel(cfg, dec.vocab_size, dec.max_position_embeddings, rope_theta=dec.rope_theta,
                        tie_embeddings=dec.tie_embeddings)
    model.load_state_dict(shard_megatron(full, shape, tp, 1)[(ps.get_tensor_model_parallel_rank(), 0)], strict=False)
    prepared = prepare(model) if prepare else None
    model = DistributedDataParallel(config=cfg, ddp_config=ddp_config or DistributedDataParallelConfig(),
                                    module=model)
    cfg.finalize_model_grads_func = finalize_model_grads if finalize else None
    return (model, prepared) if prepare else model


def forward_backward(model, tokens: torch.Tensor) -> float:
    """One forward and backward of `tokens` [b, s] (next-token loss, the mean over all but
    the last column) into the DDP model's zeroed gradient buffers; the loss."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = tokens.shape
    positions = torch.arange(seq)[None].expand(batch, -1)
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)

    losses = []

    def loss_of(token_loss):
        losses.append(token_loss[:, :-1].mean())
        return losses[-1], {}

    def forward_step(data_iterator, module):
        next(data_iterator)
        return module(tokens, positions, None, labels=labels), loss_of

    model.zero_grad_buffer()
    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([None]), model=[model],
                                num_microbatches=1, seq_length=seq, micro_batch_size=batch, forward_only=False)
    return float(losses[0])


def norm_grads_after_one_step(full: dict, shape, dec, tokens: torch.Tensor, tp: int, sp: bool,
                              finalize: bool = True, **overrides):
    """({norm parameter name: main_grad}, the unwrapped model) after one forward and backward
    of `tokens` [b, s] at TP `tp` (PP 1)."""
    model = decoder_under_ddp(full, shape, dec, tp, sp, finalize, **overrides)
    forward_backward(model, tokens)
    grads = {n: p.main_grad.clone() for n, p in model.module.named_parameters() if "layernorm" in n}
    return grads, model.module
