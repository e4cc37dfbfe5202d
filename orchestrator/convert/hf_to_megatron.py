"""`audiollm convert hf-to-megatron --hf HF_DIR --out OUT_DIR [--tp N] [--pp M] [--whisper DIR] [--verify]`

Writes the project's per-rank megatron checkpoint (see orchestrator.convert.checkpoint)
from a HF Gemma2 checkpoint, optionally with the encoder of a HF Whisper checkpoint.
With --verify, runs the HF model and the converted megatron model (on tp*pp local
processes) on the same random tokens; the last output line is a JSON object with
max_abs_logit_diff and loss_diff, and the exit status is 1 above the tolerance."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from orchestrator.convert.checkpoint import write_checkpoint
from orchestrator.convert.gemma2_mapping import (Gemma2Shape, check_divisibility, hf_gemma2_config,
                                                 hf_to_megatron_full, shard_megatron)
from orchestrator.convert.hf_io import read_hf_config, read_hf_state_dict
from orchestrator.megatron_args import padded_vocab_size

WHISPER_PREFIXES = ("model.encoder.", "encoder.")


def whisper_encoder_state(whisper_dir: Path) -> Dict[str, torch.Tensor]:
    """encoder.* tensors of a HF Whisper checkpoint (WhisperModel or WhisperForConditionalGeneration)."""
    state = read_hf_state_dict(whisper_dir)
    for prefix in WHISPER_PREFIXES:
        found = {"encoder." + k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if found:
            return found
    raise ValueError(f"{whisper_dir} holds no Whisper encoder tensors (looked for {WHISPER_PREFIXES})")


def convert(hf_dir: Path, out_dir: Path, tp: int = 1, pp: int = 1, whisper_dir: Optional[Path] = None) -> dict:
    config_text = (Path(hf_dir) / "config.json").read_text() if (Path(hf_dir) / "config.json").is_file() else None
    hf_cfg = hf_gemma2_config(read_hf_config(hf_dir))
    shape = Gemma2Shape.from_hf_config(hf_cfg)
    check_divisibility(shape, tp, pp)
    hf_state = read_hf_state_dict(hf_dir)
    hf_state.pop("lm_head.weight", None)  # tied to the embedding
    full = hf_to_megatron_full(hf_state, shape)
    shards = shard_megatron(full, shape, tp, pp)
    shards = {key: {"language_model." + k: v for k, v in sd.items()} for key, sd in shards.items()}
    meta = {"tp": tp, "pp": pp, "vocab_size": shape.vocab_size, "padded_vocab_size": padded_vocab_size(shape.vocab_size, tp),
            "num_layers": shape.num_layers, "has_encoder": whisper_dir is not None,
            "dtype": str(next(iter(full.values())).dtype).replace("torch.", "")}
    if whisper_dir is not None:
        encoder = whisper_encoder_state(Path(whisper_dir))
        for t in range(tp):  # the encoder is replicated over TP, first pipeline stage only
            shards[(t, 0)].update(encoder)
    write_checkpoint(out_dir, shards, meta)
    (Path(out_dir) / "hf_config.json").write_text(config_text)
    if whisper_dir is not None:
        (Path(out_dir) / "whisper_config.json").write_text((Path(whisper_dir) / "config.json").read_text())
    return meta


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm convert hf-to-megatron", description=__doc__.split("\n\n")[1])
    parser.add_argument("--hf", required=True, type=Path, help="HF Gemma2 checkpoint directory")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size to shard for")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to shard for")
    parser.add_argument("--whisper", type=Path, default=None, help="HF Whisper checkpoint for encoder.* weights")
    parser.add_argument("--verify", action="store_true", help="compare HF and converted logits on random tokens")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max |logit difference| accepted by --verify")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="--verify sequence length (default: twice the sliding window, at most max positions)")
    args = parser.parse_args(argv)
    if args.tp < 1 or args.pp < 1:
        parser.error(f"--tp ({args.tp}) and --pp ({args.pp}) must be >= 1")
    meta = convert(args.hf, args.out, args.tp, args.pp, args.whisper)
    print(f"wrote {args.out} (tp={meta['tp']}, pp={meta['pp']}, {meta['num_layers']} layers, "
          f"vocab {meta['vocab_size']} padded to {meta['padded_vocab_size']}, encoder: {meta['has_encoder']})")
    if not args.verify:
        return 0
    from orchestrator.convert.verify import verify

    result = verify(args.hf, args.out, seq_len=args.seq_len)
    result["tolerance"] = args.tolerance
    result["ok"] = result["max_abs_logit_diff"] <= args.tolerance and result["loss_diff"] <= args.tolerance
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
