"""Where the shipped configuration lives.

In a source checkout (and an editable install) conf/ and recipes/ sit at the top
of the repository; a regular install ships them inside this package as
orchestrator/_conf and orchestrator/_recipes (see pyproject.toml package-dir).
"""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # the orchestrator package

DEFAULT_RECIPE = "tiny_cpu"  # what a command without +recipe= composes


def _first_existing(*candidates: Path) -> Path:
    for path in candidates:
        if path.is_dir():
            return path
    raise FileNotFoundError("none of these exist: " + ", ".join(str(p) for p in candidates))


def conf_dir() -> Path:
    return _first_existing(_PACKAGE / "_conf", _PACKAGE.parent / "conf")


def recipes_dir() -> Path:
    return _first_existing(_PACKAGE / "_recipes", _PACKAGE.parent / "recipes")


def recipe_names() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))
