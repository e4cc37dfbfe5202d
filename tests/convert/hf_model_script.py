"""Run in an environment without this project (torch and transformers only): load an
exported AudioLLM directory with the Auto classes and transcribe clips.

    python hf_model_script.py EXPORT_DIR CLIPS.npz OUT.json [--batch N] [--peft]

CLIPS.npz: 16-kHz mono float32 arrays named clip_0, clip_1, ... (and optionally a
`prompts` array of templates, one per clip). Writes {"transformers", "texts",
"tokens"} to OUT.json. `--peft`: the decoder's PEFT adapter (EXPORT_DIR/peft_lora) is
put on the exported base with PeftModel.from_pretrained first."""

import importlib.util
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoProcessor


def main(argv):
    export, clips_path, out_path = argv[:3]
    batch = int(argv[argv.index("--batch") + 1]) if "--batch" in argv else 4
    if importlib.util.find_spec("orchestrator") is not None:
        raise SystemExit("the project is importable here: this environment must not have it")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    if "--peft" in argv:
        from peft import PeftModel

        model.language_model = PeftModel.from_pretrained(model.language_model, f"{export}/peft_lora").eval()
    processor = AutoProcessor.from_pretrained(export, trust_remote_code=True)
    stored = np.load(clips_path)
    clips = [stored[f"clip_{i}"] for i in range(len([k for k in stored.files if k.startswith("clip_")]))]
    prompts = list(stored["prompts"]) if "prompts" in stored.files else [None] * len(clips)
    texts, tokens = [], []
    for start in range(0, len(clips), batch):
        part = clips[start:start + batch]
        inputs = processor(audio=part, text=[p if p is None else str(p) for p in prompts[start:start + batch]])
        with torch.no_grad():
            ids = model.generate(**inputs, do_sample=False)
        new = ids[:, inputs["input_ids"].shape[1]:]
        stops = set(model.generation_config.eos_token_id)
        for row in new.tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), len(row))
            tokens.append(row[:cut])
        texts += processor.batch_decode(new, skip_special_tokens=True)
    with open(out_path, "w") as handle:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "texts": texts,
                   "tokens": tokens}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
