"""The launcher kinds `launcher.kind` may name: each one's module, and what the plan's
rules must know of it.

This table is a kind's registration. What a kind does (submit, follow, cancel, explain
how its tasks ended) is its module under launchers/kinds/, behind the interface of
launchers/kinds/__init__.py; the planning side imports no launcher, so the one trait its
rules ask about is written here, beside the module's name. docs/project.md, "How to add a
launcher", names the files a new kind touches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherKind:
    module: str  # the kind's module: a `LAUNCHER` (launchers.kinds.Launcher) at its top level
    # Every rank runs on the machine that submits: launcher.nodes must be 1, and the tokenizer
    # and local datasets must exist here (rules/run.py, rules/data.py).
    one_machine: bool


KINDS: dict[str, LauncherKind] = {
    "local": LauncherKind("launchers.kinds.local", one_machine=True),
    "slurm": LauncherKind("launchers.kinds.slurm", one_machine=False),
}
