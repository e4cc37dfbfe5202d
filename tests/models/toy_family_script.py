"""A decoder family added by its entries alone: FAMILIES and PROMPTS in
orchestrator/plan/decoder_families.py, the files docs/project.md ("How to add a decoder
family") names for a family whose layer the existing traits describe. Here a toy one
(Llama's layer with Gemma's sandwich norms, Qwen2's q/k/v biases and Qwen3's QK-norm, a mix
no released family has) is planned through compose and resolve, built through the job's
builder and provider, and trains one micro-batch; the built model holds exactly the
parameters the plan's inventory counts. Run by tests/models/test_toy_family.py on one
process."""

import torch

from orchestrator.plan import decoder_families as df

TOY = df.DecoderFamily("toy", "toy_lm", sandwich_norms=True, zero_centered_norm=False, activation="silu",
                       scaled_embeddings=False, sliding_window=False, softcaps=False, query_pre_attn_scalar=False,
                       rope_scaling=None, hf_architecture="ToyForCausalLM", qkv_bias=True, qk_norm=True)


def main():
    df.FAMILIES["toy"] = TOY
    df.PROMPTS["toy"] = df.PROMPTS["qwen2"]
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve, to_object

    composed = compose(["+recipe=tiny_cpu_qwen2", "model.decoder.family=toy", "model.decoder.sliding_window=null",
                        "model.decoder.attn_logit_softcap=null", "model.decoder.final_logit_softcap=null"])
    plan = resolve(composed)
    argv = " ".join(plan.argv)
    assert all(flag in argv for flag in ("--swiglu", "--add-qkv-bias", "--qk-layernorm")), argv
    assert "--apply-layernorm-1p" not in argv and "--window-size" not in argv, argv

    from orchestrator.probe.role import AUDIO_TOKEN_ID, synthetic_microbatch
    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.train import megatron_config as mcfg
    from orchestrator.train.audiollm_provider import AudioLLMProvider

    init_distributed(plan.dims, seed=plan.seed)
    config = mcfg.transformer_config(plan, on_gpu=False)
    assert (config.decoder_family, config.add_qkv_bias, config.qk_layernorm) == ("toy", True, True)
    provider = AudioLLMProvider.with_ids(plan, AUDIO_TOKEN_ID)
    model = provider.build(config, True, True, None)
    names = [name for name, _ in model.named_parameters()]
    for part in ("post_attention_layernorm", "post_mlp_layernorm", "linear_qkv.bias", "q_layernorm", "k_layernorm"):
        assert any(part in name for name in names), part
    built = sum(p.numel() for p in model.parameters())
    planned = sum(sum(entry.values()) for entry in plan.parameters["total"].values())
    assert built == planned, (built, planned)
    batch = synthetic_microbatch(to_object(composed))
    loss = provider.forward(model.train(), batch)
    mask = batch["loss_mask"]
    mean = (loss * mask).sum() / mask.sum()
    mean.backward()
    assert torch.isfinite(mean) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    print(f"RESULT toy family: {built} parameters as planned, loss {mean.item():.3f}")
    shutdown()


if __name__ == "__main__":
    main()
