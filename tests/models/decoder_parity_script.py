"""Megatron Gemma2 decoder vs HF Gemma2 (eager, fp32) on the same weights, for several
parallel layouts and for deliberately wrong variants, in one process launch.
Prints one `RESULT <json>` line per case from the rank holding the full logits.
Run: torchrun --nproc_per_node=2 tests/models/decoder_parity_script.py"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from orchestrator.runtime.distributed import ParallelSizes, init_distributed, shutdown
from tests.models.tiny_models import decoder_config, hf_gemma2

SEQ, BATCH, DOCS = 24, 2, (11, 13)  # longer than the window (8)


def cases():
    good = [dict(name="tp1"), dict(name="tp2", tp=2), dict(name="pp2", pp=2), dict(name="tp2_sp", tp=2, sp=True),
            dict(name="packed_tp1", packed=True), dict(name="packed_tp2_sp", tp=2, sp=True, packed=True)]
    bad = [dict(name="bad_norm_offset", weights="norm_offset"),
           dict(name="bad_window_parity", attention="inverted_parity"),
           dict(name="bad_window_off_by_one", overrides={"sliding_window": 9}),
           dict(name="bad_swiglu", overrides={"activation_func": F.silu}),
           dict(name="bad_no_attn_softcap", overrides={"attn_logit_softcapping": None}),
           dict(name="bad_no_final_softcap", overrides={"final_logit_softcapping": None})]
    return good + bad


def main() -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.packed_seq_params import PackedSeqParams

    from orchestrator.convert.gemma2_mapping import Gemma2Shape, hf_to_megatron_full, shard_megatron
    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.attention import SoftcapDotProductAttention
    from orchestrator.models.gemma2_model import Gemma2Model, gemma2_transformer_config

    class InvertedParityAttention(SoftcapDotProductAttention):
        """The known porting mistake: windows on odd layers instead of even ones."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.window = None if self.window else config.sliding_window

    hf = hf_gemma2(seed=0)
    shape = Gemma2Shape.from_hf_config(hf.config)
    dec = decoder_config(hf.config)
    full = hf_to_megatron_full(hf.state_dict(), shape)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, shape.vocab_size, (BATCH, SEQ), generator=gen)
    packed_tokens = torch.randint(0, shape.vocab_size, (1, sum(DOCS)), generator=gen)
    with torch.no_grad():
        ref = hf(tokens, labels=tokens)
        docs = torch.split(packed_tokens, DOCS, dim=1)
        doc_out = [hf(d, labels=d) for d in docs]
        packed_ref_logits = torch.cat([o.logits for o in doc_out], dim=1)
        # per-token loss summed over both documents (each predicts len-1 tokens)
        packed_ref_loss = sum(o.loss * (d.shape[1] - 1) for o, d in zip(doc_out, docs)) / (sum(DOCS) - len(DOCS))

    for case in cases():
        tp, pp, sp, packed = case.get("tp", 1), case.get("pp", 1), case.get("sp", False), case.get("packed", False)
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        init_distributed(ParallelSizes(tp=tp, pp=pp), seed=0)
        cfg = gemma2_transformer_config(dec, tp=tp, pp=pp, sp=sp, **case.get("overrides", {}))
        model = Gemma2Model(
            cfg, dec.vocab_size, dec.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            rope_theta=dec.rope_theta,
            core_attention=InvertedParityAttention if case.get("attention") == "inverted_parity" else None,
        ).eval()
        weights = dict(full)
        if case.get("weights") == "norm_offset":  # model computing x*w: same as 1+w with w-1 stored
            weights = {k: (v - 1.0 if "norm" in k else v) for k, v in weights.items()}
        shard = shard_megatron(weights, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank())]
        missing, unexpected = model.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        assert not missing and not unexpected, (missing, unexpected)

        if packed:
            toks = packed_tokens
            cu = torch.tensor([0, DOCS[0], sum(DOCS)], dtype=torch.int32)
            psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                  max_seqlen_q=max(DOCS), max_seqlen_kv=max(DOCS))
            positions = torch.cat([torch.arange(n) for n in DOCS])[None]
            labels = torch.cat([torch.cat([d[:, 1:], d[:, :1]], dim=1) for d in docs], dim=1)
            loss_mask = torch.ones_like(labels, dtype=torch.float)
            loss_mask[0, DOCS[0] - 1] = 0.0
            loss_mask[0, -1] = 0.0
            ref_logits, ref_loss = packed_ref_logits, packed_ref_loss
        else:
            toks, psp = tokens, None
            positions = torch.arange(SEQ)[None].expand(BATCH, -1)
            labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
            loss_mask = torch.ones_like(labels, dtype=torch.float)
            loss_mask[:, -1] = 0.0
            ref_logits, ref_loss = ref.logits, ref.loss

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
    shutdown()


if __name__ == "__main__":
    main()
