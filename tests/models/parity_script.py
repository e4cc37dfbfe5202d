"""Parity of our megatron models with plain HF references (CPU, fp32), several parallel
layouts and deliberately wrong variants in one process launch:

- Gemma2 decoder vs HF Gemma2ForCausalLM (eager) on the same weights;
- AudioLLM vs a reference assembled from HF modules: HF WhisperEncoder -> the adapter
  math written out here -> HF Gemma2 with inputs_embeds.

Prints one `RESULT <json>` line per case from the rank holding the full logits.
Run: torchrun --nproc_per_node=2 tests/models/parity_script.py"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.models.parity_batch import parity_batch
from tests.models.tiny_models import hf_gemma2

SEQ, BATCH, DOCS = 24, 2, (11, 13)  # longer than the window (8)


def cases():
    good = [dict(name="tp1"), dict(name="tp2", tp=2), dict(name="pp2", pp=2), dict(name="tp2_sp", tp=2, sp=True),
            dict(name="packed_tp1", packed=True), dict(name="packed_tp2_sp", tp=2, sp=True, packed=True),
            # the GPU attention path (flex_attention) runs its forward eagerly on CPU too
            dict(name="flex_tp1", attention="flex"), dict(name="flex_packed_tp2", tp=2, packed=True, attention="flex")]
    bad = [dict(name="bad_norm_offset", weights="norm_offset"),
           dict(name="bad_window_parity", attention="inverted_parity"),
           dict(name="bad_window_off_by_one", overrides={"sliding_window": 9}),
           dict(name="bad_swiglu", overrides={"activation_func": F.silu}),
           dict(name="bad_no_attn_softcap", overrides={"attn_logit_softcapping": None}),
           dict(name="bad_no_final_softcap", overrides={"final_logit_softcapping": None})]
    return good + bad


def main() -> None:
    from megatron.core import parallel_state as ps

    from tests.models.hf_reference import hf_reference
    from tests.models.sharding import shard_megatron
    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.attention import FlexSoftcapAttention, SoftcapDotProductAttention
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel

    class InvertedParityAttention(SoftcapDotProductAttention):
        """The known porting mistake: windows on odd layers instead of even ones."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.window = None if self.window else config.sliding_window

    hf = hf_gemma2(seed=0)
    r = hf_reference(hf, BATCH, SEQ, DOCS)
    shape, dec, full, tokens, packed_tokens, docs = (r[k] for k in ("shape", "dec", "full", "tokens", "packed_tokens",
                                                                     "docs"))

    for case in cases():
        tp, pp, sp, packed = case.get("tp", 1), case.get("pp", 1), case.get("sp", False), case.get("packed", False)
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelDims(tp=tp, pp=pp), seed=0)
        cfg = decoder_transformer_config(dec, ParallelDims(tp=tp, pp=pp, sp=sp), **case.get("overrides", {}))
        model = DecoderModel(
            cfg, dec.vocab_size, dec.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            rope_theta=dec.rope_theta,
            attention="flex" if case.get("attention") == "flex" else "reference",
            core_attention=InvertedParityAttention if case.get("attention") == "inverted_parity" else None,
        ).eval()
        if case.get("attention") == "flex":
            assert isinstance(model.decoder.layers[0].self_attention.core_attention, FlexSoftcapAttention)
        weights = dict(full)
        if case.get("weights") == "norm_offset":  # model computing x*w: same as 1+w with w-1 stored
            weights = {k: (v - 1.0 if "norm" in k else v) for k, v in weights.items()}
        shard = shard_megatron(weights, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank())]
        missing, unexpected = model.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        assert not missing and not unexpected, (missing, unexpected)

        toks, psp, positions, labels, loss_mask = parity_batch(tokens, packed_tokens, docs, DOCS, packed)
        ref_logits, ref_loss = r["packed_ref" if packed else "ref"]

        logits = pipeline_forward(model, lambda m: m(toks, positions, None, packed_seq_params=psp),
                                  toks.shape[1], toks.shape[0])
        token_loss = pipeline_forward(model, lambda m: m(toks, positions, None, labels=labels, packed_seq_params=psp),
                                      toks.shape[1], toks.shape[0], gather_vocab=False)
        if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            logits = logits[..., : shape.vocab_size]
            loss = (token_loss * loss_mask).sum() / loss_mask.sum()
            print("RESULT " + json.dumps({
                "case": case["name"], "tp": tp, "pp": pp, "sp": sp, "packed": packed,
                "max_abs_logit_diff": (logits - ref_logits).abs().max().item(),
                "loss_diff": abs(loss.item() - ref_loss.item()), "loss": loss.item(),
            }), flush=True)
    device_draws_check(shape, dec)
    norm_grad_cases(shape, full, dec, tokens)
    recompute_check(shape, full, dec, tokens)
    audiollm_cases(hf, shape, full)
    inventory_check(hf)
    load_checkpoint_check(hf)
    shutdown()


def device_draws_check(shape, dec) -> None:
    """The decoder's random draws made on a device (orchestrator.models.device_draws; the
    CPU stands in for the GPU here: the same code with a cuda device) give the same weights
    at TP=1 and TP=2, drawn by the device generator (not the host's draws)."""
    from megatron.core import parallel_state as ps

    from orchestrator.models.device_draws import draw_on_device
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel
    from tests.models.sharding import shard_megatron

    def build(tp: int, on_device: bool) -> dict:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelDims(tp=tp), seed=0)
        cfg = decoder_transformer_config(dec, ParallelDims(tp=tp))
        if on_device:
            draw_on_device(cfg, torch.device("cpu"))
        model = DecoderModel(cfg, dec.vocab_size, dec.max_position_embeddings, rope_theta=dec.rope_theta)
        return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}

    tp1, host, tp2 = build(1, True), build(1, False), build(2, True)
    expected = shard_megatron(tp1, shape, 2, 1)[(ps.get_tensor_model_parallel_rank(), 0)]
    drawn = [k for k in tp1 if "norm" not in k]  # the norms start at zero (Gemma's 1 + w), not drawn
    mismatched = [k for k, v in expected.items() if not torch.equal(tp2[k], v)]
    sums = {k: tp1[k].double().sum().item() for k in drawn}  # TP=1 on every rank: the same weights
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (mismatched, sums))
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps({
            "case": "device_draws_tp2", "compared": len(expected), "mismatched": [m for m, _ in gathered],
            "ranks_agree": all(s == gathered[0][1] for _, s in gathered), "drawn": len(drawn),
            "as_host": [k for k in drawn if torch.equal(tp1[k], host[k])],
            "std": {k: tp1[k].std().item() for k in drawn}}), flush=True)


def norm_grad_cases(shape, full, dec, tokens) -> None:
    """Norm-weight gradients under TP=2 + sequence parallel equal TP=1's, through megatron
    DDP and its finalize_model_grads (which sums the sequence_parallel-tagged norm grads
    over TP); without that step they are partial sums."""
    import torch.distributed as dist

    from tests.models.norm_grads import norm_grads_after_one_step

    grads = {}
    for name, tp, sp, finalize in [("grad_tp1", 1, False, True), ("grad_tp2_sp", 2, True, True),
                                   ("bad_grad_tp2_sp_without_finalize", 2, True, False)]:
        norm_grads, model = norm_grads_after_one_step(full, shape, dec, tokens, tp, sp, finalize)
        assert all(getattr(p, "sequence_parallel", None) is sp
                   for n, p in model.named_parameters() if "layernorm" in n)
        if name == "grad_tp1":
            grads = norm_grads
            continue
        if dist.get_rank() == 0:
            diff = max((norm_grads[n] - grads[n]).abs().max().item() for n in grads)
            scale = max(g.abs().max().item() for g in grads.values())
            print("RESULT " + json.dumps({"case": name, "tp": tp, "pp": 1, "sp": sp, "packed": False,
                                          "max_abs_grad_diff": diff, "max_abs_grad": scale}), flush=True)


def recompute_check(shape, full, dec, tokens) -> None:
    """Full (uniform, 1 layer) and selective (core attention) recomputation through the
    Gemma2 layer give the gradients of no recomputation, and really recompute: the
    first layer (full) or its core attention (selective) runs again in the backward."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from tests.models.sharding import shard_megatron
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(tp=1), seed=0)
    positions = torch.arange(SEQ)[None].expand(BATCH, -1)
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    grads, calls = {}, {}
    for name, kw in [("none", {}),
                     ("full", dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
                     ("selective", dict(recompute_granularity="selective", recompute_modules=["core_attn"]))]:
        model = DecoderModel(decoder_transformer_config(dec, **kw), dec.vocab_size, dec.max_position_embeddings,
                            rope_theta=dec.rope_theta).train()
        model.load_state_dict(shard_megatron(full, shape, 1, 1)[(0, 0)], strict=False)
        # Forward calls of the first layer and of its core attention, over forward and
        # backward: recomputation shows as a second call.
        layer = model.decoder.layers[0]
        for module, key in [(layer, f"{name}_layer_calls"), (layer.self_attention.core_attention, f"{name}_attention_calls")]:
            calls[key] = 0
            module.register_forward_hook(lambda *_, key=key: calls.__setitem__(key, calls[key] + 1))
        model(tokens, positions, None, labels=labels)[:, :-1].mean().backward()
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"case": "recompute", "full_vs_none": (grads["full"] - grads["none"]).abs().max().item(),
                                      "selective_vs_none": (grads["selective"] - grads["none"]).abs().max().item(),
                                      "grad_scale": grads["none"].abs().max().item(), **calls}), flush=True)


AUDIO_TOKEN = 249  # last id of the tiny vocabulary (250)
MEL_FRAMES, MEL_LENGTHS = 80, (80, 67)  # shorter than the encoder window (100): padded


def reference_adapter(states, weights, lengths, frame_stack=5):
    """The adapter written out with plain torch ops, independently of AudioAdapter."""
    mix = torch.softmax(weights["adapter.layer_weights"], 0)
    x = sum(mix[i] * s for i, s in enumerate(states))
    x = F.layer_norm(x, x.shape[-1:], weights["adapter.norm.weight"], weights["adapter.norm.bias"], 1e-5)
    rows = []
    for i, n in enumerate(lengths):
        tokens = ((n - 1) // 2 + 1) // frame_stack
        rows.append(x[i, : tokens * frame_stack].reshape(tokens, -1))
    y = F.linear(torch.cat(rows), weights["adapter.linear_1.weight"], weights["adapter.linear_1.bias"])
    return F.linear(F.silu(y), weights["adapter.linear_2.weight"], weights["adapter.linear_2.bias"])


def audiollm_cases(hf, shape, full) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.packed_seq_params import PackedSeqParams
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from tests.models.sharding import shard_megatron
    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.audiollm import AudioLLM, build_audiollm
    from orchestrator.models.fusion import fuse_audio
    from orchestrator.models.decoder_config import decoder_transformer_config
    from tests.models.tiny_models import random_adapter_weights, randomize, tiny_model_config, whisper_config

    class ScaleBeforeFusion(AudioLLM):
        """The known mistake: embeddings scaled before the audio is scattered in."""

        def embed(self, input_ids, audio_features=None, audio_lengths=None, audio_clip_rows=None,
                  audio_frame_index=None, audio_seeds=None):
            lm = self.language_model
            emb = lm.embed_tokens(input_ids)
            emb = emb * torch.tensor(lm.config.hidden_size**0.5, dtype=emb.dtype)
            audio = self.audio_embeddings(audio_features, audio_lengths)
            per_clip = [self.adapter_tokens(n) for n in audio_lengths]
            emb = fuse_audio(emb, input_ids, audio, self.audio_token_id)
            return emb.transpose(0, 1).contiguous(), audio, per_clip

    wcfg = whisper_config()
    model_cfg = tiny_model_config(hf.config, wcfg)
    hf_encoder = randomize(WhisperEncoder(wcfg), seed=2).eval()
    gen = torch.Generator().manual_seed(3)
    adapter_weights = random_adapter_weights(wcfg, shape.hidden_size, gen)
    features = torch.randn(2, wcfg.num_mel_bins, MEL_FRAMES, generator=gen)
    tokens = torch.randint(0, AUDIO_TOKEN, (2, SEQ), generator=gen)
    counts = [((n - 1) // 2 + 1) // 5 for n in MEL_LENGTHS]
    tokens[0, 2: 2 + counts[0]] = AUDIO_TOKEN
    tokens[1, 5: 5 + counts[1]] = AUDIO_TOKEN
    with torch.no_grad():
        window = 2 * wcfg.max_source_positions
        padded = F.pad(features, (0, window - MEL_FRAMES))
        states = hf_encoder(padded, output_hidden_states=True).hidden_states[1:]
        audio = reference_adapter(states, adapter_weights, MEL_LENGTHS)
        embeds = hf.model.embed_tokens(tokens)
        embeds[tokens == AUDIO_TOKEN] = audio
        ref = hf(inputs_embeds=embeds, labels=tokens)

    encoder_weights = {"encoder." + k: v for k, v in hf_encoder.state_dict().items()}
    for name, tp, pp, sp, cls, packed in [
            ("audiollm_tp1", 1, 1, False, AudioLLM, False), ("audiollm_tp2_sp", 2, 1, True, AudioLLM, False),
            ("audiollm_pp2", 1, 2, False, AudioLLM, False), ("audiollm_packed_tp2", 2, 1, False, AudioLLM, True),
            ("bad_audiollm_scale_before_fusion", 1, 1, False, ScaleBeforeFusion, False)]:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelDims(tp=tp, pp=pp), seed=0)
        first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        config = decoder_transformer_config(model_cfg.decoder, ParallelDims(tp=tp, pp=pp, sp=sp))
        model = build_audiollm(model_cfg, config, pre_process=first,
                               post_process=last, audio_token_id=AUDIO_TOKEN)
        model = cls(model.language_model, model.encoder, model.adapter, AUDIO_TOKEN).eval()
        shard = shard_megatron(full, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank())]
        weights = {"language_model." + k: v for k, v in shard.items()}
        if first:
            weights.update(encoder_weights)
            weights.update(adapter_weights)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        assert not missing and not unexpected, (missing, unexpected)
        positions = torch.arange(SEQ)[None].expand(2, -1)
        labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
        audio_args = dict(audio_features=features, audio_lengths=list(MEL_LENGTHS))
        if packed:  # both rows as two documents of one packed row, both clips in it
            cu = torch.tensor([0, SEQ, 2 * SEQ], dtype=torch.int32)
            extra = dict(packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                           max_seqlen_q=SEQ, max_seqlen_kv=SEQ),
                         audio_clip_rows=[0, 0], **audio_args)
            run_tokens, run_positions, run_labels = tokens.reshape(1, -1), positions.reshape(1, -1), labels.reshape(1, -1)
        else:
            extra, run_tokens, run_positions, run_labels = audio_args, tokens, positions, labels
        logits = pipeline_forward(model, lambda m: m(run_tokens, run_positions, None, **extra),
                                  run_tokens.shape[1], run_tokens.shape[0])
        token_loss = pipeline_forward(model, lambda m: m(run_tokens, run_positions, None, labels=run_labels, **extra),
                                      run_tokens.shape[1], run_tokens.shape[0], gather_vocab=False)
        if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
            logits, token_loss = logits.reshape(2, SEQ, -1), token_loss.reshape(2, SEQ)
            loss = token_loss[:, :-1].mean()
            print("RESULT " + json.dumps({
                "case": name, "tp": tp, "pp": pp, "sp": sp, "packed": packed,
                "max_abs_logit_diff": (logits[..., : shape.vocab_size] - ref.logits).abs().max().item(),
                "loss_diff": abs(loss.item() - ref.loss.item()), "loss": loss.item(),
            }), flush=True)


def inventory_check(hf) -> None:
    """orchestrator.plan.model_params' analytic inventory == the real AudioLLM at TP=1, PP=1
    (names, full shapes, requires_grad), with the encoder trainable and frozen."""
    import dataclasses

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from orchestrator.plan.model_params import parameter_inventory
    from orchestrator.plan.schema.lora import LoraConfig
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from tests.models.tiny_models import tiny_model_config, whisper_config

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(tp=1, pp=1), seed=0)
    from orchestrator.plan.compose import compose

    base = tiny_model_config(hf.config, whisper_config())
    report = {}
    for label, cfg in [("trainable_encoder", base),
                       ("frozen_encoder", dataclasses.replace(base, encoder=dataclasses.replace(base.encoder, freeze=True))),
                       ("untied_output", dataclasses.replace(base, decoder=dataclasses.replace(base.decoder, tie_embeddings=False))),
                       ("tiny_cpu_recipe", compose(["+recipe=tiny_cpu"]).model)]:
        model = build_audiollm(cfg, decoder_transformer_config(cfg.decoder, ParallelDims(tp=1, pp=1)),
                               audio_token_id=AUDIO_TOKEN)
        real = [(n, list(p.shape), p.requires_grad) for n, p in model.named_parameters()]
        analytic = [(i.name, list(i.shape), i.trainable) for i in parameter_inventory(cfg, LoraConfig(), tp=1)]
        report[label] = {"real": sorted(real), "analytic": sorted(analytic)}
        # Built for a GPU (bf16), here on the CPU: megatron's bf16 optimizer checkpoints only
        # bf16 parameters, so every one that trains must be bf16.
        gpu = build_audiollm(cfg, decoder_transformer_config(cfg.decoder, ParallelDims(tp=1, pp=1), torch.bfloat16),
                             audio_token_id=AUDIO_TOKEN,
                             on_gpu=True, attention="reference")
        report[label]["gpu_trained_dtypes"] = sorted({str(p.dtype) for p in gpu.parameters() if p.requires_grad})
    forced = dataclasses.replace(base, encoder=dataclasses.replace(base.encoder, precision="fp32"))
    try:
        build_audiollm(forced, decoder_transformer_config(forced.decoder, ParallelDims(tp=1, pp=1), torch.bfloat16),
                       audio_token_id=AUDIO_TOKEN,
                       on_gpu=True, attention="reference")
        report["trained_fp32_encoder_on_gpu"] = "built"
    except ValueError as exc:
        report["trained_fp32_encoder_on_gpu"] = str(exc)
    if dist.get_rank() == 0:
        print("INVENTORY " + json.dumps(report), flush=True)


def load_checkpoint_check(hf) -> None:
    """A converted checkpoint (Gemma2 + Whisper encoder, written once by the CLI in one
    process) loads into the AudioLLM at TP=2 through the job's loader: every decoder
    weight equals its expected TP shard, the encoder equals Whisper's, and only the
    adapter starts fresh."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from transformers import WhisperModel

    from orchestrator.convert.decoder_mapping import DecoderShape
    from tests.models.sharding import hf_to_megatron_full
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.train.init_weights import load_init_checkpoint
    from tests.models.sharding import shard_megatron
    from tests.models.tiny_models import randomize, tiny_model_config, whisper_config

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    init_distributed(ParallelDims(tp=2), seed=0)
    whisper = randomize(WhisperModel(whisper_config()), seed=5)
    tmp = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(tmp, src=0)
    root = Path(tmp[0])
    if dist.get_rank() == 0:
        hf.save_pretrained(root / "hf")
        whisper.save_pretrained(root / "whisper")
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "convert", "hf-to-megatron", "--hf", str(root / "hf"),
                        "--whisper", str(root / "whisper"), "--out", str(root / "mg")], check=True,
                       capture_output=True)
    dist.barrier()
    model_cfg = tiny_model_config(hf.config, whisper_config())
    model = build_audiollm(model_cfg, decoder_transformer_config(model_cfg.decoder, ParallelDims(tp=2)),
                           audio_token_id=AUDIO_TOKEN)
    loaded = load_init_checkpoint(root / "mg", [model])
    shape = DecoderShape.from_hf_config(hf.config)
    expected = shard_megatron(hf_to_megatron_full(hf.state_dict(), shape), shape, 2, 1)[(ps.get_tensor_model_parallel_rank(), 0)]
    own = model.state_dict()
    decoder_mismatch = [k for k, v in expected.items() if not torch.equal(own["language_model." + k], v)]
    encoder_mismatch = [k for k, v in whisper.encoder.state_dict().items() if not torch.equal(own["encoder." + k], v)]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"decoder": decoder_mismatch, "encoder": encoder_mismatch,
                                      "compared": len(expected), "qkv_rows": own[
                                          "language_model.decoder.layers.1.self_attention.linear_qkv.weight"].shape[0]})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"case": "load_converted_audiollm_tp2", "fresh": loaded["fresh"],
                                      "loaded": loaded["loaded"], "ranks": gathered}), flush=True)


if __name__ == "__main__":
    main()
