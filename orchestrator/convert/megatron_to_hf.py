"""`audiollm convert megatron-to-hf --megatron CKPT --out HF_DIR [--layout model|parts] [--lora merge|peft]`

Exports model weights to HF: CKPT is a converted checkpoint (hf-to-megatron), a
training checkpoint (RUN/checkpoints/step_N) or a run directory (its latest step),
written at any TP/PP. LoRA adapters are merged into their base weights
(W + alpha/rank * B A); with `--lora peft` the decoder's are written as a PEFT adapter
beside the un-merged base instead (orchestrator/convert/peft_lora.py; LoRA on the
encoder or the adapter is merged into them still).

`--layout model`, the default for a training checkpoint: one HF model directory that
`AutoModelForCausalLM` / `AutoProcessor.from_pretrained(HF_DIR, trust_remote_code=True)`
load as a speech-in, text-out model (orchestrator/convert/audiollm_dir.py; with
`--lora peft` its decoder's adapter goes to HF_DIR/peft_lora). `--layout parts`, the
default for a converted checkpoint (which holds no run: no tokenizer, no prompt), gets:

    config.json, model.safetensors   a HF Gemma2ForCausalLM (`from_pretrained` loads it)
    peft_lora/                       --lora peft: adapter_config.json, adapter_model.safetensors
                                     (`PeftModel.from_pretrained(gemma2, HF_DIR/peft_lora)`)
    whisper_encoder/                 the encoder as a HF WhisperEncoder (config + weights)
    audio_adapter/                   the adapter's weights and adapter_config.json
    tokenizer files                  the run's data.tokenizer (training checkpoints)

`hf-to-megatron --hf HF_DIR` reads the encoder and adapter back from there."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from orchestrator.plan.checkpoint_dirs import (ADAPTER_SUBDIR, CONVERTED_META, ENCODER_SUBDIR, checkpoint_at_step,
                                               resolve_model_checkpoint)
from orchestrator.convert.gemma2_mapping import Gemma2Shape, gemma2_hf_config, hf_gemma2_config, megatron_full_to_hf
from orchestrator.convert.hf_io import write_hf_checkpoint

_LORA = re.compile(r"^(.*)\.lora_([ab])\.weight$")


def merge_lora_tensors(state: Dict[str, torch.Tensor], scaling: Optional[float]) -> int:
    """Fold every `<linear>.lora_a/b.weight` pair into `<linear>.weight` (in place) and
    drop the adapters. The tensors are full (TP=1) ones, so W [out, in] += s * B [out, r] @ A [r, in]
    holds in every layout megatron shards them to. Returns how many were merged."""
    pairs: Dict[str, Dict[str, torch.Tensor]] = {}
    for name in [n for n in state if _LORA.match(n)]:
        base, which = _LORA.match(name).groups()
        pairs.setdefault(base, {})[which] = state.pop(name)
    if pairs and scaling is None:
        raise ValueError("the checkpoint holds LoRA adapters but no lora.alpha / lora.rank to merge them with")
    for base, ab in pairs.items():
        weight = state[base + ".weight"]
        delta = (ab["b"].double() @ ab["a"].double()) * scaling
        state[base + ".weight"] = (weight.double() + delta).to(weight.dtype)
    return len(pairs)


PEFT_SUBDIR = "peft_lora"
LORA_MODES = ("merge", "peft")
LAYOUTS = ("model", "parts")


def export_state(ckpt_dir: Path, lora_mode: str = "merge") -> dict:
    """Everything an export writes, in memory: {checkpoint, decoder (HF Gemma2 names),
    encoder (WhisperEncoder names), adapter, hf_config, whisper_config, adapter_config,
    tokenizer, lora_merged, peft (tensors, adapter_config) or None, run_config (a training
    checkpoint's run's config; None for a converted checkpoint)}. The model's config
    comes from a converted checkpoint's source configs, or from a training checkpoint's
    run (its plan.json)."""
    if lora_mode not in LORA_MODES:
        raise ValueError(f"lora mode {lora_mode!r} is not one of {LORA_MODES}")
    from orchestrator.train.dist_format import read_model_tensors

    resolved, problem = resolve_model_checkpoint(str(ckpt_dir))
    if problem:
        raise FileNotFoundError(problem)
    ckpt = Path(resolved)
    plan_path = ckpt.parent.parent / "plan.json"
    converted = (ckpt / CONVERTED_META).is_file()
    if converted:
        hf_config = json.loads((ckpt / "hf_config.json").read_text())
        whisper_config, adapter_config = (_json_or_none(ckpt / name) for name in ("whisper_config.json",
                                                                                   "adapter_config.json"))
        lora = json.loads((ckpt / CONVERTED_META).read_text()).get("lora") or {}  # an imported PEFT adapter
        tokenizer = config = None
    elif plan_path.is_file():
        config = json.loads(plan_path.read_text())["config"]
        model, lora = config["model"], config.get("lora") or {}
        tokenizer = (config.get("data") or {}).get("tokenizer")
        hf_config = gemma2_hf_config(model["decoder"], tokenizer)
        whisper_config = whisper_hf_config(model["encoder"])
        adapter_config = {k: model["adapter"][k] for k in ("frame_stack", "dropout", "ctc_weight")}
    else:
        raise FileNotFoundError(f"{ckpt}: neither {CONVERTED_META} (a converted checkpoint) nor {plan_path} "
                                f"(a training checkpoint's run) is there, so the model's config is unknown")
    state = read_model_tensors(ckpt)
    if not converted:  # a config made here: the dtype is what the run stored
        embedding = state["language_model.embedding.word_embeddings.weight"]
        hf_config["torch_dtype"] = str(embedding.dtype).replace("torch.", "")
    rank = int(lora.get("rank") or 0)
    scaling = float(lora["alpha"]) / rank if rank > 0 else None
    shape = Gemma2Shape.from_hf_config(hf_gemma2_config(hf_config))
    peft = None
    if lora_mode == "peft":
        from orchestrator.convert.peft_lora import megatron_lora_to_peft

        decoder_lora = {n: state.pop(n) for n in [n for n in state if n.startswith("language_model.") and _LORA.match(n)]}
        if scaling is None:
            raise ValueError(f"{ckpt}: no LoRA rank and alpha are recorded for it: nothing to write as PEFT")
        peft = megatron_lora_to_peft({n[len("language_model."):]: t for n, t in decoder_lora.items()}, shape, rank,
                                     float(lora["alpha"]), float(lora.get("dropout") or 0.0))
    merged = merge_lora_tensors(state, scaling)
    parts = {part: {n[len(part) + 1:]: t for n, t in state.items() if n.startswith(part + ".")}
             for part in ("language_model", "encoder", "adapter")}
    return {"checkpoint": str(ckpt), "decoder": megatron_full_to_hf(parts["language_model"], shape),
            "encoder": parts["encoder"], "adapter": parts["adapter"], "hf_config": hf_config,
            "whisper_config": whisper_config, "adapter_config": adapter_config, "tokenizer": tokenizer,
            "lora_merged": merged, "peft": peft, "run_config": config}


def _json_or_none(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def convert(ckpt_dir: Path, out_dir: Path, lora_mode: str = "merge", layout: Optional[str] = None) -> dict:
    """`layout` None: `model` for a training checkpoint, `parts` for a converted one."""
    from orchestrator.convert.peft_lora import write_peft_adapter

    if layout not in (None, *LAYOUTS):
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    out = Path(out_dir)
    state = export_state(ckpt_dir, lora_mode)
    layout = layout or ("parts" if state["run_config"] is None else "model")
    summary = {"checkpoint": state["checkpoint"], "layout": layout, "lora_merged": state["lora_merged"],
               "peft_modules": len(state["peft"][0]) // 2 if state["peft"] else 0}
    if layout == "model":
        from orchestrator.convert.audiollm_dir import write_model_dir

        summary.update(write_model_dir(out, state))
        if state["peft"] is not None:
            write_peft_adapter(out / PEFT_SUBDIR, *state["peft"])
        return summary
    write_hf_checkpoint(out, state["decoder"], json.dumps(state["hf_config"], indent=2))
    if state["peft"] is not None:
        write_peft_adapter(out / PEFT_SUBDIR, *state["peft"])
    if state["encoder"]:
        write_hf_checkpoint(out / ENCODER_SUBDIR, state["encoder"], json.dumps(state["whisper_config"] or {}, indent=2))
    if state["adapter"]:
        write_hf_checkpoint(out / ADAPTER_SUBDIR, state["adapter"], None)
        (out / ADAPTER_SUBDIR / "adapter_config.json").write_text(json.dumps(state["adapter_config"] or {}, indent=2))
    tokenizer = state["tokenizer"]
    if tokenizer and Path(tokenizer).is_dir():
        for path in Path(tokenizer).iterdir():
            if path.is_file():
                shutil.copy2(path, out / path.name)
    return {**summary, "encoder": bool(state["encoder"]), "adapter": bool(state["adapter"]),
            "tokenizer": bool(tokenizer)}


def whisper_hf_config(encoder: dict) -> dict:
    """HF WhisperConfig (as config.json) of the project's `model.encoder` section."""
    from orchestrator.models.speech import whisper_encoder_config
    from orchestrator.plan.schema.model import EncoderConfig

    fields = {k: v for k, v in encoder.items() if k in EncoderConfig.__dataclass_fields__}
    return whisper_encoder_config(EncoderConfig(**fields)).to_dict()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm convert megatron-to-hf", description=__doc__.split("\n\n")[1])
    parser.add_argument("--megatron", required=True, type=Path,
                        help="a converted checkpoint, a training checkpoint (RUN/checkpoints/step_N) or a run directory")
    parser.add_argument("--out", required=True, type=Path, help="output HF directory")
    parser.add_argument("--step", default=None,
                        help="with a run directory: the checkpoint at this step, or `best`, the one `audiollm eval "
                             "RUN --all` chose (RUN/eval/best.json); default: the latest")
    parser.add_argument("--lora", choices=LORA_MODES, default="merge",
                        help=f"merge LoRA into the weights (default), or write the decoder's as a PEFT adapter "
                             f"(HF_DIR/{PEFT_SUBDIR}) beside the un-merged base")
    parser.add_argument("--layout", choices=LAYOUTS, default=None,
                        help="model: one HF model directory (AutoModelForCausalLM and AutoProcessor with "
                             "trust_remote_code=True; the default for a training checkpoint); parts: the decoder as "
                             "a Gemma2ForCausalLM directory with whisper_encoder/ and audio_adapter/ beside it (the "
                             "default for a converted checkpoint)")
    args = parser.parse_args(argv)
    try:
        source = checkpoint_at_step(args.megatron, args.step) if args.step is not None else args.megatron
        result = convert(source, args.out, args.lora, args.layout)
    except (ValueError, FileNotFoundError) as exc:  # what to fix, named: no traceback
        print(str(exc), file=sys.stderr)
        return 2
    if result["layout"] == "model":
        extra = [f"{PEFT_SUBDIR}/ ({result['peft_modules']} LoRA modules)"] if result["peft_modules"] else []
        print(f"wrote {args.out} from {result['checkpoint']}: one AudioLLM model directory"
              f"{' with its processor' if result['processor'] else ' (no tokenizer: no processor)'}"
              f"{', ' + ', '.join(extra) if extra else ''}"
              f"{'; LoRA merged into %d linears' % result['lora_merged'] if result['lora_merged'] else ''}; load it "
              f"with AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
        return 0
    parts = ["Gemma2"] + ([f"{PEFT_SUBDIR}/ ({result['peft_modules']} LoRA modules)"] if result["peft_modules"] else []) \
        + (["whisper_encoder/"] if result["encoder"] else []) + \
        (["audio_adapter/"] if result["adapter"] else []) + (["tokenizer"] if result["tokenizer"] else [])
    print(f"wrote {args.out} from {result['checkpoint']}: {', '.join(parts)}"
          f"{'; LoRA merged into %d linears' % result['lora_merged'] if result['lora_merged'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
