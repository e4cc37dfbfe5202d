"""Context parallelism of the AudioLLM against CP=1 (CPU, fp32, gloo, 4 processes).

One micro-batch in the loader's format goes through the product's path: the training
source's CP split (`ContextParallelBatches`: trim, 2*CP load-balanced chunks, audio
routing) and `AudioLLMProvider.forward` (attention mask of this rank's queries, the
clips it needs, CTC shares), on the tiny AudioLLM with the same weights at every layout.
The batch has a sequence four times the sliding window, packed documents that cross
chunk boundaries, and audio clips whose placeholders straddle a chunk boundary (and so
CP ranks). Compared with CP=1, per token: the logits (the output layer's, gathered over
TP and CP) and the per-token training loss (LM + the auxiliary CTC share).

With an adapter kind as argument (voxtral, qwen2_audio), the same at CP 2 and CP 2 with
TP 2 + SP for the AudioLLM with that released model's adapter.

Prints one `RESULT <json>` line per case from one rank holding the outputs.
Run: torchrun --nproc_per_node=4 tests/models/cp_parity_script.py [KIND]"""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
import torch.distributed as dist

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.models.tiny_models import hf_gemma2_config, randomize, tiny_model_config, whisper_config

SEQ, ROWS, AUDIO_ID, VOCAB = 32, 2, 7, 250  # window 8: every row is 4 windows long
# Row 0: two packed documents (13 and 19 tokens); row 1: one sample and tail padding.
# A document's second half is its trained answer.
DOCS = ((13, 19), (29,))
# Clips as (row, first placeholder, mel frames). CP=2 cuts rows into chunks of 8: rank 0
# holds 0-7 and 24-31, rank 1 holds 8-23. Clip 0's placeholders (5-10) straddle ranks;
# clip 1's (15-18) lie on rank 1 while most of its sample's answer (22-30) is on rank 0,
# which then needs the clip for the CTC loss only; clip 2's (20-27) straddle ranks again.
CLIPS = ((0, 5, 60), (0, 15, 40), (1, 20, 80))
# With a released model's adapter kind (argv: voxtral | qwen2_audio), the same placeholder
# runs: Voxtral's 4 frames a token from the same clips (7, 5 and 10 tokens), Qwen2-Audio's
# pool of 2 from clips half as long.
KIND_CLIPS = {"voxtral": CLIPS, "qwen2_audio": ((0, 5, 30), (0, 15, 20), (1, 20, 40))}


def cases(kind=None):
    good = [dict(name="cp2", cp=2), dict(name="cp2_tp2_sp", cp=2, tp=2, sp=True),
            dict(name="cp2_pp2", cp=2, pp=2), dict(name="cp2_flex", cp=2, attention="flex")]
    if kind is not None:  # the adapter kind's own part: which clips' tokens each CP rank makes
        return good[:2]
    # The mistake a port makes when it assumes contiguous halves: queries placed at
    # the wrong global slots (causal/window masks and rotary disagree).
    bad = [dict(name="bad_cp2_contiguous_slots", cp=2, attention="contiguous")]
    return good + bad


def make_batch(frames_of, clips=CLIPS) -> dict:
    """A loader micro-batch (orchestrator.data.packing's format) with DOCS and CLIPS."""
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(10, VOCAB, (ROWS, SEQ), generator=gen)
    positions = torch.zeros(ROWS, SEQ, dtype=torch.long)
    dataset_index = torch.full((ROWS, SEQ), -1, dtype=torch.long)
    loss_mask = torch.zeros(ROWS, SEQ)
    for row, docs in enumerate(DOCS):
        start = 0
        for n in docs:
            positions[row, start:start + n] = torch.arange(n)
            dataset_index[row, start:start + n] = 0
            loss_mask[row, start + n // 2:start + n - 1] = 1.0  # a trained answer after a prompt
            start += n
        positions[row, start:] = torch.arange(SEQ - start)  # tail padding: its own document
    num_tokens = []
    for row, first, mel in clips:
        n = frames_of(mel)
        tokens[row, first:first + n] = AUDIO_ID
        loss_mask[row, first:first + n] = 0.0
        num_tokens.append(n)
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    features = torch.randn(len(clips), 16, 100, generator=gen)
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": positions,
            "dataset_index": dataset_index, "packed": True, "audio_token_id": AUDIO_ID,
            "audio_features": features, "audio_lengths": torch.tensor([mel for _, _, mel in clips]),
            "audio_num_tokens": torch.tensor(num_tokens), "audio_clip_rows": torch.tensor([r for r, _, _ in clips]),
            "audio_clip_ctc": torch.tensor([True] * len(clips)),
            "audio_clip_keys": torch.tensor([[k, 0] for k in range(len(clips))])}


def provider_for(model_cfg, parallel, ctc: bool):
    """The product's provider without a tokenizer on disk (placeholder id and special
    tokens given), with or without the auxiliary CTC loss (it needs pp = 1:
    orchestrator.plan.rules.run.check_ctc)."""
    from orchestrator.train.audiollm_provider import AudioLLMProvider

    return AudioLLMProvider(model_cfg, parallel, audio_token_id=AUDIO_ID, special_ids={0, 1}, ctc_weight=0.3 * ctc)


def main(kind=None) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from orchestrator.convert.decoder_mapping import DecoderShape
    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.attention import FlexSoftcapAttention, SoftcapDotProductAttention
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.train.audiollm_provider import ContextParallelBatches
    from tests.models.sharding import shard_megatron

    class ContiguousSlotsAttention(SoftcapDotProductAttention):
        def _gather_row(self, key, value):
            key, value, slots = super()._gather_row(key, value)
            local = slots.numel()
            return key, value, torch.arange(local) + self.cp_group.rank() * local

    hf_cfg = hf_gemma2_config()
    model_cfg = tiny_model_config(hf_cfg, whisper_config())
    model_cfg.adapter.ctc_weight = 0.3
    if kind is not None:  # a released model's adapter (orchestrator/plan/adapter_kinds.py)
        model_cfg.adapter.kind, model_cfg.adapter.frame_stack, model_cfg.adapter.dropout = kind, None, None
        model_cfg.encoder.mask_padding = kind == "qwen2_audio"  # as the released model computes
    shape = DecoderShape.from_hf_config(hf_cfg)

    def build(tp=1, pp=1, cp=1, sp=False, attention_name=None):
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelDims(tp=tp, pp=pp, cp=cp), seed=0)
        parallel = SimpleNamespace(tp=tp, pp=pp, cp=cp, sp=sp, vpp=None)
        model_cfg.attention = "flex" if attention_name == "flex" else "reference"
        config = decoder_transformer_config(model_cfg.decoder, ParallelDims(tp=tp, pp=pp, cp=cp, sp=sp))
        model = build_audiollm(model_cfg, config, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(),
                               audio_token_id=AUDIO_ID,
                               core_attention=ContiguousSlotsAttention if attention_name == "contiguous" else None)
        return model, parallel

    def load(model, tp, pp):
        shard = shard_megatron(decoder_full, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(),
                                                             ps.get_pipeline_model_parallel_rank())]
        state = {"language_model." + k: v for k, v in shard.items()}
        if model.pre_process:
            state.update({k: v for k, v in full.items() if k.startswith(("encoder.", "adapter."))})
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not [k for k in missing if not k.endswith("_extra_state")] and not unexpected, (missing, unexpected)

    # Weights every layout loads: the CP=1 model's, redrawn with spreads that make every
    # detail of the model matter.
    model, parallel = build()
    randomize(model, seed=5)
    full = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    decoder_full = {k[len("language_model."):]: v[:VOCAB] if "word_embeddings" in k else v
                    for k, v in full.items() if k.startswith("language_model.")}
    batch = make_batch(model.adapter_tokens, KIND_CLIPS.get(kind, CLIPS))
    # CP=1 references (every rank computes them) at the TP size of the CP cases: CP adds no
    # reduction of its own, TP splits the row-parallel sums.
    reference = {}
    for tp, ctc in ((1, True), (1, False), (2, True)):
        model, parallel = build(tp=tp, sp=tp > 1)
        load(model, tp, 1)
        reference[(tp, ctc)] = run(model, provider_for(model_cfg, parallel, ctc), batch, pipeline_forward,
                                   tensor_parallel)

    for case in cases(kind):
        tp, pp, cp = case.get("tp", 1), case.get("pp", 1), case.get("cp", 1)
        model, parallel = build(tp, pp, cp, case.get("sp", False), case.get("attention"))
        if case.get("attention") == "flex":
            assert isinstance(model.language_model.decoder.layers[0].self_attention.core_attention,
                              FlexSoftcapAttention)
        load(model, tp, pp)
        share = ContextParallelBatches(SimpleNamespace(next_microbatch=lambda: batch, dataset_names=["a"]),
                                       parallel, ps.get_context_parallel_rank()).next_microbatch()
        ctc = pp == 1
        loss, logits = run(model, provider_for(model_cfg, parallel, ctc), share, pipeline_forward, tensor_parallel)
        if loss is None:
            continue
        loss, logits = cp_gather(loss, share["cp_slots"]), cp_gather(logits, share["cp_slots"])
        ref_loss, ref_logits = reference[(tp, ctc)]
        if ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0 \
                and ps.get_data_parallel_rank() == 0:
            trained = batch["loss_mask"] > 0
            print("RESULT " + json.dumps({
                "case": case["name"] + (f"_{kind}" if kind else ""), "tp": tp, "pp": pp, "cp": cp, "ctc": ctc,
                "max_abs_logit_diff": (logits - ref_logits).abs().max().item(),
                "max_abs_logit_diff_vs_tp1": (logits - reference[(1, ctc)][1]).abs().max().item(),
                "max_abs_logit": ref_logits.abs().max().item(),
                "max_abs_loss_diff": (loss - ref_loss)[trained].abs().max().item(),
                "max_abs_loss": ref_loss[trained].abs().max().item(),
                "rank_frames": share["audio_frames"].tolist(), "rank_clips": share["audio_clips"].tolist(),
                "adapter": type(model.adapter).__name__ if model.pre_process else None,
            }), flush=True)
    shutdown()


def run(model, provider, batch, pipeline_forward, tensor_parallel):
    """(per-token loss [B, S(/CP)], logits [B, S(/CP), vocab] gathered over TP) on the last
    stage, (None, None) elsewhere; the model in training mode (CTC on) without dropout."""
    from megatron.core import parallel_state as ps

    captured = []
    hook = None
    if model.post_process:
        hook = model.language_model.output_layer.register_forward_hook(
            lambda module, args, out: captured.append(out[0].detach()))
    model.train()
    seq = batch["tokens"].shape[1] * ps.get_context_parallel_world_size()
    loss = pipeline_forward(model, lambda m: provider.forward(m, batch), seq, ROWS, gather_vocab=False)
    if hook is not None:
        hook.remove()
    if loss is None:
        return None, None
    logits = captured[0].transpose(0, 1)  # [b, s, v/tp]
    if ps.get_tensor_model_parallel_world_size() > 1:
        logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
    return loss, logits[..., :VOCAB]


def cp_gather(local: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[B, S/CP, ...] of every CP rank -> [B, S, ...] in global slot order."""
    from megatron.core import parallel_state as ps

    group = ps.get_context_parallel_group()
    parts = [torch.empty_like(local) for _ in range(group.size())]
    dist.all_gather(parts, local.contiguous(), group=group)
    all_slots = [torch.empty_like(slots) for _ in range(group.size())]
    dist.all_gather(all_slots, slots, group=group)
    out = torch.empty((local.shape[0], slots.numel() * group.size(), *local.shape[2:]), dtype=local.dtype)
    for part, part_slots in zip(parts, all_slots):
        out[:, part_slots] = part
    return out


if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else None)
