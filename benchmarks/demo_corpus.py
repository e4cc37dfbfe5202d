"""The demo corpus a benchmark trains on: the one $AUDIOLLM_DEMO_DATA names when it holds
one, else one made with `audiollm data demo` under `tmp`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def demo_corpus(tmp: Path, samples: int) -> Path:
    corpus = Path(os.environ.get("AUDIOLLM_DEMO_DATA", Path(tmp) / "demo"))
    if not (corpus / "tokenizer").exists():
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "data", "demo", str(corpus),
                        "--num-samples", str(samples)], cwd=REPO, check=True, capture_output=True)
    return corpus
