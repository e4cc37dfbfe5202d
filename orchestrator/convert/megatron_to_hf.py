"""`audiollm convert megatron-to-hf --megatron CKPT --out HF_DIR [--layout model|parts|released] [--lora merge|peft]`

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

    config.json, model.safetensors   the decoder's HF model (Gemma2ForCausalLM, LlamaForCausalLM)
    peft_lora/                       --lora peft: adapter_config.json, adapter_model.safetensors
                                     (`PeftModel.from_pretrained(decoder, HF_DIR/peft_lora)`)
    whisper_encoder/                 the encoder as a HF WhisperEncoder (config + weights)
    audio_adapter/                   the adapter's weights and adapter_config.json
    tokenizer files                  the run's data.tokenizer (training checkpoints)

`hf-to-megatron --hf HF_DIR` reads the encoder and adapter back from there.

`--layout released`, the default for a model that started from a released Voxtral or
Qwen2-Audio (a converted checkpoint of one, or a run whose model.init_checkpoint leads back
to one): that class's directory, which plain transformers loads without remote code
(orchestrator/convert/released_export.py). A model of such an adapter kind goes back this
way only.

Either layout streams (`Export`): the checkpoint is read a decoder layer's rows (or an
encoder layer, the embedding, the adapter) at a time and written into 2-GiB shards as
they fill, so the peak memory is one shard and the largest tensor twice, not the model
(benchmarks/export_full_size.py)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from orchestrator.plan.adapter_kinds import dropout, frame_stack, kind_name
from orchestrator.plan.released_models import released_class
from orchestrator.convert.released_export import released_origin
from orchestrator.plan.checkpoint_dirs import (ADAPTER_SUBDIR, CONVERTED_META, ENCODER_SUBDIR, checkpoint_at_step,
                                               resolve_model_checkpoint)
from orchestrator.convert.decoder_mapping import DecoderShape, decoder_hf_config, hf_decoder_config, megatron_tensor_to_hf
from orchestrator.convert.hf_io import ShardWriter

_LORA = re.compile(r"^(.*)\.lora_([ab])\.weight$")
_ENCODER_LAYER = re.compile(r"^(encoder\.layers\.\d+)\.")
DECODER = "language_model."


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
LAYOUTS = ("model", "parts", "released")


class Export:
    """What an export of a megatron checkpoint writes: its configs, read at once, and its
    tensors, read one group at a time by `tensors()` (a decoder layer's rows, the
    decoder's embedding and final norm, an encoder layer, the adapter) so that a
    full-size export holds one group and the shard being written, never the model.

    Attributes: checkpoint (the resolved directory), hf_config (the decoder's HF config),
    whisper_config, adapter_config, tokenizer (the run's data.tokenizer), run_config (a
    training checkpoint's run's config; None for a converted checkpoint), lora_mode,
    lora_merged (linears merged so far). The model's config comes from a converted
    checkpoint's source configs, or from a training checkpoint's run (its plan.json)."""

    def __init__(self, ckpt_dir: Path, lora_mode: str = "merge"):
        from orchestrator.train.dist_format import process_group, stored_model_tensors

        if lora_mode not in LORA_MODES:
            raise ValueError(f"lora mode {lora_mode!r} is not one of {LORA_MODES}")
        resolved, problem = resolve_model_checkpoint(str(ckpt_dir))
        if problem:
            raise FileNotFoundError(problem)
        ckpt = self.checkpoint = Path(resolved)
        plan_path = ckpt.parent.parent / "plan.json"
        if (ckpt / CONVERTED_META).is_file():
            self.hf_config = json.loads((ckpt / "hf_config.json").read_text())
            self.whisper_config, self.adapter_config = (_json_or_none(ckpt / name) for name in
                                                        ("whisper_config.json", "adapter_config.json"))
            lora = json.loads((ckpt / CONVERTED_META).read_text()).get("lora") or {}  # an imported PEFT adapter
            self.tokenizer = self.run_config = None
        elif plan_path.is_file():
            config = self.run_config = json.loads(plan_path.read_text())["config"]
            model, lora = config["model"], config.get("lora") or {}
            self.tokenizer = (config.get("data") or {}).get("tokenizer")
            self.hf_config = decoder_hf_config(model["decoder"], self.tokenizer)
            self.whisper_config = whisper_hf_config(model["encoder"])
            self.adapter_config = {"kind": kind_name(model["adapter"]), "frame_stack": frame_stack(model["adapter"]),
                                   "dropout": dropout(model["adapter"]), "ctc_weight": model["adapter"].get("ctc_weight", 0.0)}
        else:
            raise FileNotFoundError(f"{ckpt}: neither {CONVERTED_META} (a converted checkpoint) nor {plan_path} "
                                    f"(a training checkpoint's run) is there, so the model's config is unknown")
        self.adapter_kind = kind_name(self.adapter_config or {})
        # The converted checkpoint of the released model (Voxtral, Qwen2-Audio) it started from:
        # only a model of a released kind has one (the project's own kind never reads the chain,
        # which may name checkpoints long deleted).
        self.released_origin = released_origin(ckpt) if self.adapter_kind != "layer_mix" else None
        with process_group():
            self.stored = stored_model_tensors(ckpt)
        if self.run_config is not None:  # a config made here: the dtype is what the run stored
            self.hf_config["torch_dtype"] = self.stored_dtype()
        self.lora = lora
        rank = int(lora.get("rank") or 0)
        self.scaling = float(lora["alpha"]) / rank if rank > 0 else None
        self.shape = DecoderShape.from_hf_config(hf_decoder_config(self.hf_config))
        self.lora_mode, self.lora_merged = lora_mode, 0
        self.layout = self.default_layout()  # what convert() writes; peft_adapter() names modules by it
        self._peft_factors: Dict[str, torch.Tensor] = {}
        if lora_mode == "peft" and self.scaling is None:
            raise ValueError(f"{ckpt}: no LoRA rank and alpha are recorded for it: nothing to write as PEFT")

    def stored_dtype(self) -> str:
        """The dtype the checkpoint stores its weights in (its embedding's), as HF names it."""
        return str(self.stored[DECODER + "embedding.word_embeddings.weight"].dtype).replace("torch.", "")

    def default_layout(self) -> str:
        """released for a model that started from a released speech LLM, model for a
        training checkpoint, parts for a converted one."""
        if self.released_origin is not None:
            return "released"
        return "parts" if self.run_config is None else "model"

    def check_layout(self, layout: str) -> None:
        """Refuses a layout that cannot hold this checkpoint's adapter kind, naming the one that does."""
        if layout != "released" and self.adapter_kind != "layer_mix":  # (hf_model/ holds the project's own adapter only)
            how = ("--layout released (the default here)" if self.released_origin is not None else
                   f"a run that started from a released {released_class(self.adapter_kind)} (model.init_checkpoint "
                   f"= its converted checkpoint), exported with --layout released")
            raise ValueError(f"{self.checkpoint}: its adapter is of kind {self.adapter_kind} (model.adapter.kind), "
                             f"which --layout {layout} cannot hold; it goes back as {released_class(self.adapter_kind)}: "
                             f"{how}")

    def has(self, part: str) -> bool:
        """Whether the checkpoint holds tensors of `part` (language_model, encoder, adapter)."""
        return any(key.startswith(part + ".") for key in self.stored)

    def _groups(self) -> Iterator[Dict[str, torch.Tensor]]:
        from orchestrator.train.dist_format import LAYERS, process_group, read_stored_tensors

        stacked = [key for key in self.stored if key.startswith(LAYERS)]
        groups: Dict[str, List[str]] = {}
        for key in self.stored:
            if not key.startswith(LAYERS):
                match = _ENCODER_LAYER.match(key)
                groups.setdefault(match.group(1) if match else key.split(".")[0], []).append(key)
        with process_group():
            yield read_stored_tensors(self.checkpoint, self.stored, groups.pop("language_model", []))
            for layer in range(self.stored[stacked[0]].global_shape[0] if stacked else 0):
                yield read_stored_tensors(self.checkpoint, self.stored, stacked, layer)
            # The encoder's groups, then the adapter's: each part's tensors come together.
            for _, keys in sorted(groups.items(), key=lambda item: item[0].startswith("adapter")):
                yield read_stored_tensors(self.checkpoint, self.stored, keys)

    def tensors(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """(name, tensor) of the exported model, group by group: `language_model.<HF
        Gemma2 name>` (no tied lm_head), `encoder.<WhisperEncoder name>`, `adapter.<name>`;
        LoRA merged, or with lora_mode "peft" the decoder's kept for peft_adapter()."""
        for group in self._groups():
            if self.lora_mode == "peft":
                self._peft_factors.update({name: group.pop(name) for name in list(group)
                                           if name.startswith(DECODER) and _LORA.match(name)})
            self.lora_merged += merge_lora_tensors(group, self.scaling)
            for name, tensor in group.items():
                if name.startswith(DECODER):
                    for hf_name, hf_tensor in megatron_tensor_to_hf(name[len(DECODER):], tensor, self.shape):
                        yield DECODER + hf_name, hf_tensor
                else:
                    yield name, tensor

    def peft_adapter(self) -> Optional[Tuple[Dict[str, torch.Tensor], dict]]:
        """(PEFT tensors, adapter_config) of the decoder's LoRA, once tensors() has run
        (lora_mode "peft"); None otherwise."""
        if self.lora_mode != "peft":
            return None
        from orchestrator.convert.peft_lora import DECODER_LAYERS, RELEASED_DECODER_LAYERS, megatron_lora_to_peft

        return megatron_lora_to_peft({n[len(DECODER):]: t for n, t in self._peft_factors.items()}, self.shape,
                                     int(self.lora["rank"]), float(self.lora["alpha"]),
                                     float(self.lora.get("dropout") or 0.0),
                                     RELEASED_DECODER_LAYERS if self.layout == "released" else DECODER_LAYERS)


def _json_or_none(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def convert(ckpt_dir: Path, out_dir: Path, lora_mode: str = "merge", layout: Optional[str] = None) -> dict:
    """`layout` None: Export.default_layout()."""
    from orchestrator.convert.peft_lora import write_peft_adapter

    if layout not in (None, *LAYOUTS):
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    out = Path(out_dir)
    export = Export(ckpt_dir, lora_mode)
    layout = export.layout = layout or export.default_layout()
    export.check_layout(layout)
    if layout == "released":
        from orchestrator.convert.released_export import write_released_dir

        summary = write_released_dir(out, export)
    elif layout == "model":
        from orchestrator.convert.audiollm_dir import write_model_dir

        summary = write_model_dir(out, export)
    else:
        summary = _write_parts(out, export)
    peft = export.peft_adapter()
    if peft is not None:
        write_peft_adapter(out / PEFT_SUBDIR, *peft)
    return {**summary, "checkpoint": str(export.checkpoint), "layout": layout, "lora_merged": export.lora_merged,
            "peft_modules": len(peft[0]) // 2 if peft else 0}


def _write_parts(out: Path, export: Export) -> dict:
    """The decoder as a HF Gemma2 directory, whisper_encoder/ and audio_adapter/ beside it."""
    places = {DECODER: out, "encoder.": out / ENCODER_SUBDIR, "adapter.": out / ADAPTER_SUBDIR}
    writers: Dict[str, ShardWriter] = {}
    for name, tensor in export.tensors():
        prefix = next(p for p in places if name.startswith(p))
        if prefix not in writers:  # the parts come one after the other: one shard held at a time
            for writer in writers.values():
                writer.close()
            writers[prefix] = ShardWriter(places[prefix])
        writers[prefix].add(name[len(prefix):], tensor)
    for writer in writers.values():
        writer.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(export.hf_config, indent=2))
    if "encoder." in writers:
        (out / ENCODER_SUBDIR / "config.json").write_text(json.dumps(export.whisper_config or {}, indent=2))
    if "adapter." in writers:
        (out / ADAPTER_SUBDIR / "adapter_config.json").write_text(json.dumps(export.adapter_config or {}, indent=2))
    tokenizer = export.tokenizer
    if tokenizer and Path(tokenizer).is_dir():
        for path in Path(tokenizer).iterdir():
            if path.is_file():
                shutil.copy2(path, out / path.name)
    return {"encoder": "encoder." in writers, "adapter": "adapter." in writers, "tokenizer": bool(tokenizer),
            "decoder_class": export.hf_config.get("architectures", ["Gemma2ForCausalLM"])[0]}


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
                             "default for a converted checkpoint); released: the released class a model converted "
                             "from Voxtral or Qwen2-Audio came from, with its processor (the default for one)")
    args = parser.parse_args(argv)
    try:
        source = checkpoint_at_step(args.megatron, args.step) if args.step is not None else args.megatron
        result = convert(source, args.out, args.lora, args.layout)
    except (ValueError, FileNotFoundError) as exc:  # what to fix, named: no traceback
        print(str(exc), file=sys.stderr)
        return 2
    if result["layout"] == "released":
        extra = [f"{PEFT_SUBDIR}/ ({result['peft_modules']} LoRA modules)"] if result["peft_modules"] else []
        cls = result["class"]
        print(f"wrote {args.out} from {result['checkpoint']}: {cls}, as released ({result['origin']})"
              f"{' with its processor files' if result['processor_files'] else ' (the release kept no processor files)'}"
              f"{', ' + ', '.join(extra) if extra else ''}"
              f"{'; LoRA merged into %d linears' % result['lora_merged'] if result['lora_merged'] else ''}"
              f"{'; left out: the CTC head (model.adapter.ctc_weight), which the class has no place for' if result['left_out'] else ''}"
              f"; load it with {cls}.from_pretrained({str(args.out)!r}) and "
              f"AutoProcessor.from_pretrained({str(args.out)!r})")
        return 0
    if result["layout"] == "model":
        extra = [f"{PEFT_SUBDIR}/ ({result['peft_modules']} LoRA modules)"] if result["peft_modules"] else []
        print(f"wrote {args.out} from {result['checkpoint']}: one AudioLLM model directory"
              f"{' with its processor' if result['processor'] else ' (no tokenizer: no processor)'}"
              f"{', ' + ', '.join(extra) if extra else ''}"
              f"{'; LoRA merged into %d linears' % result['lora_merged'] if result['lora_merged'] else ''}; load it "
              f"with AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
        return 0
    parts = [result["decoder_class"]] + ([f"{PEFT_SUBDIR}/ ({result['peft_modules']} LoRA modules)"] if result["peft_modules"] else []) \
        + (["whisper_encoder/"] if result["encoder"] else []) + \
        (["audio_adapter/"] if result["adapter"] else []) + (["tokenizer"] if result["tokenizer"] else [])
    print(f"wrote {args.out} from {result['checkpoint']}: {', '.join(parts)}"
          f"{'; LoRA merged into %d linears' % result['lora_merged'] if result['lora_merged'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
