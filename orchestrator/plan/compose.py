"""Compose a typed config from conf/, a recipe and command-line overrides (Hydra).

The root schema (schema.AudioLLMConfig) is registered as `base_config`, so a key
that does not exist or a value of the wrong type fails here with its full path.
recipes/*.yaml are registered as the `recipe` group (they live outside conf/ so
that a recipe is one visible file per reproducible run). The user's own folders
(config_path.py: --config-dir, $AUDIOLLM_CONFIG_PATH, audiollm.yaml) come first on
Hydra's search path and add recipes and group entries, or replace shipped ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re

from typing import Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from orchestrator.plan import config_path, paths, schema
from orchestrator.plan.shorthands import expand_shorthands

DEFAULT_RECIPE = paths.DEFAULT_RECIPE


class ComposeError(ValueError):
    """The configuration could not be composed (unknown key, wrong type, unknown recipe)."""


_registered: tuple | None = None  # what the store holds: the recipe files as last registered


def _register(dirs: Sequence[config_path.UserDir]) -> None:
    """Register the schema and the recipes of the search path, again only when the recipe
    that a name selects changed (another file, or its size or modification time):
    registering takes about 0.5 s, half of a compose, which a sweep of a hundred points
    (`audiollm plan -m`) or the tests would pay every time."""
    global _registered
    from hydra.core.config_store import ConfigStore

    from orchestrator.plan.schema import AudioLLMConfig

    recipes = config_path.recipe_files(dirs)
    signature = tuple((name, str(r.path), stat.st_mtime_ns, stat.st_size)
                      for name, r, stat in ((n, r, r.path.stat()) for n, r in recipes.items()))
    if signature == _registered:
        return
    nodes = {}
    for name, recipe in recipes.items():  # every file read before the store changes: a bad one leaves it whole
        try:
            node = OmegaConf.load(recipe.path)
        except Exception as exc:  # noqa: BLE001 - yaml's and omegaconf's errors alike
            raise ComposeError(f"recipe {recipe.path} cannot be read: {exc}") from None
        if not isinstance(node, DictConfig):
            raise ComposeError(f"recipe {recipe.path} must be a mapping of keys (like the shipped recipes/*.yaml)")
        # A recipe's name is its file's name: a copied recipe that still says `recipe: tiny_cpu`
        # would otherwise name its runs (and its run directories) after the one it was copied from.
        node.recipe = name
        nodes[name] = node
    store = ConfigStore.instance()
    store.store(name="base_config", node=AudioLLMConfig)
    store.repo.pop("recipe", None)  # a recipe of an earlier search path must not stay selectable
    for name, node in nodes.items():
        store.store(group="recipe", name=name, node=node, package="_global_")
    _registered = signature


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def with_default_recipe(overrides: Sequence[str]) -> list[str]:
    """`recipe=X` is accepted for `+recipe=X`; no recipe at all means the default one."""
    out: list[str] = []
    has_recipe = False
    for item in overrides:
        key = item.split("=", 1)[0]
        if key in ("recipe", "+recipe", "++recipe"):
            has_recipe = True
            item = "+recipe=" + item.split("=", 1)[1] if "=" in item else item
        out.append(item)
    if not has_recipe:
        out.insert(0, f"+recipe={DEFAULT_RECIPE}")
    return out


def recipe_name(overrides: Sequence[str]) -> str:
    """The recipe `overrides` select (the default one when they name none)."""
    return next(o.split("=", 1)[1] for o in with_default_recipe(overrides) if o.startswith("+recipe="))


# Groups that may be chosen on the command line without a recipe: where the metrics go
# changes nothing the default recipe's other values were set for.
WITHOUT_RECIPE = ("logger",)


def group_choice_without_recipe(overrides: Sequence[str]) -> str | None:
    """Why a command line that chooses a config group (`model=X`, `launcher=slurm`, ...) but
    no recipe is refused, or None. Such a choice would land on the default recipe and keep
    its other values, set for its tiny model on one CPU machine (the CPU accelerator, the
    demo data, the learning rate, the number of steps): `audiollm train
    model=gemma2_9b_whisper_large_v3 launcher=slurm` would queue a 9B model on CPUs.
    Value overrides (`optim.lr=1e-3`) keep applying to the default recipe. Checked by the
    commands, not by compose(), which programs and tests call with the default recipe's
    groups changed on purpose."""
    if any(_key(o) == "recipe" for o in overrides):
        return None
    try:
        dirs = config_path.user_dirs()
    except config_path.ConfigPathError:
        dirs = []  # compose() reports it
    groups = config_path.group_names(dirs) - set(WITHOUT_RECIPE)
    chosen = [o for o in overrides if "=" in o and _key(o) in groups]
    if not chosen:
        return None
    names = ", ".join(config_path.recipe_files(dirs))
    verb = "chooses a config group" if len(chosen) == 1 else "choose config groups"
    return (f"{' '.join(chosen)} {verb}, but no recipe is named: the choice would change the "
            f"default recipe {DEFAULT_RECIPE}\nand keep its other values, set for its tiny model on one CPU machine "
            f"(launcher.accelerator=cpu, the demo data, optim.lr, train.iters, ...).\n"
            f"Add +recipe=NAME to start from a recipe ({names}; `audiollm recipes` says what each is),\n"
            f"or +recipe={DEFAULT_RECIPE} to change the default run on purpose. Value overrides such as "
            f"optim.lr=1e-3 need no recipe.")


def source(overrides: Sequence[str]) -> dict:
    """Where the config of `overrides` comes from: the recipe's name and file and the whole
    search path, for the run directory (what ran can be found again)."""
    dirs = config_path.user_dirs()
    name = recipe_name(overrides)
    recipe = config_path.recipe_files(dirs).get(name)
    return {"recipe": name, "recipe_file": str(recipe.path) if recipe else None,
            "config_path": config_path.describe(dirs)}


# Dict settings whose keys are the user's (sbatch options): Hydra's struct mode refuses new
# keys under `key={k: v}` or `key.k=v`, which is how a user writes them; `++` adds them.
OPEN_DICTS = ("launcher.additional_sbatch",)


def with_open_dicts(overrides: Sequence[str]) -> list[str]:
    out = []
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" in item and any(key == d or key.startswith(d + ".") for d in OPEN_DICTS):
            item = "++" + item
        out.append(item)
    return out


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the config for `overrides` (Hydra override syntax). Raises ComposeError."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        dirs = config_path.user_dirs()
    except config_path.ConfigPathError as exc:
        raise ComposeError(str(exc)) from None
    _register(dirs)
    overrides = with_open_dicts(with_default_recipe(expand_shorthands(overrides)))
    try:
        with _initialize(dirs):
            cfg = hydra_compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ComposeError(_explain(exc, overrides)) from None
    problems = _unknown_keys(cfg) + _missing_values(cfg)
    if problems:
        raise ComposeError(f"invalid configuration (overrides: {' '.join(overrides)}):\n" + "\n".join(problems))
    return cfg


def _unknown_keys(node, path: str = "") -> list[str]:
    """One line per key of the composed config that its section's schema (a dataclass of
    orchestrator/plan/schema/) does not have: Hydra lets `+KEY=VALUE` and `++KEY=VALUE` add
    one to a structured config, where nothing would read it (`+parallel.tpp=2` trained at
    TP 1). The open dicts (OPEN_DICTS) take any key."""
    lines = []
    if isinstance(node, ListConfig):
        for index in range(len(node)):
            child = node._get_node(index)
            if isinstance(child, (DictConfig, ListConfig)):
                lines += _unknown_keys(child, f"{path}[{index}]")
        return lines
    kind = OmegaConf.get_type(node)
    known = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    for key in node.keys():
        full = f"{path}.{key}" if path else str(key)
        if known is not None and key not in known:
            lines.append("  " + _unknown_key_line(full, kind) + ": a key added with + or ++ would be kept and read "
                                                                "by nothing")
            continue
        child = node._get_node(key)
        if full not in OPEN_DICTS and isinstance(child, (DictConfig, ListConfig)):
            lines += _unknown_keys(child, full)
    return lines


@contextlib.contextmanager
def _initialize(dirs: Sequence[config_path.UserDir]):
    """hydra.initialize_config_dir(conf/) with the user's folders searched before conf/.
    Hydra's own way to add folders (`hydra.searchpath`) puts them after conf/, where a
    shipped entry would hide the user's of the same name; so the search path is built
    here as initialize_config_dir builds it (hydra-core is pinned in pyproject.toml)."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase(None)
    search_path = create_config_search_path(str(paths.conf_dir()))
    for entry in dirs:  # each before conf/ ("main"), after the ones already placed
        search_path.prepend("audiollm-user", f"file://{entry.path}", anchor="main")
    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def _unknown_key_line(full_key: str, kind: type) -> str:
    """The error for `full_key`, which the dataclass `kind` of its section has no field for,
    with the closest field's key."""
    path, _, key = full_key.split(" ")[0].rpartition(".")
    close = difflib.get_close_matches(key, [f.name for f in dataclasses.fields(kind)], n=1)
    hint = f"did you mean {path + '.' if path else ''}{close[0]}?" if close else "no setting there is named so"
    return (f"error: [unknown_key] {full_key} is not a setting ({kind.__name__} has no {key!r}; {hint} a dry run, "
            f"launcher.dry_run=true, prints every key)")


def _missing_values(cfg) -> list[str]:
    """One line per value that has no default and was not set (omegaconf's `???`), which
    would otherwise surface as a traceback wherever it is first read."""
    lines = []
    for key in sorted(OmegaConf.missing_keys(cfg)):
        entry = re.match(r"^data\.(train|validation)\[(\d+)\]\.(\w+)$", key)
        if entry:
            listed, index, field = entry.groups()
            name = OmegaConf.select(cfg, f"data.{listed}[{index}].name")
            lines.append(f"  error: [data] data.{listed}[{index}] (name {name!r}) has no {field}: every dataset entry "
                         f"needs one, e.g. {{name: {name}, {field}: /data/{name}}}")
        else:
            lines.append(f"  error: [missing] {key} is not set and has no default: set it ({key}=...)")
    return lines


# Keys renamed since a release: refused with their new names (never silently ignored).
RENAMED = {"train.eval_wer": "train.eval_generation", "train.eval_wer_batches": "train.eval_generation_batches",
           "train.eval_wer_max_new_tokens": "train.eval_generation_max_new_tokens"}


def _renamed(text: str) -> list[str]:
    return [f"{old} is now {new} (it scores WER, exact match or BLEU, each dataset by its metric): write {new}"
            for old, new in RENAMED.items() if re.search(rf"\b{re.escape(old)}\b(?!_)", text)]


def _explain(exc: Exception, overrides: Sequence[str]) -> str:
    text = str(exc).strip()
    renamed = _renamed(f"{text} {' '.join(overrides)}")
    if renamed:
        return f"invalid configuration (overrides: {' '.join(overrides)}):\n" + "\n".join(renamed)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += "\n" + str(cause).strip()
    unknown = re.search(r"Key '\w+' not in '(\w+)'\s+full_key: (\S+)", text)
    kind = getattr(schema, unknown.group(1), None) if unknown else None
    if dataclasses.is_dataclass(kind):  # instead of Hydra's hint to add the key with +, which nothing reads
        key, within = unknown.group(2), re.search(r"Could not override '([^']+)'", text)
        if "." not in key and within and within.group(1) != key:  # a key of a value given whole (a list's entry)
            key = f"{key} (in {within.group(1)})"
        return f"invalid configuration (overrides: {' '.join(overrides)}):\n  {_unknown_key_line(key, kind)}"
    if "Could not find 'recipe/" in text:  # perhaps one of the user's, in a folder not given this time
        text += (f"\nYour own recipes are searched in the folders of --config-dir, ${config_path.ENV_VAR} and "
                 f"{config_path.PROJECT_FILE}'s config_path; `audiollm recipes` lists every recipe found.")
    return f"invalid configuration (overrides: {' '.join(overrides)}):\n{text}"
