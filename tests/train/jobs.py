"""Launch the training job under test on torchrun's terms and read what it reports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests import zygote
from orchestrator.runtime.ports import free_port
from tests.distributed_run import REPO, rank_env

HERE = Path(__file__).parent


def launch(script: str, nproc: int, *args: str, log_dir: Path, env: dict | None = None, expect_rc: int = 0,
           timeout: int = 300) -> str:
    """HERE/script (or "pkg.module", run as the launchers do) on `nproc` ranks forked by
    tests/zygote.py as torchrun would start them; their output goes to a file in log_dir."""
    log_path = Path(log_dir) / f"{Path(script).stem}-{'-'.join(a.replace('/', '_')[-20:] for a in args[:1])}-{free_port()}.log"
    target = ["-m", script] if not script.endswith(".py") else [str(HERE / script)]
    returncode = zygote.run(target, nproc, list(args), env=rank_env(env), cwd=REPO, log_path=log_path,
                            timeout=timeout)
    output = log_path.read_text(errors="replace")
    if (returncode == 0) != (expect_rc == 0):
        raise AssertionError(f"torchrun {script} {' '.join(args)} exited {returncode}, "
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
