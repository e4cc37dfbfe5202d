"""constraints.txt, the versions setup.sh installs within, agrees with pyproject.toml:
every dependency of the project and of its test extra is pinned there, at a version its
range allows. A range moved without the pins fails here, naming both, rather than in the
installer of a fresh set-up."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def _pins() -> dict:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_is_pinned_within_its_range():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    pins = _pins()
    assert {"torch", "megatron-core", "transformers", "numpy", "pytest"} <= set(pins)
    wrong = [f"{r} (constraints.txt: {pins.get(canonicalize_name(r.name), 'not pinned')})" for r in requirements
             if canonicalize_name(r.name) not in pins
             or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not wrong, ("pyproject.toml's ranges and constraints.txt disagree (docs/project.md, 'Dependency "
                       "choices', says how to move the pins): " + "; ".join(wrong))
