"""The same samples through the real AudioLLM, packed into one row (THD, cu_seqlens), the
same packed row with the trainer's per-row document mask (audiollm_provider.model_inputs)
and one per row (plain causal attention): the masked mean loss must agree.

Run: torchrun --nproc_per_node=1 tests/data/packed_vs_unpacked_script.py OUT_DIR
Prints `RESULT <json>` with both losses.
"""

import json
import sys
from pathlib import Path

import torch

from orchestrator.plan.compose import compose
from orchestrator.data.loader import build_train_loader
from orchestrator.data.packing import packed_seq_params
from orchestrator.data.tokenizer_build import AUDIO_TOKEN, build_tokenizer, load_tokenizer
from orchestrator.plan.resolve import to_object
from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown
from orchestrator.plan.schema.data import DatasetEntry
from orchestrator.train.audiollm_provider import model_inputs
from tests.data.conftest import WORDS, data_config, tone_samples, write_mds

NUM_SAMPLES = 4


def masked_mean(per_token_loss: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return (per_token_loss.double() * loss_mask.double()).sum() / loss_mask.double().sum()


def main() -> None:
    out = Path(sys.argv[1])
    init_distributed(ParallelDims(), seed=1234)
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    tokenizer_dir = build_tokenizer(texts + ["Transcribe: user model"] * 5, out / "tokenizer", vocab_size=320)
    audio_token_id = load_tokenizer(tokenizer_dir).convert_tokens_to_ids(AUDIO_TOKEN)
    write_mds(out / "ds", tone_samples(NUM_SAMPLES, seed=3))

    cfg = to_object(compose([]))  # the tiny_cpu recipe's model
    common = dict(train=[DatasetEntry(name="tones", path=str(out / "ds"))], shuffle=False,
                  tokenizer=str(tokenizer_dir), seq_length=256, packing_buffer=NUM_SAMPLES)
    packed = next(build_train_loader(data_config(packing=True, **common), cfg.model.encoder, cfg.model.adapter, 1))
    unpacked = next(build_train_loader(data_config(packing=False, **common), cfg.model.encoder, cfg.model.adapter,
                                       NUM_SAMPLES))
    assert packed["num_samples"] == unpacked["num_samples"] == NUM_SAMPLES, (packed["num_samples"], unpacked["num_samples"])
    assert packed["tokens"].shape[0] == 1 and unpacked["tokens"].shape[0] == NUM_SAMPLES

    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config

    model = build_audiollm(cfg.model, decoder_transformer_config(cfg.model.decoder, ParallelDims.of(cfg.parallel)),
                           audio_token_id=audio_token_id).eval()
    with torch.no_grad():
        loss_packed = model(packed["tokens"], packed["position_ids"], None, labels=packed["labels"],
                            audio_features=packed["audio_features"], audio_lengths=packed["audio_lengths"],
                            audio_clip_rows=[0] * len(packed["audio_lengths"]),
                            packed_seq_params=packed_seq_params(packed))
        loss_row_mask = model(**model_inputs(packed, packed["tokens"].shape[1], "cpu"))
        loss_unpacked = model(unpacked["tokens"], unpacked["position_ids"], None, labels=unpacked["labels"],
                              audio_features=unpacked["audio_features"], audio_lengths=unpacked["audio_lengths"])
    result = {
        "packed": masked_mean(loss_packed, packed["loss_mask"]).item(),
        "packed_row_mask": masked_mean(loss_row_mask, packed["loss_mask"]).item(),
        "unpacked": masked_mean(loss_unpacked, unpacked["loss_mask"]).item(),
        "masked_tokens": [int(packed["loss_mask"].sum()), int(unpacked["loss_mask"].sum())],
        "rows": [list(packed["tokens"].shape), list(unpacked["tokens"].shape)],
    }
    print("RESULT " + json.dumps(result), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
