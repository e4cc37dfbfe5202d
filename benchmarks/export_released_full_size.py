"""Export of a Voxtral Mini 3B fine-tune as its released class: peak host memory and time of
`audiollm convert megatron-to-hf --layout released` (the default for a run that started from
a released model), against the bound of the streaming export (benchmarks/export_full_size.py:
the libraries, one 2-GiB shard and twice the largest tensor).

Nothing can be downloaded here, so the release is a random bf16
VoxtralForConditionalGeneration of the published shape (transformers' VoxtralConfig
defaults are Voxtral Mini's: conf/model/voxtral_mini_3b.yaml), converted whole with
`hf-to-megatron`; a run directory whose plan.json is the resolved voxtral_mini_tp1 recipe
starting from it, and whose one step links to the converted files, is exported. The
exported directory is compared with the release: config.json and every tensor, bit for bit.

Run: .venv/bin/python benchmarks/export_released_full_size.py WORK_DIR
Needs ~30 GB of disk in WORK_DIR (the release, its conversion, the export) and ~10 GB of
memory while the random release is made.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.export_full_size import _gib, _peak_gib, make_run, memory_bound, print_table  # noqa: E402

RECIPE = ["+recipe=voxtral_mini_tp1"]
IMPORTS = "import orchestrator.convert.megatron_to_hf, orchestrator.convert.released_export, " \
          "megatron.core.dist_checkpointing"


def make_release(root: Path) -> Path:
    import torch
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration

    out = root / "voxtral_mini"
    if not out.is_dir():
        torch.manual_seed(0)
        model = VoxtralForConditionalGeneration._from_config(VoxtralConfig(audio_token_id=24),
                                                             torch_dtype=torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
    return out


def recipe_plan(converted: Path) -> dict:
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve

    return resolve(compose([*RECIPE, f"model.init_checkpoint={converted}"]), purpose="plan",
                   keep_errors=True).to_dict()


def compare(release: Path, exported: Path) -> int:
    """config.json equal, and every tensor of the export equal to the release's; returns how many."""
    import torch

    from orchestrator.convert.hf_io import SafetensorsDir

    if json.loads((exported / "config.json").read_text()) != json.loads((release / "config.json").read_text()):
        raise AssertionError(f"{exported}/config.json differs from the release's")
    ours, theirs = SafetensorsDir(exported), SafetensorsDir(release)
    if sorted(ours.names()) != sorted(theirs.names()):
        raise AssertionError(f"{exported} holds other tensors than the release: "
                             f"{sorted(set(ours.names()) ^ set(theirs.names()))[:6]}")
    for name in ours.names():
        if not torch.equal(ours[name], theirs[name]):
            raise AssertionError(f"{exported}: {name} differs from the release's")
    return len(ours.names())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    args = parser.parse_args()
    root = args.work_dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    release = make_release(root)
    converted = root / "converted"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not converted.is_dir():
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "convert", "hf-to-megatron", "--hf", str(release),
                        "--out", str(converted)], check=True, cwd=REPO, env=env)
    run = make_run(root, converted, recipe_plan(converted))
    rows = [("release on disk (bf16: language model, audio tower, projector)", f"{_gib(release):.2f} GiB")]
    bound = memory_bound(rows, IMPORTS, converted)
    out = root / "export_released"
    seconds, peak = _peak_gib([sys.executable, "-m", "orchestrator.cli", "convert", "megatron-to-hf",
                               "--megatron", str(run), "--out", str(out)])
    rows += [("--layout released (the run's default): wall time", f"{seconds:.0f} s"),
             ("--layout released: peak RSS", f"{peak:.2f} GiB ({'within' if peak <= bound else 'OVER'} the bound)"),
             ("--layout released: written", f"{_gib(out):.2f} GiB, {len(list(out.glob('model*.safetensors')))} shards"),
             ("--layout released: config.json and tensors equal to the release's", f"{compare(release, out)}")]
    print_table(rows)


if __name__ == "__main__":
    main()
