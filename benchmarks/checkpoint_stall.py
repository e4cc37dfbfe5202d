"""How long a checkpoint save stalls training: synchronous saves against background ones
(train.async_save), on CPU.

    PYTHONPATH=. python benchmarks/checkpoint_stall.py [--hidden 1024] [--layers 8] [--iters 9]

Runs the default recipe (tiny_cpu: `audiollm train`, one process) twice with a larger
decoder (`--hidden`, `--layers`; its weights and Adam state are what a save writes), a
checkpoint every 2 steps and no evaluation: once with synchronous saves, once with
`train.async_save=true`. The demo corpus is made first if AUDIOLLM_DEMO_DATA does not
name one (200 utterances). From each run's metrics.jsonl and log:

  checkpoint        size of one published checkpoint on disk
  stall per save    median time training waited in a save (`checkpoint/stall_s`):
                    the whole write when synchronous; the save plan, the common and
                    per-rank state and the fork of the writer in the background
  written after     median time from a background save to its publication
  step after a save median time of the step that follows a save (a background writer
                    runs beside it, on the same cores here), against the other steps

Prints one table."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_corpus import demo_corpus  # benchmarks/demo_corpus.py

REPO = Path(__file__).resolve().parents[1]


def _run(name: str, out: Path, corpus: Path, args, async_save: bool) -> dict:
    hidden, layers = args.hidden, args.layers
    heads = max(hidden // 128, 1)
    overrides = [
        "+recipe=tiny_cpu", f"run.name={name}", f"run.output_root={out}",
        f"model.decoder.hidden_size={hidden}", f"model.decoder.num_layers={layers}",
        f"model.decoder.num_attention_heads={heads}", f"model.decoder.num_query_groups={max(heads // 2, 1)}",
        "model.decoder.kv_channels=128", "model.decoder.query_pre_attn_scalar=128",
        f"model.decoder.ffn_hidden_size={4 * hidden}",
        "optim.global_batch_size=2", "optim.micro_batch_size=2", "optim.lr_warmup_iters=1",
        f"train.iters={args.iters}", "train.save_interval=2", "train.keep_last=1", "train.eval_interval=0",
        "train.eval_generation=false", "train.eval_iters=1", "train.log_interval=1",
        f"train.async_save={str(async_save).lower()}", "logger.backend=none",
    ]
    env = {**os.environ, "AUDIOLLM_DEMO_DATA": str(corpus), "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"audiollm train failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    run_dir = next(out.rglob(f"{name}/metrics.jsonl")).parent
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stalls = [r["checkpoint/stall_s"] for r in rows if "checkpoint/stall_s" in r]
    after = [r["step_time_s"] for r in rows if "checkpoint/stall_s" in r]
    other = [r["step_time_s"] for r in rows if "checkpoint/stall_s" not in r and r["step"] > 1]
    published = [float(m) for m in re.findall(r"published, ([0-9.]+) s after its save", proc.stdout + proc.stderr)]
    checkpoint = max((run_dir / "checkpoints").glob("step_*"))
    size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    return {"stall": statistics.median(stalls), "saves": len(stalls), "size": size,
            "written": statistics.median(published) if published else None,
            "after": statistics.median(after), "other": statistics.median(other), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--iters", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = demo_corpus(tmp, samples=200)
        results = {mode: _run(f"stall_{mode}", tmp / "runs", corpus, args, mode == "background")
                   for mode in ("synchronous", "background")}
    print(f"decoder hidden {args.hidden}, {args.layers} layers; a checkpoint every 2 steps of {args.iters}")
    print("| saves | checkpoint | stall per save (median) | written after | step after a save | other steps | run wall |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        written = f"{r['written']:.2f} s" if r["written"] is not None else "-"
        print(f"| {mode} | {r['size'] / 2**30:.2f} GiB | {r['stall']:.3f} s ({r['saves']} saves) | {written} | "
              f"{r['after']:.2f} s | {r['other']:.2f} s | {r['wall']:.0f} s |")


if __name__ == "__main__":
    main()
