"""LoRA under tensor parallelism, on every rank (torchrun): builds the stand-in model
of PLAN_RUN_DIR at its TP size, adds LoRA (non-zero B, so the adapters change the
output), and writes to OUT_DIR/lora_tp{TP}.pt the full logits of a fixed batch with
adapters, after merging them into the base weights, and of the base weights plus
(alpha/r) B A computed here.
  torchrun --nproc_per_node=2 tests/train/lora_script.py PLAN_RUN_DIR OUT_DIR"""

import sys

import torch
import torch.distributed as dist


def main() -> None:
    run_dir, out_dir = sys.argv[1], sys.argv[2]
    from megatron.core import parallel_state as ps

    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.train import megatron_config as mcfg
    from orchestrator.train.lora import apply_lora, lora_parameter_names, merge_lora
    from orchestrator.plan.resolved import Plan
    from tests.train.stand_in import StandInProvider

    plan = Plan.load(run_dir)
    init_distributed(plan.dims, seed=plan.seed)
    provider = StandInProvider(plan.padded_vocab_size, plan.seq_length)
    config = mcfg.transformer_config(plan, on_gpu=False)
    model = provider.build(config, True, True, None)
    names = apply_lora(model, plan.section("lora"), seed=5, b_std=0.05)
    lora_names = lora_parameter_names(model)
    frozen_base = all(not dict(model.named_parameters())[n + ".weight"].requires_grad for n in names)
    tokens = torch.randint(0, plan.padded_vocab_size, (2, plan.seq_length), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(plan.seq_length)[None].expand(2, -1)
    mask = torch.triu(torch.ones(plan.seq_length, plan.seq_length, dtype=torch.bool), diagonal=1)[None, None]
    model.eval()

    def logits():
        with torch.no_grad():
            return model.language_model(tokens, positions, mask, runtime_gather_output=True).float()

    adapted = logits()
    for module in model.modules():  # the same model without the adapters' contribution
        if hasattr(module, "lora_enabled"):
            module.lora_enabled = False
    base = logits()
    # The reference, written here from LoRA's definition: base weights W + (alpha/r) B A
    # (this rank's shards of W and B A), with the plan's alpha and rank.
    lora_cfg = plan.section("lora")
    scale = float(lora_cfg["alpha"]) / int(lora_cfg["rank"])
    params = dict(model.named_parameters())
    originals = {n: params[n + ".weight"].detach().clone() for n in names}
    with torch.no_grad():
        for n in names:
            params[n + ".weight"].add_(scale * params[n + ".lora_b.weight"] @ params[n + ".lora_a.weight"])
    reference = logits()
    with torch.no_grad():
        for n in names:
            params[n + ".weight"].copy_(originals[n])
    for module in model.modules():
        if hasattr(module, "lora_enabled"):
            module.lora_enabled = True
    merged_count = merge_lora(model)
    merged = logits()
    leftover = lora_parameter_names(model)
    if dist.get_rank() == 0:
        torch.save(dict(adapted=adapted, base=base, merged=merged, reference=reference, names=names, lora_names=lora_names,
                        frozen_base=frozen_base, merged_count=merged_count, leftover=leftover,
                        param_names=sorted(n for n, _ in model.named_parameters())),
                   f"{out_dir}/lora_tp{ps.get_tensor_model_parallel_world_size()}.pt")
    shutdown()


if __name__ == "__main__":
    main()
