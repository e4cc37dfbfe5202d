"""Parity of the project's decoder of each family beside Gemma2 with its HF model (CPU,
fp32), several layouts and the known porting mistakes, in one process launch:

- llama: megatron (the project's layer with no post-norms, Llama's RMSNorm, SwiGLU, an
  untied output layer, RoPE with Llama 3's scaling) vs HF LlamaForCausalLM (eager);
- qwen2: that layer with q/k/v biases, tied embeddings, vs HF Qwen2ForCausalLM;
- qwen3: that layer with QK-norm and head_dim wider than hidden / heads, vs Qwen3ForCausalLM;
- gemma3: Gemma2's layer with zero-centred QK-norm, one global layer in six, two RoPE
  bases (linear scaling on the global one), no softcaps, vs HF Gemma3ForCausalLM;
- context parallelism (CP=2): each rank runs its two load-balanced chunks of the rows
  (megatron's layout, which RoPE and the attention's K/V gather follow), the outputs are
  put back in row order and compared with HF's;
- qwen3's QK-norm gradients at TP=2, with and without sequence parallelism, equal TP=1's
  after megatron's finalize_model_grads (each rank's norms see only its heads: the
  config's qk_layernorm has them summed over TP); without qk_layernorm they stay partial;
- gemma3's greedy decoding through the KV cache (each layer type rotating with its own
  RoPE, the sliding layers' ring cache) and without it equals HF `generate`'s;
- the AudioLLM with each decoder: the plan's parameter inventory equals the built model's.

Prints one `RESULT <json>` line per case from the rank holding the full logits.
Run: torchrun --nproc_per_node=2 tests/models/family_parity_script.py"""

from __future__ import annotations

import json

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.models.parity_batch import parity_batch
from tests.models.tiny_models import HF_DECODERS

# 64 positions: Llama 3's scaling moves the frequencies whose wavelength passes 2048
# tokens, which turn a visible angle only over some dozens of positions.
SEQ, BATCH, DOCS = 64, 2, (29, 35)


def cases():
    from orchestrator.models.decoder_config import gelu_tanh

    good = [dict(name="llama_tp1"), dict(name="llama_tp2_sp", tp=2, sp=True), dict(name="llama_pp2", pp=2),
            dict(name="llama_packed_tp2_sp", tp=2, sp=True, packed=True),
            dict(name="llama_flex_tp1", attention="flex"), dict(name="llama_cp2", cp=2),
            dict(name="qwen2_tp1"), dict(name="qwen2_tp2_sp", tp=2, sp=True), dict(name="qwen2_pp2", pp=2),
            dict(name="qwen2_cp2", cp=2),
            dict(name="qwen3_tp1"), dict(name="qwen3_tp2_sp", tp=2, sp=True), dict(name="qwen3_pp2", pp=2),
            dict(name="qwen3_packed_tp2_sp", tp=2, sp=True, packed=True), dict(name="qwen3_cp2", cp=2),
            dict(name="gemma3_tp1"), dict(name="gemma3_tp2_sp", tp=2, sp=True), dict(name="gemma3_pp2", pp=2),
            dict(name="gemma3_cp2", cp=2), dict(name="gemma3_packed_tp2_sp", tp=2, sp=True, packed=True),
            dict(name="gemma3_flex_tp1", attention="flex")]
    # Each family's porting mistakes: Gemma's norm, activation, no RoPE scaling; a Llama layer
    # (the q/k/v biases or the QK-norm left out); q_norm and k_norm loaded into each other.
    bad = [dict(name="llama_bad_zero_centered_norm", weights="norm_offset"),
           dict(name="llama_bad_geglu", overrides={"activation_func": gelu_tanh}),
           dict(name="llama_bad_no_rope_scaling", overrides={"rope_scaling_factor": None}),
           dict(name="qwen2_bad_no_qkv_bias", weights="drop_bias",
                overrides={"decoder_family": "llama", "add_qkv_bias": False}),
           dict(name="qwen3_bad_no_qk_norm", weights="drop_qk_norm",
                overrides={"decoder_family": "llama", "qk_layernorm": False}),
           dict(name="qwen3_bad_q_and_k_norms_swapped", weights="swap_qk_norm"),
           # CP ranks given contiguous halves of the rows: RoPE and the attention's K/V
           # gather place them in the load-balanced chunks they do not hold.
           dict(name="qwen3_bad_cp2_contiguous_halves", cp=2, slots="contiguous"),
           # Gemma 3: one RoPE for every layer; Gemma2's window on every other layer; the
           # global RoPE without its linear scaling
           dict(name="gemma3_bad_one_rope", overrides={"rope_local_theta": None}),
           dict(name="gemma3_bad_window_every_other_layer", overrides={"window_pattern": 2}),
           dict(name="gemma3_bad_no_rope_scaling", overrides={"rope_scaling_factor": None})]
    return good + bad


def altered(weights: dict, how) -> dict:
    """The megatron weights with a case's porting mistake."""
    if how is None:
        return dict(weights)
    if how == "norm_offset":  # Gemma's (1 + w) norm on plain-norm weights
        return {k: (v - 1.0 if "norm" in k else v) for k, v in weights.items()}
    if how == "drop_bias":
        return {k: v for k, v in weights.items() if not k.endswith(".bias")}
    if how == "drop_qk_norm":
        return {k: v for k, v in weights.items() if "q_layernorm" not in k and "k_layernorm" not in k}
    if how == "swap_qk_norm":
        swap = {"q_layernorm": "k_layernorm", "k_layernorm": "q_layernorm"}
        return {next((k.replace(a, b) for a, b in swap.items() if a in k), k): v for k, v in weights.items()}
    raise ValueError(how)


def main() -> None:
    from megatron.core import parallel_state as ps

    from tests.models.hf_reference import hf_reference
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel
    from orchestrator.models.norms import RMSNorm, ZeroCenteredRMSNorm
    from orchestrator.plan.decoder_families import FAMILIES
    from tests.models.sharding import shard_megatron

    references = {family: hf_reference(make(seed=0), BATCH, SEQ, DOCS) for family, make in HF_DECODERS.items()}

    for case in cases():
        family = case["name"].split("_")[0]
        r = references[family]
        shape, dec = r["shape"], r["dec"]
        tp, pp, cp = case.get("tp", 1), case.get("pp", 1), case.get("cp", 1)
        sp, packed = case.get("sp", False), case.get("packed", False)
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelDims(tp=tp, pp=pp, cp=cp), seed=0)
        cfg = decoder_transformer_config(dec, ParallelDims(tp=tp, pp=pp, cp=cp, sp=sp), **case.get("overrides", {}))
        model = DecoderModel(cfg, dec.vocab_size, dec.max_position_embeddings,
                            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                            rope_theta=dec.rope_theta, tie_embeddings=dec.tie_embeddings,
                            attention=case.get("attention", "reference")).eval()
        layer = model.decoder.layers[0]
        norm = ZeroCenteredRMSNorm if FAMILIES[family].zero_centered_norm else RMSNorm
        assert isinstance(layer.input_layernorm, norm) and isinstance(layer.pre_mlp_layernorm, norm)
        weights = altered(r["full"], case.get("weights"))
        shard = shard_megatron(weights, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(),
                                                        ps.get_pipeline_model_parallel_rank())]
        missing, unexpected = model.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        assert not missing and not unexpected, (missing, unexpected)
        toks, psp, positions, labels, loss_mask = parity_batch(r["tokens"], r["packed_tokens"], r["docs"], DOCS,
                                                                packed)
        ref_logits, ref_loss = r["packed_ref" if packed else "ref"]
        logits, token_loss = run(model, toks, positions, labels, psp, case.get("slots", "load_balanced"))
        if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0 \
                and ps.get_context_parallel_rank() == 0:
            logits = logits[..., : shape.vocab_size]
            loss = (token_loss * loss_mask).sum() / loss_mask.sum()
            print("RESULT " + json.dumps({
                "case": case["name"], "max_abs_logit_diff": (logits - ref_logits).abs().max().item(),
                "loss_diff": abs(loss.item() - ref_loss.item()), "loss": loss.item(),
                "logit_scale": ref_logits.abs().max().item()}), flush=True)
    qk_norm_grad_cases(references["qwen3"])
    decode_check("gemma3")
    for family, r in references.items():
        inventory_check(family, r["hf"])
    shutdown()


def decode_check(family: str) -> None:
    """Greedy continuations of text prompts longer than the window (the AudioLLM with this
    decoder, TP=1) with and without the KV cache, against HF generate's (left padded);
    then, the known mistake, through the cache with one RoPE for every layer. The token
    embeddings are drawn small, so that the random model's next token follows its context
    (at tiny_models' spread a row repeats one token)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.generate import greedy_generate
    from tests.models.sharding import shard_megatron
    from tests.models.tiny_models import tiny_model_config, whisper_config

    from orchestrator.convert.decoder_mapping import DecoderShape
    from orchestrator.models.attention import CoreAttentionBase
    from tests.models.sharding import hf_to_megatron_full

    hf = HF_DECODERS[family](seed=3)
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(0.3)
    shape = DecoderShape.from_hf_config(hf.config)
    full = hf_to_megatron_full(hf.state_dict(), shape)
    new = 12
    STOP = 1  # noqa: N806 (a row ends at it on both sides)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(10, 240, (n,), generator=gen).tolist() for n in (13, 10, 17)]
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                          eos_token_id=STOP, output_scores=True, return_dict_in_generate=True)
    expected = [row[:row.index(STOP)] if STOP in row else row for row in out.sequences[:, width:].tolist()]
    top2 = torch.stack(out.scores).topk(2, dim=-1).values
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(), seed=0)
    cfg = tiny_model_config(hf.config, whisper_config())
    model = build_audiollm(cfg, decoder_transformer_config(cfg.decoder, ParallelDims()), audio_token_id=5)
    state = {"language_model." + k: v for k, v in shard_megatron(full, shape, 1, 1)[(0, 0)].items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith("language_model.")
                                   and not k.endswith("_extra_state")], (missing, unexpected)
    answers = {cached: greedy_generate(model, prompts, None, None, stop_ids=[STOP], max_new_tokens=new,
                                       use_cache=cached) for cached in (True, False)}
    for attention in model.modules():
        if isinstance(attention, CoreAttentionBase):
            attention.local_rope = False
    one_rope = greedy_generate(model, prompts, None, None, stop_ids=[STOP], max_new_tokens=new)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"case": f"{family}_decode", "hf": expected, "cached": answers[True],
                                      "uncached": answers[False], "bad_cached_one_rope": one_rope,
                                      "min_margin": float((top2[..., 0] - top2[..., 1]).min())}), flush=True)


def qk_norm_grad_cases(r) -> None:
    """The norms' weight gradients of a training step through megatron DDP and
    finalize_model_grads at TP=2 (+SP) against TP=1 (every norm, the QK-norms included)."""
    import torch.distributed as dist

    from tests.models.norm_grads import norm_grads_after_one_step

    reference = {}
    for name, tp, sp, overrides in [("qwen3_grad_tp1", 1, False, {}), ("qwen3_grad_tp2", 2, False, {}),
                                    ("qwen3_grad_tp2_sp", 2, True, {}),
                                    ("qwen3_bad_grad_tp2_without_qk_layernorm", 2, False, {"qk_layernorm": False})]:
        grads, _ = norm_grads_after_one_step(r["full"], r["shape"], r["dec"], r["tokens"], tp, sp, **overrides)
        if tp == 1:
            reference = grads
            continue
        assert sorted(grads) == sorted(reference) and any("q_layernorm" in n for n in grads)
        if dist.get_rank() == 0:
            qk = [n for n in grads if "q_layernorm" in n or "k_layernorm" in n]
            print("RESULT " + json.dumps({
                "case": name, "max_abs_grad_diff": max((grads[n] - reference[n]).abs().max().item() for n in grads),
                "max_abs_qk_grad_diff": max((grads[n] - reference[n]).abs().max().item() for n in qk),
                "max_abs_grad": max(g.abs().max().item() for g in reference.values())}), flush=True)


def run(model, tokens, positions, labels, packed_seq_params, slot_layout: str):
    """(logits [b, s, v], per-token loss [b, s]) of the whole rows on the last stage, else
    (None, None). Under context parallelism this rank runs its chunks of the rows (slots
    `rank_slots`, or with `slot_layout` "contiguous" the mistaken contiguous share) and the
    CP group's outputs are all-gathered into row order."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.data.context_parallel import rank_slots

    cp = ps.get_context_parallel_world_size()
    local = tokens.shape[1] // cp

    def slots_of(rank):
        return torch.arange(rank * local, (rank + 1) * local) if slot_layout == "contiguous" else \
            rank_slots(local, cp, rank)

    slots = slots_of(ps.get_context_parallel_rank()) if cp > 1 else None
    if slots is not None:
        tokens, positions, labels = tokens[:, slots], positions[:, slots], labels[:, slots]
    logits = pipeline_forward(model, lambda m: m(tokens, positions, None, packed_seq_params=packed_seq_params),
                              tokens.shape[1], tokens.shape[0])
    token_loss = pipeline_forward(model, lambda m: m(tokens, positions, None, labels=labels,
                                                     packed_seq_params=packed_seq_params),
                                  tokens.shape[1], tokens.shape[0], gather_vocab=False)
    if logits is None or slots is None:
        return logits, token_loss
    group = ps.get_context_parallel_group()
    all_slots = torch.cat([slots_of(rank) for rank in range(cp)])
    out = []
    for local in (logits, token_loss):
        parts = [torch.empty_like(local) for _ in range(cp)]
        dist.all_gather(parts, local.contiguous(), group=group)
        whole = torch.empty(local.shape[0], all_slots.numel(), *local.shape[2:], dtype=local.dtype)
        whole[:, all_slots] = torch.cat(parts, dim=1)
        out.append(whole)
    return tuple(out)


def inventory_check(family: str, hf) -> None:
    """The AudioLLM with this decoder builds, and orchestrator.plan.model_params' analytic
    inventory equals its parameters (names, full shapes, requires_grad) at TP=1, PP=1."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.plan.model_params import parameter_inventory
    from orchestrator.plan.schema.lora import LoraConfig
    from tests.models.tiny_models import tiny_model_config, whisper_config

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(tp=1, pp=1), seed=0)
    cfg = tiny_model_config(hf.config, whisper_config())
    model = build_audiollm(cfg, decoder_transformer_config(cfg.decoder, ParallelDims(tp=1, pp=1)), audio_token_id=5)
    real = [(n, list(p.shape), p.requires_grad) for n, p in model.named_parameters()]
    analytic = [(i.name, list(i.shape), i.trainable) for i in parameter_inventory(cfg, LoraConfig(), tp=1)]
    if dist.get_rank() == 0:
        print("INVENTORY " + json.dumps({"family": family, "real": sorted(real), "analytic": sorted(analytic)}),
              flush=True)


if __name__ == "__main__":
    main()
