"""The AudioLLM as one Hugging Face model directory (`audiollm convert megatron-to-hf`'s
default for a training checkpoint):

    config.json                     model_type "audiollm": text_config (the decoder's HF
                                    config), audio_config (Whisper's), the adapter's sizes,
                                    the audio placeholder id, and an auto_map
    configuration_audiollm.py       the code transformers runs for it with
    modeling_audiollm.py            trust_remote_code=True (orchestrator/hf_model/: torch,
    processing_audiollm.py          numpy and transformers only)
    pipeline_audiollm.py            (`pipeline(model=DIR, trust_remote_code=True)`)
    model.safetensors               language_model.* (the decoder's HF names), encoder.*
                                    (HF WhisperEncoder's), adapter.*; shards of 2 GiB with an
                                    index above that, written as the checkpoint is read
    tokenizer files, preprocessor_config.json, processor_config.json
                                    the processor: the run's tokenizer, Whisper log-mel
                                    settings of the encoder's window, the run's prompt
    generation_config.json          greedy, stopping at end of turn or eos, the run's
                                    eval_generation_max_new_tokens
    README.md                       a model card: recipe, data, steps, the run's scores

Loaded with `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` and
`AutoProcessor.from_pretrained(DIR, trust_remote_code=True)`; `hf-to-megatron --hf DIR`
reads it back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from orchestrator.plan.adapter_kinds import frame_stack
from orchestrator.convert.hf_io import ShardWriter
from orchestrator.hf_model import REMOTE_CODE_FILES

MODEL_TYPE = "audiollm"
AUTO_MAP = {"AutoConfig": "configuration_audiollm.AudioLLMConfig",
            "AutoModel": "modeling_audiollm.AudioLLMForCausalLM",
            "AutoModelForCausalLM": "modeling_audiollm.AudioLLMForCausalLM"}
PROCESSOR_AUTO_MAP = {"AutoProcessor": "processing_audiollm.AudioLLMProcessor"}
# `pipeline(model=DIR, trust_remote_code=True)`: orchestrator/hf_model/pipeline_audiollm.py says why this task.
CUSTOM_PIPELINES = {"automatic-speech-recognition": {"impl": "pipeline_audiollm.AudioLLMPipeline",
                                                     "pt": ["AutoModelForCausalLM"], "tf": [], "type": "audio"}}


def model_config(export, audio_token_id: Optional[int]) -> dict:
    config = export.run_config
    model = config["model"]
    decoder_vocab = int(model["decoder"]["vocab_size"])
    ctc = float(model["adapter"].get("ctc_weight") or 0.0) > 0
    return {
        "architectures": ["AudioLLMForCausalLM"], "model_type": MODEL_TYPE, "auto_map": AUTO_MAP,
        "custom_pipelines": CUSTOM_PIPELINES,
        "text_config": export.hf_config, "audio_config": export.whisper_config,
        "audio_token_id": audio_token_id, "frame_stack": frame_stack(model["adapter"]),
        "ctc_vocab_size": decoder_vocab if ctc else 0,
        "encoder_mask_padding": bool(model["encoder"].get("mask_padding", False)),
        # What hf-to-megatron writes back as the converted checkpoint's adapter_config.json.
        "adapter_config": export.adapter_config,
        "torch_dtype": export.hf_config.get("torch_dtype", "float32"),
        "tie_word_embeddings": bool(export.hf_config.get("tie_word_embeddings", True)),
    }


def write_processor(out: Path, export) -> Optional[int]:
    """The run's tokenizer with its prompt and the encoder window's log-mel settings, as
    AutoProcessor loads them; returns the audio placeholder's id (None without a tokenizer)."""
    from transformers import GenerationConfig, WhisperFeatureExtractor

    from orchestrator.data.prompts import audio_token_id
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.scoring.asr import default_stop_ids
    from orchestrator.hf_model.processing_audiollm import AudioLLMProcessor

    tokenizer_dir = export.tokenizer
    if not tokenizer_dir:
        return None
    if not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(
            f"the run's tokenizer (data.tokenizer={tokenizer_dir}) is not there"
            + (f" from {Path.cwd()}: a relative path is read from the directory the run was started in; export "
               f"from there" if not Path(tokenizer_dir).is_absolute() else "") + "; the model directory needs it")
    config = export.run_config
    data, model = config["data"], config["model"]
    tokenizer = load_tokenizer(tokenizer_dir, data["audio_token"])
    window_frames = 2 * int(model["encoder"]["max_source_positions"])
    seconds = window_frames / 100
    features = WhisperFeatureExtractor(feature_size=int(model["encoder"]["num_mel_bins"]),
                                       chunk_length=int(seconds) if seconds.is_integer() else seconds)
    processor = AudioLLMProcessor(features, tokenizer, prompt_template=data["prompt_template"],
                                  audio_token=data["audio_token"], frame_stack=frame_stack(model["adapter"]),
                                  add_bos=bool(data.get("add_bos", True)))
    processor.save_pretrained(str(out))
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = out / name
        saved = json.loads(path.read_text()) if path.is_file() else {}
        saved.update(processor_class="AudioLLMProcessor", auto_map={**saved.get("auto_map", {}), **PROCESSOR_AUTO_MAP})
        if name == "processor_config.json":  # what AudioLLMProcessor.__init__ takes beyond its parts
            saved.update(prompt_template=processor.prompt_template, audio_token=processor.audio_token,
                         frame_stack=processor.frame_stack, add_bos=processor.add_bos)
        path.write_text(json.dumps(saved, indent=2) + "\n")
    stops = default_stop_ids(tokenizer, data.get("response_suffix", ""))
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=stops,
                     pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[-1],
                     do_sample=False,
                     max_new_tokens=int(config.get("train", {}).get("eval_generation_max_new_tokens", 48))
                     ).save_pretrained(str(out))
    return audio_token_id(tokenizer, data["audio_token"])


def write_model_dir(out_dir: Path, export) -> dict:
    """A training checkpoint's export (megatron_to_hf.Export) as one HF model directory,
    its tensors streamed into shards (hf_io.ShardWriter)."""
    if export.run_config is None:
        raise ValueError(f"{export.checkpoint} is a converted checkpoint: it holds no run (tokenizer, prompt, "
                         f"adapter settings) to make a model directory from; export it with --layout parts")
    if not export.has("encoder") or not export.has("adapter"):
        raise ValueError(f"{export.checkpoint} holds no encoder or adapter weights: --layout parts writes the "
                         f"decoder alone")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    audio_token_id = write_processor(out, export)
    config = model_config(export, audio_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    writer = ShardWriter(out)
    for name, tensor in export.tensors():
        writer.add(name, tensor)
    total = writer.close()
    source = Path(__file__).resolve().parent.parent / "hf_model"
    for name in REMOTE_CODE_FILES:
        shutil.copy2(source / name, out / name)
    (out / "README.md").write_text(model_card(export, config))
    return {"processor": audio_token_id is not None, "bytes": total}


# The oldest transformers release the remote code (orchestrator/hf_model/) supports, and
# the releases the exports are tested with: the oldest, the lent GPU machine's
# (constraints-gpu-machine.txt) and the newest on the registry when last checked
# (tests/convert/test_hf_model.py runs the exports in each and holds this list to them).
REMOTE_CODE_SINCE = "4.46"
TESTED_TRANSFORMERS = ("4.46.3", "5.17.0", "5.25.0")


def scoring_lines(scoring: dict) -> list:
    """How each dataset's figure was made (the eval JSON's `scoring`): its normaliser and
    scorer, and its decoding speed with the batch and device it was measured at."""
    lines = ["", "How each figure was made (`audiollm eval`):", ""] if scoring else []
    for name, s in scoring.items():
        how = f"- {name}: {s['metric']}"
        how += f", normaliser {s['normaliser']} ({s.get('normaliser_from')})" if s.get("normaliser") else ""
        how += f"; scorer {s['scorer']}"
        if "rtfx" in s:
            how += (f"; RTFx {s['rtfx']:.1f} (audio seconds over decode seconds, after a warm-up batch) at batches "
                    f"of up to {s['batch_samples']} samples on {s['device']}")
        lines.append(how)
    return lines


def model_card(export, config: dict) -> str:
    """The card a user completes: what the run was, what it scored; license and intended
    use are theirs to state."""
    from orchestrator.hf_model.configuration_audiollm import DECODER_SINCE

    run = export.run_config
    ckpt = export.checkpoint
    # The remote code's own floor or the decoder's, the later.
    decoder_since = DECODER_SINCE.get(config["text_config"].get("model_type"), REMOTE_CODE_SINCE)
    newer = tuple(map(int, decoder_since.split("."))) > tuple(map(int, REMOTE_CODE_SINCE.split(".")))
    since, why = ((decoder_since, "the first release with this decoder") if newer else
                  (REMOTE_CODE_SINCE, "the oldest release its code supports"))
    scores = ckpt.parent.parent / "eval" / f"{ckpt.name}.json"
    lines = ["---", "library_name: transformers", "pipeline_tag: automatic-speech-recognition",
             "license: # your model's license (the decoder's and the encoder's terms apply)", "---", "",
             f"# {run.get('run', {}).get('name') or ckpt.parent.parent.name}", "",
             "An AudioLLM trained with audiollm: a Whisper encoder, an adapter and a "
             f"{config['text_config'].get('model_type', 'decoder')} decoder.", "",
             "## Use", "",
             f"With torch and transformers>={since} ({why}), no other package; tested with transformers "
             f"{', '.join(TESTED_TRANSFORMERS)}:",
             "", "```python",
             "from transformers import AutoModelForCausalLM, AutoProcessor",
             "model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)",
             "processor = AutoProcessor.from_pretrained(DIR, trust_remote_code=True)",
             "inputs = processor(audio=[waveform_16khz_mono])",
             "ids = model.generate(**inputs)",
             "print(processor.batch_decode(ids[:, inputs['input_ids'].shape[1]:], skip_special_tokens=True))",
             "```", "", "## Training", "",
             f"- recipe: {run.get('recipe') or 'none'}",
             f"- checkpoint: {ckpt.name} of the run {ckpt.parent.parent.name}",
             f"- training data: {', '.join(str(d.get('name')) for d in run.get('data', {}).get('train') or [])}",
             f"- validation data: {', '.join(str(d.get('name')) for d in run.get('data', {}).get('validation') or [])}",
             f"- prompt: {run.get('data', {}).get('prompt_template')!r}", "", "## Evaluation", ""]
    if scores.is_file():
        figures = json.loads(scores.read_text())
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in figures.items() if isinstance(v, (int, float))
                  and not isinstance(v, bool)]
        lines += scoring_lines(figures.get("scoring") or {})
    else:
        lines.append(f"Not evaluated yet: `audiollm eval {ckpt.parent.parent} --checkpoint {ckpt}` scores it.")
    lines += ["", "## Intended use and limits", "", "(to be written by the model's owner)", ""]
    return "\n".join(lines)
