"""Wall time of the submit-side commands, each in a fresh process (median of N runs).

Run: .venv/bin/python benchmarks/plan_latency.py [--runs 5]
Target: each under one second on a 2-core machine.
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
            subprocess.run(cmd, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        print(f"| `{label}` | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | {runs} |")


if __name__ == "__main__":
    main()
