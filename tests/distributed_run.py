"""Run a Python script under torchrun from a test (real processes, gloo on CPU)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torchrun(script: Path | str, nproc: int, *args: str, timeout: int = 300, env: dict | None = None) -> str:
    """Run `script` on `nproc` local ranks (forked by tests/zygote.py, as torchrun would
    start them); return their combined output, fail with it on error."""
    import tempfile

    from tests import zygote

    with tempfile.TemporaryDirectory(prefix="audiollm-torchrun-") as tmp:
        log = Path(tmp) / "ranks.log"
        returncode = zygote.run([str(script)], nproc, list(args), env=rank_env(env), cwd=REPO, log_path=log,
                                timeout=timeout)
        output = log.read_text(errors="replace")
    if returncode != 0:
        raise AssertionError(f"torchrun {script} exited {returncode}:\n{output[-6000:]}")
    return output


def rank_env(extra: dict | None = None) -> dict:
    """The environment a test's ranks run in: this one, the repository importable, one
    OpenMP thread per rank unless the test says otherwise, warnings off."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONWARNINGS"] = "ignore"
    full_env.update(extra or {})
    return full_env
