"""Records, in a training micro-batch's forward and backward of the AudioLLM, every read
of a tensor's value on the host (.item(), .tolist(), int(), bool(), float() of a tensor)
and every operation whose output shape depends on the data (nonzero, masked_select,
unique): on a GPU each makes the host wait for the GPU's queue. Run on one CPU process
by tests/models/test_host_syncs.py; reported with the file and line of the project's
code that made it. (On a CPU every tensor is a host tensor: the test tells host-side
draws from their device reads by where they happen.)"""

import json
import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import init_distributed, shutdown

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select", "unique",
         "unique_consecutive", "equal", "argwhere"}


class RecordReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            here = [f for f in traceback.extract_stack()[:-1] if "/orchestrator/" in f.filename]
            where = f"{here[-1].filename.split('/orchestrator/')[-1]}:{here[-1].lineno}" if here else "outside"
            self.seen[f"{name} at {where}"] += 1
        return func(*args, **(kwargs or {}))


def packed_batch(audio_token_id: int, vocab: int, mel_bins: int, window: int, frame_stack: int):
    """Two rows of 48 tokens: row 0 packs two samples with a clip each, row 1 one sample
    with a clip and tail padding."""
    from orchestrator.plan.model_params import audio_token_count

    gen = torch.Generator().manual_seed(0)
    mels = [120, 200, 160]
    counts = [audio_token_count(m, frame_stack) for m in mels]
    tokens = torch.randint(10, vocab, (2, 48), generator=gen)
    positions = torch.zeros(2, 48, dtype=torch.long)
    layout = [(0, 0, 20, 0), (0, 20, 28, 1), (1, 0, 40, 2)]  # (row, start, length, clip)
    for row, start, length, clip in layout:
        positions[row, start:start + length] = torch.arange(length)
        tokens[row, start + 2: start + 2 + counts[clip]] = audio_token_id
    return {"tokens": tokens, "labels": torch.roll(tokens, -1, 1), "position_ids": positions, "packed": True,
            "audio_features": torch.randn(3, mel_bins, window, generator=gen),
            "audio_lengths": torch.tensor(mels), "audio_num_tokens": torch.tensor(counts),
            "audio_clip_rows": torch.tensor([0, 0, 1]), "audio_clip_keys": torch.tensor([[0, 0], [1, 0], [2, 0]])}


def main():
    init_distributed(ParallelDims(), seed=0)
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import to_object
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.train.audiollm_provider import clip_seeds, model_inputs

    # The default recipe's model: SpecAugment, adapter dropout, masked encoder, trained encoder.
    cfg = to_object(compose(["+recipe=tiny_cpu"]))
    model = build_audiollm(cfg.model, decoder_transformer_config(cfg.model.decoder, ParallelDims.of(cfg.parallel)),
                           audio_token_id=3).train()
    enc = cfg.model.encoder
    batch = packed_batch(3, cfg.model.decoder.vocab_size, enc.num_mel_bins, 2 * enc.max_source_positions,
                         cfg.model.adapter.frame_stack)
    inputs = model_inputs(batch, 48, "cpu")
    inputs["audio_seeds"] = clip_seeds(batch["audio_clip_keys"], 1234)
    counter = RecordReads()
    with counter:
        loss = model(**inputs)
        loss.sum().backward()
    print("RESULT " + json.dumps({"reads": dict(counter.seen), "loss": float(loss.sum())}))
    shutdown()


if __name__ == "__main__":
    main()
