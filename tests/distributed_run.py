"""Run a Python script under torchrun from a test (real processes, gloo on CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: Path | str, nproc: int, *args: str, timeout: int = 300, env: dict | None = None) -> str:
    """Run `script` on `nproc` local ranks; return combined output, fail with it on error."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONWARNINGS"] = "ignore"
    full_env.update(env or {})
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(script), *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"torchrun {script} exited {proc.returncode}:\n{output[-6000:]}")
    return output
