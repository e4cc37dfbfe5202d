"""Launch the training job under test with torchrun and read what it reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.distributed_run import REPO, free_port

HERE = Path(__file__).parent


def launch(script: str, nproc: int, *args: str, log_dir: Path, env: dict | None = None, expect_rc: int = 0,
           timeout: int = 300) -> str:
    """torchrun HERE/script; output goes to a file (not a pipe), so a rank that dies
    hard cannot leave the test waiting on a pipe a child still holds."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONWARNINGS"] = "ignore"
    full_env.update(env or {})
    log_path = Path(log_dir) / f"{Path(script).stem}-{'-'.join(a.replace('/', '_')[-20:] for a in args[:1])}-{free_port()}.log"
    # "pkg.module" (no .py) runs a module of the project, as the launchers do.
    target = ["-m", script] if not script.endswith(".py") else [str(HERE / script)]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", *target, *args]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=full_env, cwd=REPO)
    output = log_path.read_text()
    if (proc.returncode == 0) != (expect_rc == 0):
        raise AssertionError(f"torchrun {script} {' '.join(args)} exited {proc.returncode}, "
                             f"expected {expect_rc}:\n{output[-6000:]}")
    if expect_rc:
        assert f"exitcode: {expect_rc}" in output, output[-4000:]
    return output


def result(output: str) -> dict:
    match = re.search(r"^RESULT (.*)$", output, re.M)
    assert match, output[-4000:]
    return json.loads(match.group(1))


def metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
