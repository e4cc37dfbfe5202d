"""Data pipeline throughput on one core, next to HF's WhisperFeatureExtractor.

    PYTHONPATH=. python benchmarks/data_pipeline.py [--data outputs/demo_data] [--clips 256]

Reads clips of the demo corpus (synthesizes a small one in a temp directory when
--data does not exist), then times each stage single-threaded: decode (FLAC ->
float), log-mel (batched torch STFT), HF WhisperFeatureExtractor on the same clips,
prompt tokenization, packing, and the whole training loader end to end. Prints one
table, plus the token utilization of the demo mixture with and without packing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _timed(fn, repeat: int = 1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("AUDIOLLM_DEMO_DATA", "outputs/demo_data"))
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--batches", type=int, default=30, help="micro-batches for the utilization figures")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # per-core figures

    from omegaconf import OmegaConf
    from streaming import StreamingDataset
    from transformers import WhisperFeatureExtractor

    from orchestrator.data import mel
    from orchestrator.data.audio import decode_bytes
    from orchestrator.data.loader import build_train_loader
    from orchestrator.data.packing import Example, Packer, collate
    from orchestrator.data.prompts import PromptBuilder, audio_placeholder_count
    from orchestrator.data.sources import single_rank_world
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.schema.data import DataConfig, DatasetEntry
    from orchestrator.schema.model import AdapterConfig, EncoderConfig

    root = Path(args.data)
    if not (root / "train").is_dir():
        from orchestrator.data.demo import write_corpus

        root = Path(tempfile.mkdtemp(prefix="audiollm-bench-")) / "demo"
        print(f"{args.data} has no demo corpus; synthesizing a small one in {root}", file=sys.stderr)
        write_corpus(root, num_samples=max(args.clips, 200), num_val_samples=0, progress=False)
    train_dirs = sorted(p for p in (root / "train").iterdir() if (p / "index.json").is_file())

    raw = []
    with single_rank_world():
        for d in train_dirs:
            ds = StreamingDataset(local=str(d), shuffle=False)
            raw += [ds[i] for i in range(min(len(ds), args.clips // len(train_dirs) + 1))]
    raw = raw[: args.clips]
    n = len(raw)
    tok = load_tokenizer(root / "tokenizer")
    rows = []

    t_dec, clips = _timed(lambda: [decode_bytes(s["audio"])[0] for s in raw])
    rows.append(("decode FLAC -> float32", t_dec))
    for bins, window in ((80, 500), (128, 3000)):
        def ours():
            for i in range(0, n, 16):
                mel.features(clips[i:i + 16], bins, window)
        t_mel, _ = _timed(ours, repeat=2)
        hf = WhisperFeatureExtractor(feature_size=bins, chunk_length=window // 100)
        t_hf, _ = _timed(lambda: [hf(c, sampling_rate=16000, return_tensors="np") for c in clips], repeat=2)
        rows.append((f"log-mel {bins} bins, {window // 100}-s window (ours, batched)", t_mel))
        rows.append((f"log-mel {bins} bins, {window // 100}-s window (HF WhisperFeatureExtractor)", t_hf))
        if bins == 80:
            ref = hf(clips[:16], sampling_rate=16000, return_tensors="np")["input_features"]
            diff = float(np.abs(mel.features(clips[:16], bins, window)[0].numpy() - ref).max())
    builder = PromptBuilder(tok, DataConfig().prompt_template)
    t_tok, tokenized = _timed(lambda: [builder.build(s["text"], [audio_placeholder_count(c.shape[0], 250, 5)])
                                       for s, c in zip(raw, clips)])
    rows.append(("prompt + tokenize", t_tok))

    def pack():
        packer = Packer(256, 16, 256)
        for i, t in enumerate(tokenized):
            packer.add(Example(i, 0, t, []))
        while packer.buffer:
            collate(packer.pop_rows(), 256, 0, 1, ["d"], builder.audio_token_id, num_rows=16)
    t_pack, _ = _timed(pack)
    rows.append(("pack + collate (seq 256, 16 rows)", t_pack))

    def data_cfg(packing: bool):
        cfg = OmegaConf.structured(DataConfig)
        cfg.train = [OmegaConf.structured(DatasetEntry(name=d.name, path=str(d))) for d in train_dirs]
        cfg.tokenizer, cfg.seq_length, cfg.max_audio_seconds, cfg.packing = str(root / "tokenizer"), 256, 5.0, packing
        return cfg
    enc = OmegaConf.structured(EncoderConfig(d_model=1, num_layers=1, num_heads=1, ffn_dim=1, num_mel_bins=80,
                                             max_source_positions=250))
    ada = OmegaConf.structured(AdapterConfig(frame_stack=5))
    utilization = {}
    for packing in (True, False):
        loader = build_train_loader(data_cfg(packing), enc, ada, micro_batch_size=16, seed=0)
        start, samples, used, slots = time.perf_counter(), 0, 0, 0
        for _ in range(args.batches):
            b = next(loader)
            samples, used, slots = samples + b["num_samples"], used + b["num_tokens"], slots + b["tokens"].numel()
        elapsed = time.perf_counter() - start
        utilization[packing] = used / slots
        if packing:
            rows.append((f"whole loader (decode+mel+tokenize+pack), {samples} samples", elapsed * n / samples))

    print(f"\nData pipeline, one core (torch threads = 1), {n} demo clips "
          f"(mean {np.mean([c.shape[0] for c in clips]) / 16000:.2f} s)\n")
    print(f"{'stage':<62} {'samples/s':>10}")
    print("-" * 73)
    for name, seconds in rows:
        print(f"{name:<62} {n / seconds:>10.1f}")
    ours80, hf80 = rows[1][1], rows[2][1]
    ours128, hf128 = rows[3][1], rows[4][1]
    print("-" * 73)
    print(f"{'speed-up vs HF, 80 bins / 5 s':<62} {hf80 / ours80:>9.1f}x")
    print(f"{'speed-up vs HF, 128 bins / 30 s':<62} {hf128 / ours128:>9.1f}x")
    print(f"{'max |ours - HF| (80 bins, 5 s)':<62} {diff:>10.2e}")
    print(f"{'token utilization, packed (seq 256, 16 rows)':<62} {100 * utilization[True]:>9.1f}%")
    print(f"{'token utilization, one sample per row':<62} {100 * utilization[False]:>9.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
