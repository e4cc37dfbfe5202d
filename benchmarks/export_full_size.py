"""Export of the gemma-2-2b + whisper-large-v3 shape: peak host memory and time of
`audiollm convert megatron-to-hf`, each layout in its own process.

The export streams: it reads one decoder layer's rows (or one encoder layer, or the
embedding with the final norm, or the adapter) at a time and writes them into shards
of 2 GiB as they come, so its peak memory is bounded by the process's libraries, one
shard and twice the largest tensor (the checkpoint reader's buffer and the tensor it
fills) -- not the model, let alone the model twice. The table shows the bound beside
each layout's peak.

Nothing can be downloaded here, so the models are random bf16 ones of the published
shapes (benchmarks/convert_full_size.py makes them), with a random adapter of the
recipe's shape. `hf-to-megatron` makes a converted checkpoint of all three parts, which
`--layout parts` exports; a run directory whose plan.json is the resolved
`model=gemma2_2b_whisper_large_v3` recipe (with a small tokenizer built here for the
processor: the 256k-vocabulary one cannot be downloaded) and whose one step links
to those files is exported as one model directory (`--layout model`, the default for a
run). The exported tensors are compared with the HF models' bit for bit.

Run: .venv/bin/python benchmarks/export_full_size.py WORK_DIR
Needs ~25 GB of disk in WORK_DIR (the HF models, the converted checkpoint, two exports).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.convert_full_size import make_models  # noqa: E402

RECIPE = ["model=gemma2_2b_whisper_large_v3"]
IMPORTS = "import orchestrator.convert.megatron_to_hf, orchestrator.convert.audiollm_dir, megatron.core.dist_checkpointing"


def _peak_gib(argv: list) -> tuple:
    """(wall seconds, peak RSS in GiB) of `argv` run as its own process."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    kib = int(proc.stderr.strip().splitlines()[-1])
    return time.perf_counter() - start, kib / 1024**2


def compose_model():
    from orchestrator.plan.compose import compose

    return compose(RECIPE).model


def make_adapter(root: Path, model) -> Path:
    """The recipe's adapter (`model` its composed model section) with random weights, as
    megatron-to-hf writes one (audio_adapter/)."""
    import torch
    from safetensors.torch import save_file

    from orchestrator.models.adapters import AudioAdapter
    from orchestrator.plan.adapter_kinds import dropout, frame_stack

    out = root / "adapter"
    if not out.is_dir():
        torch.manual_seed(0)
        ctc_vocab = model.decoder.vocab_size if model.adapter.ctc_weight > 0 else 0
        adapter = AudioAdapter(model.encoder.num_layers, model.encoder.d_model, model.decoder.hidden_size,
                               frame_stack(model.adapter), ctc_vocab_size=ctc_vocab).to(torch.bfloat16)
        out.mkdir()
        save_file({k: v.contiguous() for k, v in adapter.state_dict().items()}, str(out / "model.safetensors"))
        (out / "adapter_config.json").write_text(json.dumps({"frame_stack": frame_stack(model.adapter),
                                                             "dropout": dropout(model.adapter),
                                                             "ctc_weight": model.adapter.ctc_weight}))
    return out


def make_run(root: Path, converted: Path, plan: dict) -> Path:
    """A run directory holding the recipe's plan and one checkpoint: the converted files, linked."""
    from orchestrator.plan.checkpoint_dirs import CONVERTED_META

    step = root / "run" / "checkpoints" / "step_000001"
    step.mkdir(parents=True, exist_ok=True)
    for path in converted.iterdir():
        if path.is_file() and path.name != CONVERTED_META and not (step / path.name).exists():
            (step / path.name).symlink_to(path)
    (root / "run" / "checkpoints" / "latest").write_text("step_000001")
    (root / "run" / "plan.json").write_text(json.dumps(plan))
    return root / "run"


def recipe_plan(root: Path, converted: Path) -> dict:
    """plan.json of the recipe, fine-tuning from `converted`, with a small tokenizer built here."""
    from orchestrator.data.tokenizer_build import build_tokenizer
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve

    tokenizer = root / "tokenizer"
    if not tokenizer.is_dir():
        build_tokenizer([f"{n} one two three four five six seven eight nine" for n in range(200)], tokenizer)
    overrides = [*RECIPE, f"model.init_checkpoint={converted}", f"data.tokenizer={tokenizer}"]
    return resolve(compose(overrides), purpose="plan").to_dict()


def compare(root: Path, exported: Path, prefix: str) -> int:
    """Tensors of the export equal to the HF models' (bit for bit); returns how many were compared."""
    import torch

    from orchestrator.convert.hf_io import SafetensorsDir, TensorsUnder

    source = {"language_model.": SafetensorsDir(root / "gemma2"), "encoder.": SafetensorsDir(root / "whisper"),
              "adapter.": SafetensorsDir(root / "adapter")}
    out = SafetensorsDir(exported)
    views = {part: TensorsUnder(out, part) if prefix else out for part in source}
    if not prefix:  # the parts layout: the encoder and adapter in their folders
        views["encoder."], views["adapter."] = SafetensorsDir(exported / "whisper_encoder"), \
            SafetensorsDir(exported / "audio_adapter")
    count = 0
    for part, theirs in source.items():
        ours = views[part]
        for name in ours:
            hf_name = ("encoder." + name) if part == "encoder." else name  # WhisperModel's encoder.*
            if not torch.equal(ours[name], theirs[hf_name]):
                raise AssertionError(f"{exported}: {part}{name} differs from the HF model's {hf_name}")
            count += 1
    return count


def largest_tensor_gib(source: Path) -> float:
    """The largest tensor one group read holds: a non-layer tensor whole, a decoder layer's row."""
    import math

    from orchestrator.convert.megatron_to_hf import Export
    from orchestrator.train.dist_format import LAYERS

    sizes = [math.prod(meta.global_shape[1:] if key.startswith(LAYERS) else meta.global_shape)
             * meta.dtype.itemsize for key, meta in Export(source).stored.items()]
    return max(sizes) / 1024**3


def _gib(path: Path, pattern: str = "*.safetensors") -> float:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file()) / 1024**3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    args = parser.parse_args()
    root = args.work_dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    make_models(root)
    converted = root / "converted"
    if not converted.is_dir():
        adapter = make_adapter(root, compose_model())
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "convert", "hf-to-megatron", "--hf",
                        str(root / "gemma2"), "--whisper", str(root / "whisper"), "--adapter", str(adapter), "--out",
                        str(converted)], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    plan = recipe_plan(root, converted)
    run = make_run(root, converted, plan)
    rows = [("converted checkpoint on disk (bf16: decoder, encoder, adapter)", f"{_gib(converted, '*'):.2f} GiB")]
    bound = memory_bound(rows, IMPORTS, converted)
    for layout, source in (("parts", converted), ("model", run)):
        out = root / f"export_{layout}"
        seconds, peak = _peak_gib([sys.executable, "-m", "orchestrator.cli", "convert", "megatron-to-hf",
                                   "--megatron", str(source), "--out", str(out), "--layout", layout])
        shards = len(list(out.glob("model*.safetensors")))
        compared = compare(root, out, "language_model." if layout == "model" else "")
        rows += [(f"--layout {layout}: wall time", f"{seconds:.0f} s"),
                 (f"--layout {layout}: peak RSS", f"{peak:.2f} GiB ({'within' if peak <= bound else 'OVER'} the bound)"),
                 (f"--layout {layout}: written", f"{_gib(out):.2f} GiB, {shards} shard(s) at the top"),
                 (f"--layout {layout}: tensors equal to the HF models'", f"{compared}")]
    print_table(rows)


def memory_bound(rows: list, imports: str, converted: Path) -> float:
    """The streamed export's bound in GiB: the libraries (`imports` run alone), the shard
    being filled, and the largest tensor twice (the checkpoint reader's buffer and the
    tensor it fills): the same at any depth. Its terms are added to `rows`."""
    from orchestrator.convert.hf_io import SHARD_BYTES

    _, baseline = _peak_gib([sys.executable, "-c", imports])
    rows.append(("the export's imports alone (torch, transformers, megatron)", f"{baseline:.2f} GiB"))
    largest = largest_tensor_gib(converted)
    bound = baseline + SHARD_BYTES / 1024**3 + 2 * largest
    rows.append(("bound: imports + one shard + 2 x the largest tensor",
                 f"{baseline:.2f} + {SHARD_BYTES / 1024**3:.0f} + 2 x {largest:.2f} = {bound:.2f} GiB"))
    return bound


def print_table(rows: list) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"| {'what':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for what, value in rows:
        print(f"| {what:<{width}} | {value} |")


if __name__ == "__main__":
    main()
