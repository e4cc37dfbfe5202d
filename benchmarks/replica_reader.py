"""The data wait of a step with one reader per model replica (data.replica_reader) and
without, at TP=2, CP=2 and PP=2 on CPU.

    PYTHONPATH=. python benchmarks/replica_reader.py [--iters 30] [--layouts tp2,cp2,pp2]

Runs the default recipe (tiny_cpu: `audiollm train`, two processes, the demo corpus
made first if AUDIOLLM_DEMO_DATA does not name one) at each layout twice, with
data.replica_reader on and off, and reads each run's metrics.jsonl: the median step time,
the median data wait (`data_wait_s`: rank 0's wait for its micro-batches, which with the
reader on is the reading itself, rank 0 being the reader) and its share of the step,
the first steps left out. CPU time of the data work is what the reader saves (one
process decodes instead of two); on a 2-core machine the two processes also compete for
the cores, so the step time shows both. Prints one table."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_corpus import demo_corpus  # benchmarks/demo_corpus.py

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {"tp2": ["parallel.tp=2"], "cp2": ["parallel.cp=2", "data.seq_length=512"],
           "pp2": ["parallel.pp=2", "model.adapter.ctc_weight=0"]}


def _run(out: Path, corpus: Path, layout: str, on: bool, iters: int) -> dict:
    name = f"{layout}_{'reader' if on else 'every_rank'}"
    overrides = ["+recipe=tiny_cpu", f"run.name={name}", f"run.output_root={out}", "launcher.gpus_per_node=2",
                 *LAYOUTS[layout], f"data.replica_reader={str(on).lower()}", f"train.iters={iters}",
                 "train.eval_interval=0", "train.eval_generation=false", "train.eval_iters=1", "train.log_interval=10",
                 "train.save_interval=0", "optim.lr_warmup_iters=2", "logger.backend=none"]
    env = {**os.environ, "AUDIOLLM_DEMO_DATA": str(corpus), "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"audiollm train {layout} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (metrics,) = out.rglob(f"{name}/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()][3:]
    step = statistics.median(r["step_time_s"] for r in rows)
    wait = statistics.median(r["data_wait_s"] for r in rows)
    return {"step": step, "wait": wait, "share": wait / step, "wall": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layouts", default="tp2,cp2,pp2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = demo_corpus(tmp, samples=600)
        rows = [(layout, on, _run(tmp / "runs", corpus, layout, on, args.iters))
                for layout in args.layouts.split(",") for on in (False, True)]
    print(f"tiny_cpu, 2 processes, {args.iters} steps (median over steps 4-{args.iters})")
    print("| layout | data.replica_reader | step time | data wait | data wait share | run wall |")
    print("|---|---|---|---|---|---|")
    for layout, on, r in rows:
        print(f"| {layout} | {'on' if on else 'off'} | {r['step']:.3f} s | {r['wait']:.4f} s | "
              f"{100 * r['share']:.1f}% | {r['wall']:.0f} s |")


if __name__ == "__main__":
    main()
