"""Greedy decoding against HF `generate` (fp32, greedy) on the same weights, and across
layouts; prints one `RESULT <json>` line.

The weights are random HF modules (tests/models/tiny_models.py: Gemma2 with a window of 8,
softcaps and GQA, small token embeddings; a Whisper encoder; the adapter written out in parity_script). The batch:
prompts of different lengths, two with clips of different lengths and one text-only,
every audio prompt longer than the window. HF decodes the fused, left-padded input
embeddings with and without its cache; the project decodes with the cache (prompts
padded left and right) and without it, at TP=1, TP=2 with sequence parallel, PP=2 and
CP=2 (two ranks; every layout re-initialises megatron's parallel state in the same
processes). The adapter has a CTC head (random, peaked), which the greedy runs leave
unread; joint CTC/attention decoding (ctc_weight) runs at every layout, with and without
the cache at TP=1, and is refused at PP=2.
Run: torchrun --nproc_per_node=2 tests/models/decode_script.py
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.nn.functional as F

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

AUDIO, BOS, SEP, PAD = 249, 2, 3, 0
MEL_FRAMES, MEL_LENGTHS = 80, (80, 67)
NEW_TOKENS = 20
# Token embeddings this small (the other weights: 0.15) make the random model's tokens
# vary with the context; at tiny_models' spread every row repeats one or two tokens.
EMBEDDING_STD = 0.05
LAYOUTS = {"tp1": {}, "tp2_sp": dict(tp=2, sp=True), "pp2": dict(pp=2), "cp2": dict(cp=2)}
# Joint decoding's CTC weight, and the spread of the random CTC head's weights: large, so
# that its scores move the choice among the decoder's candidates.
JOINT_WEIGHT, CTC_HEAD_STD = 0.5, 2.0


def reference(hf, hf_encoder, adapter_weights, features, prompts, stop_id):
    """HF: encoder -> adapter math -> fused embeddings, left padded -> generate."""
    from tests.models.parity_script import reference_adapter

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    window = 2 * hf_encoder.config.max_source_positions
    states = hf_encoder(F.pad(features, (0, window - features.shape[-1])), output_hidden_states=True).hidden_states[1:]
    audio = reference_adapter(states, adapter_weights, MEL_LENGTHS)
    embeds = hf.model.embed_tokens(ids)
    embeds[ids == AUDIO] = audio
    out = {}
    for cached in (True, False):
        gen = hf.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=stop_id, pad_token_id=PAD, use_cache=cached, output_scores=True,
                          return_dict_in_generate=True)
        # only the new tokens come back (inputs_embeds); a row is cut at its stop id
        tokens = [row[:row.index(stop_id)] if stop_id in row else row for row in gen.sequences.tolist()]
        out["cached" if cached else "uncached"] = tokens
        if cached:  # the smallest lead of the chosen token over the runner-up, over every step and row
            top2 = torch.stack(gen.scores).topk(2, dim=-1).values
            out["min_margin"] = float((top2[..., 0] - top2[..., 1]).min())
    return out


def main() -> None:
    from megatron.core import parallel_state as ps
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from orchestrator.convert.decoder_mapping import DecoderShape
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.generate import greedy_generate
    from orchestrator.plan.schema.model import AdapterConfig
    from tests.models.sharding import hf_to_megatron_full, shard_megatron
    from tests.models.tiny_models import (hf_gemma2, random_adapter_weights, randomize, tiny_model_config,
                                          whisper_config)

    torch.manual_seed(0)
    hf = hf_gemma2(seed=1)
    with torch.no_grad():  # small token embeddings: the context, not the last token, picks the next one
        hf.model.embed_tokens.weight.normal_(0.0, EMBEDDING_STD, generator=torch.Generator().manual_seed(101))
    shape = DecoderShape.from_hf_config(hf.config)
    wcfg = whisper_config()
    model_cfg = tiny_model_config(hf.config, wcfg)
    model_cfg.adapter = AdapterConfig(frame_stack=5, dropout=0.0, ctc_weight=0.3)  # with the CTC head
    hf_encoder = randomize(WhisperEncoder(wcfg), seed=2).eval()
    gen = torch.Generator().manual_seed(3)
    adapter_weights = random_adapter_weights(wcfg, shape.hidden_size, gen)
    ctc_head = {"adapter.ctc_head.weight": CTC_HEAD_STD * torch.randn(shape.vocab_size + 1, shape.hidden_size, generator=gen),
                "adapter.ctc_head.bias": torch.zeros(shape.vocab_size + 1)}
    features = torch.randn(2, wcfg.num_mel_bins, MEL_FRAMES, generator=gen)
    counts = [((n - 1) // 2 + 1) // 5 for n in MEL_LENGTHS]  # 8 and 6 audio tokens
    prompts = [[BOS, 17, 40] + [AUDIO] * counts[0] + [SEP, 77],  # 13 tokens (window 8)
               [BOS, 9, 11, 12, 13, 14] + [AUDIO] * counts[1] + [SEP, 5, 6, 7, 8],  # 17 tokens
               [BOS, 21, SEP]]  # text only
    clip_rows = [0, 1]
    # A stop id none of the rows meets early, so that every row decodes NEW_TOKENS tokens
    # (found from HF's own tokens below; fixed by the seeds).
    with torch.no_grad():
        probe = reference(hf, hf_encoder, adapter_weights, features, prompts, stop_id=-5)
    seen = {t for row in probe["cached"] for t in row}
    stop_id = next(t for t in range(AUDIO) if t not in seen and t not in (PAD, BOS, SEP))
    with torch.no_grad():
        ref = reference(hf, hf_encoder, adapter_weights, features, prompts, stop_id)
    result = {"hf_cached": ref["cached"], "hf_uncached": ref["uncached"], "min_margin": ref["min_margin"],
              "stop_id": stop_id}

    full = hf_to_megatron_full(hf.state_dict(), shape)
    encoder_weights = {"encoder." + k: v for k, v in hf_encoder.state_dict().items()}
    for name, sizes in LAYOUTS.items():
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        tp, pp, cp = sizes.get("tp", 1), sizes.get("pp", 1), sizes.get("cp", 1)
        init_distributed(ParallelDims(tp=tp, pp=pp, cp=cp), seed=0)
        first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        dims = ParallelDims(tp=tp, pp=pp, cp=cp, sp=sizes.get("sp", False))
        config = decoder_transformer_config(model_cfg.decoder, dims)
        model = build_audiollm(model_cfg, config, pre_process=first, post_process=last, audio_token_id=AUDIO)
        shard = shard_megatron(full, shape, tp, pp)[(ps.get_tensor_model_parallel_rank(),
                                                     ps.get_pipeline_model_parallel_rank())]
        weights = {"language_model." + k: v for k, v in shard.items()}
        if first:
            weights.update(encoder_weights)
            weights.update(adapter_weights)
            weights.update(ctc_head)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not [k for k in missing if not k.endswith("_extra_state")] and not unexpected, (missing, unexpected)
        model.train()  # greedy_generate switches to eval mode and back
        args = (model, prompts, features, list(MEL_LENGTHS))
        kwargs = dict(stop_ids=[stop_id], max_new_tokens=NEW_TOKENS, pad_id=PAD, audio_clip_rows=clip_rows)
        runs = {"cached_left": greedy_generate(*args, **kwargs),
                "cached_right": greedy_generate(*args, **kwargs, padding_side="right")}
        if pp == 1:
            runs["joint"] = greedy_generate(*args, **kwargs, ctc_weight=JOINT_WEIGHT)
            runs["joint_row1_only"] = greedy_generate(*args, **kwargs, ctc_weight=JOINT_WEIGHT,
                                                      ctc_rows=[False, True, False])
        else:
            try:
                greedy_generate(*args, **kwargs, ctc_weight=JOINT_WEIGHT)
                runs["joint_refused"] = ""
            except ValueError as error:
                runs["joint_refused"] = str(error)
        if name == "tp1":
            runs["uncached"] = greedy_generate(*args, **kwargs, use_cache=False)
            runs["joint_uncached"] = greedy_generate(*args, **kwargs, use_cache=False, ctc_weight=JOINT_WEIGHT)
            # per-row stop ids: row 0 stops at the first token it had not given before (from
            # its third on), the others at the shared stop id
            row0 = runs["cached_left"][0]
            runs["row0_stop_at"] = next(k for k, t in enumerate(row0) if k >= 2 and t not in row0[:k])
            per_row = [[row0[runs["row0_stop_at"]]], [stop_id], [stop_id]]
            runs["per_row_stop"] = greedy_generate(*args, **{**kwargs, "stop_ids": per_row})
            runs["capped"] = greedy_generate(*args, **{**kwargs, "max_new_tokens": 3})
            runs["training_after"] = model.training
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, [runs["cached_left"], runs.get("joint")])
        runs["all_ranks_equal"] = all(r == everyone[0] for r in everyone)
        result[name] = runs
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
