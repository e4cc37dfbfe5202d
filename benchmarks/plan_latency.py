"""Wall time of the submit-side commands, each in a fresh process (median of N runs).

Run: .venv/bin/python benchmarks/plan_latency.py [--runs 5]
Targets on a 2-core machine: each single plan under one second; a sweep of 100 points
(`audiollm plan -m`) under ten. A plan that reports configuration errors (exit 2: the 9B
recipes' pretrained checkpoint absent here) has done all its work and counts.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

AUDIOLLM = str(Path(sys.executable).with_name("audiollm"))
COMMANDS = {
    "audiollm --help": [AUDIOLLM, "--help"],
    "audiollm plan +recipe=gemma2_whisper_tp4pp2": [AUDIOLLM, "plan", "+recipe=gemma2_whisper_tp4pp2"],
    "audiollm plan +recipe=gemma2_whisper_tp4pp2 --json": [AUDIOLLM, "plan", "+recipe=gemma2_whisper_tp4pp2", "--json"],
    "audiollm plan (tiny_cpu)": [AUDIOLLM, "plan"],
    "audiollm plan -m, 72 points (tp x pp x micro-batch x recompute)": [
        AUDIOLLM, "plan", "-m", "+recipe=gemma2_whisper_tp4pp2", "parallel.tp=1,2,4,8", "parallel.pp=1,2,4",
        "optim.micro_batch_size=1,2", "parallel.recompute=none,selective,full"],
    "audiollm plan -m, 108 points (tp x pp=1,2,3 x micro-batch=1,2,4 x recompute)": [
        AUDIOLLM, "plan", "-m", "+recipe=gemma2_whisper_tp4pp2", "parallel.tp=1,2,4,8", "parallel.pp=1,2,3",
        "optim.micro_batch_size=1,2,4", "parallel.recompute=none,selective,full"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print("| command | median s | min s | max s | runs |\n|---|---|---|---|---|")
    for label, cmd in COMMANDS.items():
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True)
            if proc.returncode not in (0, 2):
                raise SystemExit(f"{label} exited {proc.returncode}:\n{proc.stderr.decode()[-2000:]}")
            times.append(time.perf_counter() - start)
        print(f"| `{label}` | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | {runs} |")


if __name__ == "__main__":
    main()
