"""GPU only: the `te` backend (TransformerEngine linears + flex_attention core attention)
in bf16 against HF Gemma2 in fp32. Prints `RESULT <json>`.
Run: torchrun --nproc_per_node=1 tests/models/gpu_te_script.py"""

import json

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.models.tiny_models import decoder_config, hf_gemma2


def main() -> None:
    init_distributed(ParallelDims(tp=1), seed=0)
    from orchestrator.convert.decoder_mapping import DecoderShape
    from tests.models.sharding import hf_to_megatron_full, shard_megatron
    from orchestrator.models.attention import FlexSoftcapAttention
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel

    hf = hf_gemma2(seed=0).cuda()
    shape = DecoderShape.from_hf_config(hf.config)
    dec = decoder_config(hf.config)
    cfg = decoder_transformer_config(dec, params_dtype=torch.bfloat16)
    model = DecoderModel(cfg, dec.vocab_size, dec.max_position_embeddings, backend="te", attention="flex",
                        rope_theta=dec.rope_theta).cuda().eval()
    assert isinstance(model.decoder.layers[0].self_attention.core_attention, FlexSoftcapAttention)
    weights = shard_megatron(hf_to_megatron_full(hf.state_dict(), shape), shape, 1, 1)[(0, 0)]
    # Every weight loaded: only TransformerEngine's per-module `_extra_state` (FP8 metadata)
    # may be absent from a converted state dict.
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("._extra_state")]
    tokens = torch.randint(0, shape.vocab_size, (2, 64), device="cuda")
    positions = torch.arange(64, device="cuda")[None].expand(2, -1)
    with torch.no_grad():
        ref = hf(tokens).logits
        logits = model(tokens, positions, None)[..., : shape.vocab_size].float()
    # Backward (flex_attention's compiled backward, TE's linears) against HF fp32's: the
    # same loss, gradients of the embedding and the final norm compared in relative norm.
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    loss = model(tokens, positions, None, labels=labels)[:, :-1].float().mean()
    loss.backward()
    hf_logits = hf(tokens).logits[:, :-1].float()
    torch.nn.functional.cross_entropy(hf_logits.flatten(0, 1), labels[:, :-1].flatten()).backward()
    params = dict(model.named_parameters())
    pairs = {"embedding": (params["embedding.word_embeddings.weight"].grad[: shape.vocab_size],
                           hf.model.embed_tokens.weight.grad),
             "final_norm": (params["decoder.final_layernorm.weight"].grad, hf.model.norm.weight.grad)}
    grad_rel = {k: float((a.float() - b).norm() / b.norm()) for k, (a, b) in pairs.items()}
    nonfinite = [n for n, p in params.items() if p.grad is not None and not torch.isfinite(p.grad).all()]
    no_grad = [n for n, p in params.items() if p.requires_grad and p.grad is None]
    print("RESULT " + json.dumps({"max_abs_logit_diff": (logits - ref).abs().max().item(), "missing": missing,
                                  "unexpected": list(unexpected), "grad_rel_diff": grad_rel,
                                  "nonfinite_grads": nonfinite, "no_grad": no_grad}), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
