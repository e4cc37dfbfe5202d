"""Run in an environment without this project (torch and transformers only): a released
class loaded from a directory `audiollm convert megatron-to-hf` wrote, on the ids and
features an input file holds.

    python released_class_script.py CLASS DIR IO.npz OUT.json

IO.npz: input_ids, input_features (and feature_attention_mask); writes {"transformers",
"logits"} to OUT.json (the logits as nested lists)."""

import importlib.util
import json
import sys

import numpy as np
import torch
import transformers


def main(cls: str, directory: str, io_path: str, out_path: str) -> None:
    if importlib.util.find_spec("orchestrator") is not None:
        raise SystemExit("the project is importable here: this environment must not have it")
    model = getattr(transformers, cls).from_pretrained(directory, dtype=torch.float32).eval()
    stored = np.load(io_path)
    inputs = {name: torch.from_numpy(stored[name]) for name in stored.files}
    with torch.no_grad():
        logits = model(**inputs).logits
    with open(out_path, "w") as handle:
        json.dump({"transformers": transformers.__version__, "logits": logits.tolist()}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:5])
