"""Virtual environments with given packages and nothing of this project, made once and
kept between test runs on the same machine (one folder per name, Python and package
set, under $AUDIOLLM_CACHE or ~/.cache/audiollm). A folder is reused only once its
installation finished (a marker written last), so an interrupted one is made again, and
one process at a time makes it (a lock). uv, which setup.sh puts beside the running
interpreter, installs from its cache (torch's CUDA libraries included) in seconds where
pip takes minutes; pip where there is no uv."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

# Written into the folder once its packages are installed.
READY = "ready.json"


def venv_dir(name: str, version: str, packages: Sequence[str]) -> Path:
    cache = Path(os.environ.get("AUDIOLLM_CACHE") or Path.home() / ".cache" / "audiollm")
    key = hashlib.sha256(" ".join((version, *packages)).encode()).hexdigest()[:10]
    return cache / f"{name}-py{version}-{key}"


def cached_venv(name: str, interpreter: str, version: str, packages: Sequence[str], folder: Path | None = None,
                timeout: int = 1800) -> Path:
    """The python3 of a virtual environment of `interpreter` (Python `version`) holding
    `packages` (pip requirement strings) and what they need."""
    venv = folder or venv_dir(name, version, packages)
    python3 = venv / "bin" / "python3"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / READY).is_file() and python3.exists():
            return python3
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        uv = Path(sys.executable).parent / "uv"
        # Compiled to bytecode as pip does, or every process compiles torch again where
        # PYTHONDONTWRITEBYTECODE is set.
        install = ([str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", str(python3)] if uv.exists()
                   else [str(python3), "-m", "pip", "install", "-q"])
        proc = subprocess.run([*install, *packages], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"installing {' '.join(packages)} into {venv} failed:\n{proc.stdout}{proc.stderr}")
        (venv / READY).write_text(json.dumps({"made": time.strftime("%Y-%m-%d %H:%M:%S"), "packages": list(packages)}))
    return python3


def made_at(python3: Path) -> str:
    return json.loads((Path(python3).parent.parent / READY).read_text())["made"]
