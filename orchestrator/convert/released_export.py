"""A checkpoint whose model started from a released speech LLM (Voxtral, Qwen2-Audio:
orchestrator/plan/released_models.py) given back as that class (`audiollm convert
megatron-to-hf`'s default for such a checkpoint): a directory that plain transformers
loads with `VoxtralForConditionalGeneration` / `Qwen2AudioForConditionalGeneration` (or
`AutoModel...`) and `AutoProcessor`, without remote code.

    config.json              the released model's own config.json (hf-to-megatron kept it
                             in the converted checkpoint), its dtype the checkpoint's
    model.safetensors        the hub's names: language_model.model.* and
                             language_model.lm_head.weight (the decoder's HF names under
                             language_model.), audio_tower.* (the encoder), multi_modal_projector.*
                             (the adapter; a CTC head, which the class has no place for,
                             left out); shards of 2 GiB with an index above that, written
                             as the checkpoint is read
    processor and tokenizer  the released directory's own files (preprocessor_config.json,
    files, generation_config tokenizer files, tekken.json, chat template), as hf-to-megatron
                             kept them (PROCESSOR_SUBDIR)

The released model is found by following the checkpoint back: a converted checkpoint holds
its config; a training checkpoint's run started from `model.init_checkpoint`, which is
either such a converted checkpoint or another run's checkpoint, followed in turn. The hub's
tensor names are what transformers 4 writes and what transformers 5 loads (its conversion
mapping renames them), so hf-to-megatron of this directory is the same as of the release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from orchestrator.convert.hf_io import ShardWriter
from orchestrator.plan.checkpoint_dirs import resolve_model_checkpoint
from orchestrator.plan.released_models import RELEASED_CONFIG

# In a converted checkpoint: the released directory's processor and tokenizer files.
PROCESSOR_SUBDIR = "released_processor"
# The released directory's files that are not weights and not config.json: what its processor,
# tokenizer and generation defaults are made of.
PROCESSOR_FILE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
NOT_PROCESSOR_FILES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")

# The checkpoint's part (orchestrator/convert/megatron_to_hf.Export.tensors names) -> where
# the released class keeps it.
RELEASED_NAMES = {"language_model.": "language_model.", "encoder.": "audio_tower.", "adapter.": "multi_modal_projector."}

# A run with model.adapter.ctc_weight > 0 trained a CTC head on the adapter's output; the
# released class has no place for it and decodes with its decoder alone.
CTC_HEAD = "adapter.ctc_head."

_MOST_RUNS_BACK = 32  # a chain of runs each started from the last; longer is a loop


def keep_processor_files(hf_dir: Path, out_dir: Path) -> list:
    """Copy a released directory's processor and tokenizer files into a converted
    checkpoint (out_dir/PROCESSOR_SUBDIR); returns their names."""
    names = sorted(p.name for p in Path(hf_dir).iterdir() if p.is_file() and p.name not in NOT_PROCESSOR_FILES
                   and p.name.endswith(PROCESSOR_FILE_SUFFIXES))
    if names:
        (out_dir / PROCESSOR_SUBDIR).mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copy2(Path(hf_dir) / name, out_dir / PROCESSOR_SUBDIR / name)
    return names


def released_origin(checkpoint: Path) -> Optional[Path]:
    """The converted checkpoint of a released model that `checkpoint`'s weights started
    from (it holds RELEASED_CONFIG), following runs back through model.init_checkpoint;
    None when they started from none."""
    seen = []
    ckpt = Path(checkpoint)
    while len(seen) < _MOST_RUNS_BACK:
        if (ckpt / RELEASED_CONFIG).is_file():
            return ckpt
        seen.append(ckpt)
        plan = ckpt.parent.parent / "plan.json"
        if not plan.is_file():
            return None
        start = ((json.loads(plan.read_text()).get("config") or {}).get("model") or {}).get("init_checkpoint")
        if not start:
            return None
        resolved, problem = resolve_model_checkpoint(str(start))
        if problem:
            raise FileNotFoundError(f"{ckpt}'s run started from model.init_checkpoint={start}, which is needed to "
                                    f"give the model back as the released class it came from: {problem}")
        ckpt = Path(resolved)
    raise ValueError(f"{checkpoint}: its runs' model.init_checkpoint lead back through {len(seen)} checkpoints "
                     f"without reaching a converted one ({' <- '.join(map(str, seen[:4]))} ...)")


def released_config(origin: Path, dtype: str) -> dict:
    """The released model's config.json, its dtype the checkpoint's: under the key the
    release used (transformers 4.56+ writes `dtype`, older `torch_dtype`), so that a model
    stored in the release's dtype gives its config back unchanged."""
    config = json.loads((origin / RELEASED_CONFIG).read_text())
    keys = ("dtype", "torch_dtype")
    config.update({key: dtype for key in [k for k in keys if k in config] or ["torch_dtype"]})
    text = config.get("text_config") or {}
    text.update({key: dtype for key in keys if key in text})  # the top level's governs; the text's, if any, agrees
    return config


def write_released_dir(out_dir: Path, export) -> dict:
    """megatron_to_hf.Export of a checkpoint that started from a released model, as that
    model's class, its tensors streamed into shards (hf_io.ShardWriter)."""
    origin = export.released_origin
    if origin is None:
        raise ValueError(f"{export.checkpoint} did not start from a released speech LLM (no {RELEASED_CONFIG} in it "
                         f"or in the checkpoints its runs started from: model.init_checkpoint): --layout released "
                         f"gives back only a model converted from one")
    if not export.has("encoder") or not export.has("adapter"):
        raise ValueError(f"{export.checkpoint} holds no encoder or adapter weights: the released class needs them")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = released_config(origin, export.stored_dtype())
    writer, left_out = ShardWriter(out), []
    for name, tensor in export.tensors():
        if name.startswith(CTC_HEAD):
            left_out.append(name)
            continue
        part = next(p for p in RELEASED_NAMES if name.startswith(p))
        writer.add(RELEASED_NAMES[part] + name[len(part):], tensor)
    total = writer.close()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    processor = origin / PROCESSOR_SUBDIR
    copied = sorted(p.name for p in processor.iterdir()) if processor.is_dir() else []
    for name in copied:
        shutil.copy2(processor / name, out / name)
    return {"class": config.get("architectures", ["?"])[0], "origin": str(origin), "processor_files": copied,
            "bytes": total, "left_out": left_out}
