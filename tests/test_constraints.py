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


def test_the_gpu_machines_stack_is_an_installable_pin_set_the_rehearsal_uses():
    """constraints-gpu-machine.txt states the lent GPU machines' torch, transformers and
    numpy (docs/gpu-machines.md) as pins pip installs; the rehearsal builds its machine from
    it; its torch is one the project's range admits (the kit runs the job beside it)."""
    from tests.rehearsal.lent_machine import MACHINE_PACKAGES

    pins = dict(line.split("==") for line in MACHINE_PACKAGES)
    assert set(pins) == {"torch", "transformers", "numpy"}, MACHINE_PACKAGES
    assert Version(pins["transformers"]).major == 5 and Version(pins["numpy"]) >= Version("2.5")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_range = next(Requirement(r) for r in project["dependencies"] if r.startswith("torch>")).specifier
    assert torch_range.contains(pins["torch"]), (str(torch_range), pins["torch"])
