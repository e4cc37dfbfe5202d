"""Trains a tiny megatron GPTModel (local spec) for a few steps through the CPU
compatibility layer; prints `LOSSES <json>` on global rank 0 and the full logits
checksum. Run: torchrun --nproc_per_node=2 tests/runtime/tp_train_script.py --tp 2"""

import argparse
import json

import torch
import torch.distributed as dist

from orchestrator.runtime import cpu_compat
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    init_distributed(ParallelDims(tp=args.tp), seed=1234)
    assert cpu_compat.is_active()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, tensor_model_parallel_size=args.tp,
        use_cpu_initialization=True, gradient_accumulation_fusion=False, hidden_dropout=0.0,
        attention_dropout=0.0, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=64,
                     max_sequence_length=16)
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=model)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-2, clip_grad=1.0), [model])

    tokens = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]
    positions = torch.arange(16)[None].expand(4, -1)

    def forward_step(data_iterator, module):
        batch = next(data_iterator)
        out = module(batch[:, :-1], positions, mask, labels=batch[:, 1:])
        return out, lambda o: (o.float().mean(), {"loss": o.float().mean().detach()})

    losses = []
    for _ in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        out = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([tokens]), model=model,
            num_microbatches=1, seq_length=16, micro_batch_size=4, forward_only=False,
        )
        optimizer.step()
        losses.append(out[0]["loss"].item())
    if dist.get_rank() == 0:
        print("LOSSES " + json.dumps(losses), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
