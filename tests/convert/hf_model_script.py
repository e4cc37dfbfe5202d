"""Run in an environment without this project (torch and transformers only): load an
exported AudioLLM directory with the Auto classes and transcribe clips.

    python hf_model_script.py CLIPS.npz OUT.json EXPORT_DIR [EXPORT_DIR ...] [--batch N] [--peft]

CLIPS.npz: 16-kHz mono float32 arrays named clip_0, clip_1, ... (and optionally a
`prompts` array of templates, one per clip; and optionally `long`, a recording longer than
the encoder's window, `long_windows`, the [start, end) of its windows as the project cuts
them, and `first_at_44k`, the first clip at 44.1 kHz). Writes {"transformers", "torch",
"exports": {EXPORT_DIR: {"texts", "tokens", "logits", "pipeline"}}} to OUT.json (logits: each
prompt's next-token logits, before any answer token; pipeline: the task `pipeline(model=
EXPORT_DIR)` inferred and its answer to the first clip; with `long`: "pipeline_long", the
pipeline's answer to it, "long_windows", its windows' answers through the processor and
`generate`, and "pipeline_44k", the pipeline's answer to first_at_44k). `--peft`: the
decoder's PEFT
adapter (EXPORT_DIR/peft_lora) is put on the exported base with PeftModel.from_pretrained
first."""

import importlib.util
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoProcessor, pipeline


def transcribe(export, clips, prompts, batch, peft, long=None):
    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    if peft:
        from peft import PeftModel

        model.language_model = PeftModel.from_pretrained(model.language_model, f"{export}/peft_lora").eval()
    processor = AutoProcessor.from_pretrained(export, trust_remote_code=True)
    stops = set(model.generation_config.eos_token_id)
    texts, tokens, logits = [], [], []
    for start in range(0, len(clips), batch):
        inputs = processor(audio=clips[start:start + batch], text=prompts[start:start + batch])
        with torch.no_grad():
            # the prompts' next-token logits (left-padded: every row's last position is its own)
            logits += model(**inputs).logits[:, -1].float().tolist()
            new = model.generate(**inputs, do_sample=False)[:, inputs["input_ids"].shape[1]:]
        for row in new.tolist():
            tokens.append(row[:next((i for i, t in enumerate(row) if t in stops), len(row))])
        texts += processor.batch_decode(new, skip_special_tokens=True)
    asr = pipeline(model=export, trust_remote_code=True)  # the task from config.json's custom_pipelines
    said = asr({"raw": clips[0], "sampling_rate": 16000}, **({"prompt": prompts[0]} if prompts[0] else {}))
    out = {"texts": texts, "tokens": tokens, "logits": logits, "pipeline": {"task": asr.task, "text": said["text"]}}
    if long is not None:  # a recording longer than the window, through the pipeline and window by window
        out["pipeline_long"] = asr({"raw": long["samples"], "sampling_rate": 16000})["text"]
        pieces = [long["samples"][start:end] for start, end in long["windows"]]
        inputs = processor(audio=pieces)
        with torch.no_grad():
            new = model.generate(**inputs, do_sample=False)[:, inputs["input_ids"].shape[1]:]
        out["long_windows"] = processor.batch_decode(new, skip_special_tokens=True)
        # the first clip at 44.1 kHz: the pipeline resamples it (no torchaudio needed)
        out["pipeline_44k"] = asr({"raw": long["clip_44k"], "sampling_rate": 44100})["text"]
    return out


def main(argv):
    batch = int(argv[argv.index("--batch") + 1]) if "--batch" in argv else 4
    positional = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--batch")]
    clips_path, out_path, exports = positional[0], positional[1], positional[2:]
    if importlib.util.find_spec("orchestrator") is not None:
        raise SystemExit("the project is importable here: this environment must not have it")
    stored = np.load(clips_path)
    clips = [stored[f"clip_{i}"] for i in range(len([k for k in stored.files if k.startswith("clip_")]))]
    prompts = [str(p) for p in stored["prompts"]] if "prompts" in stored.files else [None] * len(clips)
    long = ({"samples": stored["long"], "windows": stored["long_windows"].tolist(),
             "clip_44k": stored["first_at_44k"]} if "long" in stored.files else None)
    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "exports": {export: transcribe(export, clips, prompts, batch, "--peft" in argv, long)
                          for export in exports}}
    with open(out_path, "w") as handle:
        json.dump(result, handle)

if __name__ == "__main__":
    main(sys.argv[1:])
