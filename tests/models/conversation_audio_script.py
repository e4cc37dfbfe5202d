"""One process: conversations through the data path (SampleProcessor, packing.collate)
and the tiny AudioLLM's `embed`: every audio segment's adapter outputs must sit on
exactly the placeholders its turn put in the prompt, checked against encoding that
segment alone from its own column. Prints `RESULT <json>`.
Run: torchrun --nproc_per_node=1 tests/models/conversation_audio_script.py TMPDIR"""

import json
import sys

import torch

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from tests.tolerances import reorder_tolerance

SEQ = 512


def configs(vocab_size: int):
    from omegaconf import OmegaConf

    from orchestrator.plan.schema.model import AdapterConfig, DecoderConfig, EncoderConfig, ModelConfig
    from orchestrator.plan.schema.parallel import ParallelConfig

    # The data side's tiny encoder (tests/data/conftest.py): 80 mels, a 5-s window.
    enc = EncoderConfig(d_model=64, num_layers=1, num_heads=2, ffn_dim=64, num_mel_bins=80, max_source_positions=250,
                        freeze=False, init_std=0.1)  # tiny_cpu's init: the clips' differences reach the output
    dec = DecoderConfig(hidden_size=64, num_layers=1, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                        ffn_hidden_size=128, vocab_size=vocab_size, max_position_embeddings=SEQ, sliding_window=16,
                        query_pre_attn_scalar=16)
    model = ModelConfig(name="conversation_test", decoder=dec, encoder=enc, adapter=AdapterConfig(frame_stack=5))
    return model, ParallelConfig(tp=1, pp=1), OmegaConf.structured(enc), OmegaConf.structured(model.adapter)


def samples():
    """Two conversations of tests/data/conftest.py (a segment before the first question,
    one inside the second) and one whose first turn sends both segments with no marker
    (both go before the text, in the order of its `audio` list: b, then a)."""
    from tests.data.conftest import conversation_samples

    raws = conversation_samples(3, seed=11)
    raws[2]["turns"] = [{"role": "user", "text": "Compare them.", "audio": ["clip_b", "clip_a"]},
                        {"role": "assistant", "text": "the cat"}]
    return raws


def main() -> None:
    init_distributed(ParallelDims(tp=1), seed=0)
    from orchestrator.data.audio import load_audio
    from orchestrator.data import mel
    from orchestrator.data.loader import SampleProcessor
    from orchestrator.data.packing import collate
    from orchestrator.data.sources import ResolvedDataset
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.plan.schema.data import DatasetEntry
    from tests.data.conftest import data_config

    tokenizer = load_tokenizer(sys.argv[1])
    model_cfg, parallel_cfg, enc_cfg, ada_cfg = configs(len(tokenizer))
    entry = DatasetEntry(name="conv", path="", turns_field="turns")
    cfg = data_config([entry], seq_length=SEQ)
    processor = SampleProcessor(cfg, enc_cfg, ada_cfg, tokenizer, [ResolvedDataset("conv", "", 1.0, None, cfg.train[0])],
                                "train")
    raws = samples()
    examples = [processor(raw, i, 0) for i, raw in enumerate(raws)]
    rows = [examples[:2], examples[2:]]  # two conversations packed in row 0, the third in row 1
    batch = collate(rows, SEQ, tokenizer.pad_token_id, ["conv"], processor.audio_token_id,
                    features_fn=processor.features)
    model = build_audiollm(model_cfg, decoder_transformer_config(model_cfg.decoder, ParallelDims.of(parallel_cfg)),
                           audio_token_id=processor.audio_token_id).eval()
    with torch.no_grad():
        decoder_input, _, _ = model.embed(batch["tokens"], batch["audio_features"], batch["audio_lengths"],
                                          batch["audio_clip_rows"].tolist())
        fused = decoder_input.transpose(0, 1)  # [b, s, h]
        placeholders = batch["tokens"] == processor.audio_token_id
        reduction = max(model_cfg.encoder.ffn_dim, model_cfg.encoder.d_model, 3 * model_cfg.encoder.num_mel_bins,
                        model_cfg.decoder.hidden_size * model_cfg.adapter.frame_stack, 250)
        depth = 2 + 7 * model_cfg.encoder.num_layers + 2  # conv1, conv2, per layer 7 products, adapter's 2
        report = {"segments": [], "placeholders_covered": 0}
        alone_by_segment = {}
        for row, members in enumerate(rows):
            start = 0
            for ex, raw in zip(members, raws if row == 0 else raws[2:]):
                n = len(ex.tokenized)
                # This sample's placeholder positions in the row, in prompt order.
                positions = torch.nonzero(placeholders[row, start:start + n]).flatten() + start
                at = 0
                for turn_index, turn in enumerate(raw["turns"]):
                    for column in turn.get("audio") or []:
                        # The segment alone, from its own column: decoded, log-mel, encoded, adapted.
                        clip = load_audio(raw[column], None, 16000)
                        feats, lengths = mel.features([clip], model_cfg.encoder.num_mel_bins, 500)
                        alone = model.language_model.scale_embeddings(
                            model.audio_embeddings(feats, lengths.tolist())[None])[:, 0]
                        span = positions[at:at + alone.shape[0]]
                        got = fused[row, span]
                        atol = reorder_tolerance(alone.abs().max(), reduction, depth)
                        report["segments"].append({
                            "row": row, "turn": turn_index, "column": column, "tokens": int(alone.shape[0]),
                            "span": [int(span[0]), int(span[-1])] if len(span) else None,
                            "contiguous": bool(len(span) and int(span[-1] - span[0]) == len(span) - 1),
                            "max_error": float((got - alone).abs().max()) if got.shape == alone.shape else None,
                            "atol": atol})
                        alone_by_segment[(row, start, column)] = (span, alone)
                        at += alone.shape[0]
                report["placeholders_covered"] += at
                assert at == len(positions), (at, len(positions))
                start += n
        report["placeholders"] = int(placeholders.sum())
        # The control: another segment on these placeholders differs by far more than the bound.
        keys = list(alone_by_segment)
        span, mine = alone_by_segment[keys[0]]
        other = alone_by_segment[keys[1]][1]
        k = min(len(mine), len(other))
        report["swap_error"] = float((fused[0, span[:k]] - other[:k]).abs().max())
    print("RESULT " + json.dumps(report), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
