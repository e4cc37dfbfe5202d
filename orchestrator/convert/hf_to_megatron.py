"""`audiollm convert hf-to-megatron --hf HF_DIR --out OUT_DIR [--whisper DIR] [--adapter DIR] [--peft DIR] [--verify]`

Writes an AudioLLM model directory (what `megatron-to-hf` writes by default: decoder,
encoder and adapter in one), a released speech LLM whole (Voxtral, Qwen2-Audio: its
language model, audio tower and projector; orchestrator/convert/released_dir.py), or a HF
decoder checkpoint of a family (Gemma2, Llama, Qwen2, Qwen3, Gemma 3; Gemma 3's
multimodal checkpoints give their language model), with the
encoder of a HF Whisper checkpoint, an adapter exported by `megatron-to-hf`, and a PEFT
LoRA adapter of the decoder, as one megatron
dist_checkpointing checkpoint that every TP / PP / virtual-PP layout loads
(`model.init_checkpoint`; a run with LoRA of the same rank and alpha fine-tunes the PEFT
adapter on: orchestrator/convert/peft_lora.py). With --verify,
runs the HF model and the converted model (on tp*pp local processes) on the same
random tokens; the last output line is a JSON object with max_abs_logit_diff and
loss_diff, and the exit status is 1 above the tolerance."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import torch

from orchestrator.plan.checkpoint_dirs import (ADAPTER_SUBDIR, CONVERTED_META, ENCODER_SUBDIR, checkpoint_files,
                                               file_record, write_manifest)
from orchestrator.convert.decoder_mapping import DecoderShape, hf_decoder_config, hf_to_megatron_tensors
from orchestrator.convert.audiollm_dir import MODEL_TYPE
from orchestrator.convert.released_dir import released_parts
from orchestrator.convert.released_export import keep_processor_files
from orchestrator.plan.decoder_families import family_for_hf
from orchestrator.plan.released_models import RELEASED_CONFIG, not_supported_message, released
from orchestrator.convert.hf_io import (MULTIMODAL_DECODERS, SafetensorsDir, TensorsUnder, multimodal_decoder,
                                         read_hf_config)

# Where encoder tensors sit: WhisperForConditionalGeneration, WhisperModel, a bare
# WhisperEncoder (what megatron-to-hf writes).
WHISPER_PREFIXES = ("model.encoder.", "encoder.", "")
_ENCODER_MODULES = {"conv1", "conv2", "embed_positions", "layers", "layer_norm"}


def whisper_encoder_tensors(whisper_dir: Path) -> Iterator[Tuple[str, torch.Tensor]]:
    """encoder.* tensors of a HF Whisper checkpoint."""
    source = SafetensorsDir(whisper_dir)
    for prefix in WHISPER_PREFIXES:
        names = [n for n in source.names()
                 if n.startswith(prefix) and n[len(prefix):].split(".")[0] in _ENCODER_MODULES]
        if names:
            for name in names:
                yield "encoder." + name[len(prefix):], source[name]
            return
    raise ValueError(f"{whisper_dir} holds no Whisper encoder tensors (conv1, layers, ... under "
                     f"{[p or '(no prefix)' for p in WHISPER_PREFIXES]})")


def adapter_tensors(adapter_dir: Path) -> Iterator[Tuple[str, torch.Tensor]]:
    source = SafetensorsDir(adapter_dir)
    for name in source.names():
        yield "adapter." + name, source[name]


def convert(hf_dir: Path, out_dir: Path, whisper_dir: Optional[Path] = None, adapter_dir: Optional[Path] = None,
            peft_dir: Optional[Path] = None) -> dict:
    from orchestrator.train.dist_format import write_model_tensors
    from orchestrator.convert.peft_lora import lora_targets, peft_to_megatron_lora, read_peft_adapter

    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config_dict = read_hf_config(hf_dir)
    model_type = config_dict.get("model_type")
    refusal = not_supported_message(model_type, str(hf_dir))
    if refusal:
        raise ValueError(refusal)
    whole = model_type == MODEL_TYPE  # one AudioLLM model directory (megatron-to-hf's)
    speech_llm = released(model_type)  # a released speech LLM: Voxtral, Qwen2-Audio
    if (whole or speech_llm) and (whisper_dir is not None or adapter_dir is not None):
        what = f"a {speech_llm.name} checkpoint" if speech_llm else "an AudioLLM model directory"
        raise ValueError(f"{hf_dir} is {what}: its encoder and adapter are in it (drop --whisper / --adapter)")
    # e.g. gemma-3-4b: its language model (its tensors read once the config says it is one)
    files = SafetensorsDir(hf_dir) if model_type in MULTIMODAL_DECODERS or speech_llm else None
    multimodal = multimodal_decoder(config_dict, files) if files is not None and not speech_llm else None
    parts = released_parts(hf_dir, config_dict, speech_llm, files) if speech_llm else None
    text_config = (config_dict["text_config"] if whole else parts.text_config if parts else
                   multimodal[0] if multimodal else config_dict)
    if multimodal:  # what an export writes back: the language model on its own (Gemma3ForCausalLM)
        text_config = {**text_config, "architectures": [family_for_hf(text_config["model_type"]).hf_architecture]}
    shape = DecoderShape.from_hf_config(hf_decoder_config(text_config))
    # An export of this project carries the encoder and adapter beside the decoder.
    if whisper_dir is None and (hf_dir / ENCODER_SUBDIR / "config.json").is_file():
        whisper_dir = hf_dir / ENCODER_SUBDIR
    if adapter_dir is None and (hf_dir / ADAPTER_SUBDIR).is_dir():
        adapter_dir = hf_dir / ADAPTER_SUBDIR
    files = files or SafetensorsDir(hf_dir)
    source = (TensorsUnder(files, "language_model.") if whole else parts.decoder if parts else
              multimodal[1] if multimodal else files)
    lora, lora_meta = {}, None
    if peft_dir is not None:
        lora, rank, alpha = peft_to_megatron_lora(*read_peft_adapter(Path(peft_dir)), shape)
        lora_meta = {"rank": rank, "alpha": alpha, "targets": lora_targets(lora), "source": str(Path(peft_dir).resolve())}

    def tensors():
        for name, tensor in hf_to_megatron_tensors(source, shape):
            yield "language_model." + name, tensor
        for name, tensor in lora.items():
            yield "language_model." + name, tensor.to(getattr(torch, source.dtype_name()))
        if whole:
            for part in ("encoder", "adapter"):
                under = TensorsUnder(files, part + ".")
                for name in under:
                    yield f"{part}.{name}", under[name]
        if parts is not None:
            for part, view in (("encoder", parts.encoder), ("adapter", parts.adapter)):
                for name in view:
                    yield f"{part}.{name}", view[name]
        if whisper_dir is not None:
            yield from whisper_encoder_tensors(Path(whisper_dir))
        if adapter_dir is not None:
            yield from adapter_tensors(Path(adapter_dir))

    count = write_model_tensors(out_dir, tensors(), shape.num_layers)
    held = ["decoder"] + (["encoder"] if whisper_dir or whole or parts else []) + \
        (["adapter"] if adapter_dir or whole or parts else []) + (["lora"] if lora else [])
    meta = {"format": "audiollm-dist/1", "source": str(hf_dir.resolve()), "parts": held,
            "vocab_size": shape.vocab_size, "num_layers": shape.num_layers, "tensors": count,
            "dtype": source.dtype_name()}
    if lora_meta is not None:
        meta["lora"] = lora_meta
    if parts is not None:
        meta["released"] = {"model_type": model_type, "class": speech_llm.hf_class}
        # The released model's own config.json, for the export that gives the run back as its class.
        (out_dir / RELEASED_CONFIG).write_text(json.dumps(config_dict, indent=2))
        meta["released"]["processor_files"] = keep_processor_files(hf_dir, out_dir)
        (out_dir / "whisper_config.json").write_text(json.dumps(parts.whisper_config, indent=2))
        (out_dir / "adapter_config.json").write_text(json.dumps(parts.adapter_config, indent=2))
    (out_dir / "hf_config.json").write_text(json.dumps(text_config, indent=2) if whole or multimodal or parts else
                                            (hf_dir / "config.json").read_text())
    if whole:
        (out_dir / "whisper_config.json").write_text(json.dumps(config_dict["audio_config"], indent=2))
        (out_dir / "adapter_config.json").write_text(json.dumps(config_dict["adapter_config"], indent=2))
    if whisper_dir is not None:
        (out_dir / "whisper_config.json").write_text((Path(whisper_dir) / "config.json").read_text())
    if adapter_dir is not None and (Path(adapter_dir) / "adapter_config.json").is_file():
        (out_dir / "adapter_config.json").write_text((Path(adapter_dir) / "adapter_config.json").read_text())
    (out_dir / CONVERTED_META).write_text(json.dumps(meta, indent=2) + "\n")
    # Runs that freeze these weights leave them out of their checkpoints and read them back
    # from here: the manifest is how such a run tells that this is still what it started from.
    write_manifest(out_dir, {name: file_record(out_dir / name) for name in checkpoint_files(out_dir)})
    return meta


def check_verify_layout(hf_dir: Path, tp: int, pp: int) -> None:
    """--verify at `tp` x `pp` checks the layout before anything is converted or a worker
    starts, by the rules a training run at parallel.tp, parallel.pp meets
    (orchestrator/plan/rules/topology.py): what converts and verifies is what trains.
    Raises ValueError naming them."""
    from orchestrator.convert.verify import hf_decoder_section
    from orchestrator.plan.rules.topology import check_heads, check_layers
    from orchestrator.plan.schema import ModelConfig, ParallelConfig

    model, parallel = ModelConfig(decoder=hf_decoder_section(hf_dir)), ParallelConfig(tp=tp, pp=pp)
    problems = [f.message for f in (*check_heads(parallel, model), *check_layers(parallel, model))]
    if problems:
        raise ValueError(f"--verify --tp {tp} --pp {pp} is a layout no training run of this decoder ({hf_dir}) can "
                         f"have: {'; '.join(problems)}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm convert hf-to-megatron", description=__doc__.split("\n\n")[1])
    parser.add_argument("--hf", required=True, type=Path, help="HF decoder checkpoint directory (or an AudioLLM model directory)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--whisper", type=Path, default=None,
                        help=f"HF Whisper checkpoint for encoder.* weights (default: HF_DIR/{ENCODER_SUBDIR} if present)")
    parser.add_argument("--adapter", type=Path, default=None,
                        help=f"adapter weights written by megatron-to-hf (default: HF_DIR/{ADAPTER_SUBDIR} if present)")
    parser.add_argument("--peft", type=Path, default=None,
                        help="a PEFT LoRA adapter of the decoder (adapter_config.json + adapter_model.safetensors) "
                             "to fine-tune on: a run with lora.rank and lora.alpha as printed loads it")
    parser.add_argument("--verify", action="store_true", help="compare HF and converted logits on random tokens")
    parser.add_argument("--tp", type=int, default=1, help="--verify: tensor-parallel size to load the checkpoint at")
    parser.add_argument("--pp", type=int, default=1, help="--verify: pipeline-parallel size to load the checkpoint at")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="--verify: compute dtype of both models")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max |logit difference| accepted by --verify")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="--verify sequence length (default: twice the sliding window, at most max positions)")
    args = parser.parse_args(argv)
    if args.tp < 1 or args.pp < 1:
        parser.error(f"--tp ({args.tp}) and --pp ({args.pp}) must be >= 1")
    start = time.perf_counter()
    try:
        if args.verify:
            check_verify_layout(args.hf, args.tp, args.pp)
        meta = convert(args.hf, args.out, args.whisper, args.adapter, args.peft)
    except (ValueError, FileNotFoundError) as exc:  # what the project cannot represent, named: no traceback
        print(f"not converted: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {meta['tensors']} tensors ({', '.join(meta['parts'])}; {meta['num_layers']} layers, "
          f"vocab {meta['vocab_size']}, {meta['dtype']}) in {time.perf_counter() - start:.1f} s; "
          f"loads at any TP/PP (model.init_checkpoint={args.out})")
    if "lora" in meta:
        lora = meta["lora"]
        print(f"the PEFT adapter is LoRA of rank {lora['rank']} on {', '.join(lora['targets'])}: fine-tune it on "
              f"with lora.rank={lora['rank']} lora.alpha={lora['alpha']:g} lora.targets=[{','.join(lora['targets'])}]")
    if args.verify and "lora" in meta:
        print("--verify compares the base model (the LoRA adapter is left out of the comparison)")
    if not args.verify:
        return 0
    from orchestrator.convert.verify import verify

    result = verify(args.hf, args.out, tp=args.tp, pp=args.pp, seq_len=args.seq_len, dtype=args.dtype)
    result["tolerance"] = args.tolerance
    result["ok"] = result["max_abs_logit_diff"] <= args.tolerance and result["loss_diff"] <= args.tolerance
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
