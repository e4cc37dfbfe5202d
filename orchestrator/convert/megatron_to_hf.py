"""`audiollm convert megatron-to-hf --megatron CKPT_DIR --out HF_DIR`

Merges a checkpoint written by `hf-to-megatron` (any TP/PP) back into a HF Gemma2
directory: config.json as it came in and the tensors as safetensors, bit-identical to
the source. The Whisper encoder, if present, is written to HF_DIR/whisper_encoder/
(encoder.* names, with the source Whisper config.json)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from orchestrator.convert.checkpoint import read_meta, read_shards
from orchestrator.convert.gemma2_mapping import Gemma2Shape, hf_gemma2_config, megatron_full_to_hf, unshard_megatron
from orchestrator.convert.hf_io import write_hf_checkpoint


def megatron_dir_to_hf_state(ckpt_dir: Path):
    """(HF Gemma2 state dict, encoder state dict, config.json text) of a converted checkpoint."""
    import json

    read_meta(ckpt_dir)
    config_text = (Path(ckpt_dir) / "hf_config.json").read_text()
    shape = Gemma2Shape.from_hf_config(hf_gemma2_config(json.loads(config_text)))
    shards = read_shards(ckpt_dir)
    decoder = {k: {n[len("language_model."):]: t for n, t in sd.items() if n.startswith("language_model.")}
               for k, sd in shards.items()}
    encoder = {n: t for n, t in shards[(0, 0)].items() if n.startswith("encoder.")}
    return megatron_full_to_hf(unshard_megatron(decoder, shape), shape), encoder, config_text


def convert(ckpt_dir: Path, out_dir: Path) -> None:
    hf_state, encoder, config_text = megatron_dir_to_hf_state(ckpt_dir)
    write_hf_checkpoint(out_dir, hf_state, config_text)
    if encoder:
        whisper_cfg = Path(ckpt_dir) / "whisper_config.json"
        write_hf_checkpoint(Path(out_dir) / "whisper_encoder", encoder,
                            whisper_cfg.read_text() if whisper_cfg.is_file() else "{}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm convert megatron-to-hf", description=__doc__.split("\n\n")[1])
    parser.add_argument("--megatron", required=True, type=Path, help="checkpoint written by hf-to-megatron")
    parser.add_argument("--out", required=True, type=Path, help="output HF directory")
    args = parser.parse_args(argv)
    convert(args.megatron, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
