"""Golden files: text a test compares its output with, kept in the repository.

After an intended change, regenerate with
    AUDIOLLM_REGENERATE_GOLDEN=1 python -m pytest <the test file>
Only the value 1 regenerates. A regenerating run writes the files that changed and
fails, showing the diff, so that nobody mistakes it for a passing run; a second,
ordinary run then passes.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

VARIABLE = "AUDIOLLM_REGENERATE_GOLDEN"


def _diff(path: Path, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{path} (golden)",
                                        f"{path} (now)"))


def check_golden(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else None
    if os.environ.get(VARIABLE) == "1":
        if old == text:
            return
        path.write_text(text)
        pytest.fail(f"regenerated {path} ({VARIABLE}=1); what changed:\n" + (_diff(path, old, text) if old is not None
                                                                             else "(a new file)"))
    assert old is not None, f"no golden file {path}; create it with {VARIABLE}=1 python -m pytest"
    assert text == old, (f"output differs from the golden file; if intended, regenerate with {VARIABLE}=1\n"
                         + _diff(path, old, text))
