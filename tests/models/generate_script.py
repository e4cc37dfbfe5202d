"""One process: a tiny AudioLLM memorises three clip -> answer pairs, then greedy
decoding must reproduce each answer from its clip, and the evaluation path scores it
(WER, exact match, BLEU); plus the SpecAugment hook of the built model. Prints `RESULT <json>`. Run: torchrun --nproc_per_node=1 tests/models/generate_script.py"""

import json

import torch

from orchestrator.plan.model_params import audio_token_count
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

AUDIO, BOS, SEP, PAD, STOP = 3, 1, 2, 0, 4
MEL, WINDOW = 16, 50  # mel bins; encoder window in mel frames (max_source_positions 25)


def config(spec_augment: bool):
    from orchestrator.plan.schema.model import (AdapterConfig, DecoderConfig, EncoderConfig, ModelConfig,
                                           SpecAugmentConfig)
    from orchestrator.models.decoder_config import decoder_transformer_config

    dec = DecoderConfig(hidden_size=64, num_layers=2, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                        ffn_hidden_size=128, vocab_size=40, max_position_embeddings=64, sliding_window=16,
                        query_pre_attn_scalar=16)
    enc = EncoderConfig(d_model=32, num_layers=1, num_heads=4, ffn_dim=64, num_mel_bins=MEL,
                        max_source_positions=WINDOW // 2, freeze=False)
    model = ModelConfig(name="gen_test", decoder=dec, encoder=enc, adapter=AdapterConfig(frame_stack=5, dropout=0.0),
                        spec_augment=SpecAugmentConfig(enabled=spec_augment, time_masks=2, time_width=10,
                                                       time_ratio=0.5, freq_masks=2, freq_width=4))
    return model, decoder_transformer_config(dec, ParallelDims(tp=1, pp=1))


class ValidationLoader:
    """What evaluate_generation reads of a validation loader: its batches and `metric`."""

    def __init__(self, batches, metric):
        self.batches, self.metric = batches, metric

    def __iter__(self):
        return iter(self.batches)


def generation_scores(model, prompts, answers, features, lengths):
    """The memorised clips as one validation batch (one sample per row, the loader's
    format) through the evaluation path (orchestrator.scoring.asr.evaluate_generation:
    prompts from the batch, greedy decoding, a real HF tokenizer's decode, scores), as
    three validation datasets: a plain list (no `metric`: WER) and loaders scored by
    exact match and BLEU. Returns the pooled score of each metric for the model and for
    the same model when every token stops it (empty answers), and each dataset's metric."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from orchestrator.scoring.asr import POOLED, evaluate_generation

    vocab = {"<pad>": PAD, "<bos>": BOS, "<sep>": SEP, "<audio>": AUDIO, "<stop>": STOP}
    vocab.update({f"w{i}": i for a in answers for i in a})
    backend = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<stop>", additional_special_tokens=["<sep>", "<audio>"])
    rows = [p + a + [STOP] for p, a in zip(prompts, answers)]
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), PAD)
    loss_mask = torch.zeros(len(rows), width)
    owner = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, rows)):
        tokens[i, :len(r)] = torch.tensor(r)
        loss_mask[i, len(p) - 1:len(r) - 1] = 1.0  # labels = tokens shifted: the answer and its stop
    batch = {"tokens": tokens, "loss_mask": loss_mask, "dataset_index": owner,
             "cu_seqlens": torch.arange(len(rows) + 1) * width, "audio_token_id": AUDIO,
             "audio_num_tokens": torch.tensor([audio_token_count(n, 5) for n in lengths]),
             "audio_features": features, "audio_lengths": torch.tensor(lengths),
             "transcripts": [" ".join(f"w{i}" for i in a) for a in answers]}
    validation = {"memorised": [batch], "memorised_exact": ValidationLoader([batch], "exact"),
                  "memorised_bleu": ValidationLoader([batch], "bleu")}
    out = {"metrics": {}}
    for kind, stop_ids in (("working", [STOP]), ("silent", list(range(40)))):
        report = evaluate_generation(model, validation, tokenizer, stop_ids=stop_ids, max_new_tokens=12)
        out["metrics"] = {name: report[name]["metric"] for name in validation}
        out.update({f"{metric}_{kind}": report[key][metric] for metric, key in POOLED.items()})
    return out


def main() -> None:
    init_distributed(ParallelDims(tp=1), seed=0)
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.generate import greedy_generate

    torch.manual_seed(0)
    model = build_audiollm(*config(False), audio_token_id=AUDIO)
    # Clips 0 and 1 have the same length (same prompt tokens): only the audio tells their answers apart.
    lengths = [40, 40, 20]
    features = torch.randn(3, MEL, WINDOW)
    answers = [[10, 11, 12, 13, 14], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37]]
    prompts = [[BOS] + [AUDIO] * audio_token_count(n, 5) + [SEP] for n in lengths]
    seqs = [p + a + [STOP] for p, a in zip(prompts, answers)]
    s = max(len(x) for x in seqs)
    ids = torch.full((3, s + 1), PAD)
    mask = torch.zeros(3, s)
    for i, (p, x) in enumerate(zip(prompts, seqs)):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, len(p) - 1:len(x) - 1] = 1.0
    tokens, labels = ids[:, :-1], ids[:, 1:]
    positions = torch.arange(s).unsqueeze(0).expand(3, -1)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    loss_value = float("nan")
    for step in range(400):
        per_token = model(tokens, positions, labels=labels, audio_features=features, audio_lengths=lengths)
        loss = (per_token * mask).sum() / mask.sum()
        optim.zero_grad()
        loss.backward()
        optim.step()
        loss_value = float(loss)
        if loss_value < 0.02:
            break
    batched = greedy_generate(model, prompts, features, lengths, stop_ids=[STOP], max_new_tokens=12, pad_id=PAD)
    alone = [greedy_generate(model, [p], features[i:i + 1], [lengths[i]], stop_ids=[STOP], max_new_tokens=12,
                             pad_id=PAD)[0] for i, p in enumerate(prompts)]
    swapped = greedy_generate(model, prompts[:2], features[[1, 0]], lengths[:2], stop_ids=[STOP],
                              max_new_tokens=12, pad_id=PAD)
    capped = greedy_generate(model, prompts, features, lengths, stop_ids=[STOP], max_new_tokens=2, pad_id=PAD)
    # clips mapped to rows explicitly, not clip i -> row i: row 0 is text only, clip 0 is in
    # row 1 and clip 1 in row 2 (the default mapping would fail the placeholder count)
    rows = greedy_generate(model, [[BOS, SEP]] + prompts[1:], features[1:], lengths[1:], stop_ids=[STOP],
                           max_new_tokens=12, pad_id=PAD, audio_clip_rows=[1, 2])[1:]
    training_after = model.training
    scores = generation_scores(model, prompts, answers, features, lengths)

    # SpecAugment hook: same weights, masks change the audio embeddings in training mode only.
    augmented = build_audiollm(*config(True), audio_token_id=AUDIO)
    augmented.load_state_dict(model.state_dict())
    augmented.train()
    with torch.no_grad():
        train_diff = float((augmented.audio_embeddings(features, lengths)
                            - model.eval().audio_embeddings(features, lengths)).abs().max())
        augmented.eval()
        eval_diff = float((augmented.audio_embeddings(features, lengths)
                           - model.audio_embeddings(features, lengths)).abs().max())
    result = {"loss": loss_value, "steps": step + 1, "answers": answers, "batched": batched, "alone": alone,
              "swapped": swapped, "capped": capped, "rows": rows, "training_after": training_after,
              "spec_augment_built": augmented.spec_augment is not None, "plain_has_none": model.spec_augment is None,
              "train_diff": train_diff, "eval_diff": eval_diff, **scores}
    print("RESULT " + json.dumps(result), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
