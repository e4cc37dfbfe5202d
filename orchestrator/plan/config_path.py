"""The user's own recipes and config groups: the folders searched before the shipped ones.

A user folder holds `recipes/NAME.yaml` and/or config group folders named as in conf/
(`model/`, `data/`, `launcher/`, ...; a new name makes a new group). A file there replaces
the shipped one of the same name, or adds one. Folders are searched in this order, the
first that has a file winning:

1. `--config-dir DIR` on the command line (repeatable; the first given first);
2. `$AUDIOLLM_CONFIG_PATH`: folders separated by `os.pathsep` (':'), the first first;
3. `config_path: [DIR, ...]` in the project file `audiollm.yaml` found in the current
   directory or the nearest parent (a repository carries its own configs this way),
   each DIR relative to that file;
4. the shipped conf/ and recipes/ (paths.py).

Nothing here imports Hydra: `audiollm recipes` lists recipes without it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from orchestrator.plan import paths

ENV_VAR = "AUDIOLLM_CONFIG_PATH"
PROJECT_FILE = "audiollm.yaml"
SHIPPED = "shipped"


class ConfigPathError(ValueError):
    """A folder of the search path cannot be used (missing, not a config folder, ...)."""


@dataclass(frozen=True)
class UserDir:
    path: Path  # absolute
    origin: str  # "--config-dir", "$AUDIOLLM_CONFIG_PATH" or the project file's path


@dataclass(frozen=True)
class RecipeFile:
    name: str
    path: Path  # absolute
    origin: str  # SHIPPED or the UserDir's origin
    hides: tuple[Path, ...] = ()  # files of the same name further down the search path


# Set by the commands' --config-dir for the duration of the command (command_line_dirs):
# every compose() inside it, a sweep's points included, sees the same folders without each
# function in between passing them on.
_command_line: tuple[Path, ...] = ()


@contextlib.contextmanager
def command_line_dirs(dirs: Sequence[str | os.PathLike] | None) -> Iterator[None]:
    global _command_line
    saved = _command_line
    _command_line = tuple(_absolute(d) for d in dirs or ())
    try:
        yield
    finally:
        _command_line = saved


def add_argument(parser: argparse.ArgumentParser) -> None:
    """The same --config-dir on every command that composes a config."""
    parser.add_argument(
        "--config-dir", action="append", metavar="DIR", default=[],
        help="a folder of your own recipes (DIR/recipes/NAME.yaml) and config group entries (DIR/model/NAME.yaml, "
             f"DIR/data/, DIR/launcher/, ...), searched before ${ENV_VAR}, the project file {PROJECT_FILE}'s "
             "config_path and the shipped configs; a file there replaces the one of the same name. Repeatable: "
             "the first given wins")


def _absolute(path: str | os.PathLike, base: Path | None = None) -> Path:
    path = Path(path).expanduser()
    return Path(os.path.normpath(path if path.is_absolute() else (base or Path.cwd()) / path))


def project_file(cwd: Path | None = None) -> Path | None:
    """audiollm.yaml in `cwd` or its nearest parent that has one."""
    start = _absolute(cwd or Path.cwd())
    for folder in (start, *start.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
    return None


def _project_dirs(path: Path) -> list[Path]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigPathError(f"{path} cannot be read: {exc}") from None
    data = {} if data is None else data
    example = "config_path: [configs]"
    if not isinstance(data, dict):
        raise ConfigPathError(f"{path} must be a mapping, e.g. `{example}`")
    unknown = sorted(set(data) - {"config_path"})
    if unknown:  # a typo would otherwise leave the user's folders silently unused
        raise ConfigPathError(f"{path}: unknown key(s) {', '.join(map(str, unknown))}; the file holds only "
                              f"config_path, e.g. `{example}`")
    listed = data.get("config_path") or []
    listed = [listed] if isinstance(listed, str) else listed
    if not isinstance(listed, list) or not all(isinstance(d, str) for d in listed):
        raise ConfigPathError(f"{path}: config_path must be a folder or a list of folders (relative to the file), "
                              f"e.g. `{example}`; got {data.get('config_path')!r}")
    return [_absolute(d, base=path.parent) for d in listed]


def _check(entry: UserDir) -> None:
    where = f"{entry.path} (from {entry.origin})"
    if not entry.path.is_dir():
        raise ConfigPathError(f"config folder {where} does not exist")
    if (entry.path / "config.yaml").exists():
        # Hydra would take it for the root config (conf/config.yaml) and drop the shipped defaults.
        raise ConfigPathError(f"config folder {where} holds a config.yaml: a config folder holds recipes/ and "
                              f"config group folders (model/, data/, ...), and the root config stays the shipped one")
    if not any(sub.is_dir() and any(sub.glob("*.yaml")) for sub in entry.path.iterdir()):
        raise ConfigPathError(f"config folder {where} holds no recipes/*.yaml and no config group folder "
                              f"(model/*.yaml, data/*.yaml, ...)")


def user_dirs(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> list[UserDir]:
    """The user's folders, the first searched first; each checked (ConfigPathError)."""
    environ = os.environ if environ is None else environ
    entries = [UserDir(p, "--config-dir") for p in _command_line]
    entries += [UserDir(_absolute(d, cwd), f"${ENV_VAR}") for d in environ.get(ENV_VAR, "").split(os.pathsep) if d]
    project = project_file(cwd)
    if project is not None:
        entries += [UserDir(p, str(project)) for p in _project_dirs(project)]
    seen: set[Path] = set()
    out = []
    for entry in entries:
        if entry.path not in seen:  # named twice: its first place counts
            seen.add(entry.path)
            _check(entry)
            out.append(entry)
    return out


def describe(dirs: Sequence[UserDir]) -> list[dict]:
    """The whole search path, first searched first: what a run directory records."""
    return ([{"dir": str(d.path), "from": d.origin} for d in dirs]
            + [{"dir": str(paths.conf_dir()), "from": SHIPPED}, {"dir": str(paths.recipes_dir()), "from": SHIPPED}])


def recipe_files(dirs: Sequence[UserDir]) -> dict[str, RecipeFile]:
    """Every recipe by name: the file that wins, and the ones of the same name it hides."""
    found: dict[str, list[tuple[Path, str]]] = {}
    sources = [(d.path / "recipes", d.origin) for d in dirs] + [(paths.recipes_dir(), SHIPPED)]
    for folder, origin in sources:
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, []).append((path, origin))
    return {name: RecipeFile(name, files[0][0], files[0][1], tuple(p for p, _ in files[1:]))
            for name, files in sorted(found.items())}


@functools.lru_cache(maxsize=1)
def shipped_experiments() -> dict[str, list[str]]:
    """run.experiment -> the shipped recipes that set it (a copy of one keeps it); read once
    a process (a sweep validates every point)."""
    import yaml

    out: dict[str, list[str]] = {}
    for path in sorted(paths.recipes_dir().glob("*.yaml")):
        experiment = ((yaml.safe_load(path.read_text()) or {}).get("run") or {}).get("experiment")
        if experiment:
            out.setdefault(str(experiment), []).append(path.stem)
    return out


def group_names(dirs: Sequence[UserDir]) -> set[str]:
    """Config groups: the folders of conf/ and the user's (other than recipes/)."""
    roots = [paths.conf_dir(), *(d.path for d in dirs)]
    return {sub.name for root in roots if root.is_dir() for sub in root.iterdir()
            if sub.is_dir() and sub.name != "recipes"}


def header(path: Path) -> str:
    """A recipe's first comment line after Hydra's `# @package` line, without the leading
    `NAME — ` (the listing shows the name beside it)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        return f"(cannot be read: {exc})"
    for line in lines:
        text = line.strip()
        if not text.startswith("#"):
            if text:
                break  # the header is the comment block before the first value
            continue
        text = text.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return re.sub(rf"^{re.escape(path.stem)}\s*[—–-]+\s*", "", text)
    return "(no header comment)"


def _recipes_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiollm recipes",
        description="List every recipe (+recipe=NAME): where its file comes from (shipped, or one of your config "
                    "folders) and its header line.")
    add_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def recipes_main(argv: Sequence[str]) -> int:
    """`audiollm recipes [--config-dir DIR] [--json]`"""
    args = _recipes_parser().parse_args(list(argv))
    with command_line_dirs(args.config_dir):
        try:
            dirs = user_dirs()
        except ConfigPathError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        recipes = recipe_files(dirs)
    if args.json:
        print(json.dumps({
            "config_path": describe(dirs), "default": paths.DEFAULT_RECIPE,
            "recipes": [{"name": r.name, "file": str(r.path), "from": r.origin, "header": header(r.path),
                         "hides": [str(p) for p in r.hides]} for r in recipes.values()]}))
        return 0
    rows = [(r.name + (" (default)" if r.name == paths.DEFAULT_RECIPE else ""),
             SHIPPED if r.origin == SHIPPED else str(r.path), header(r.path)) for r in recipes.values()]
    width = [max(len(row[i]) for row in rows) for i in (0, 1)]
    for (name, source, text), recipe in zip(rows, recipes.values()):
        print(f"{name:<{width[0]}}  {source:<{width[1]}}  {text}")
        for hidden in recipe.hides:
            print(f"{'':<{width[0]}}  (replaces {hidden})")
    print("\nsearched in this order, the first file of a name winning:")
    for entry in describe(dirs):
        print(f"  {entry['dir']}  ({entry['from']})")
    print(f"\n`audiollm plan +recipe=NAME` shows what one would run; without +recipe, {paths.DEFAULT_RECIPE}.")
    return 0
