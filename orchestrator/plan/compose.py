"""Compose a typed config from conf/, a recipe and command-line overrides (Hydra).

The root schema (schema.AudioLLMConfig) is registered as `base_config`, so a key
that does not exist or a value of the wrong type fails here with its full path.
recipes/*.yaml are registered as the `recipe` group (they live outside conf/ so
that a recipe is one visible file per reproducible run).
"""

from __future__ import annotations

import re

from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from orchestrator.plan import paths

DEFAULT_RECIPE = "tiny_cpu"


class ComposeError(ValueError):
    """The configuration could not be composed (unknown key, wrong type, unknown recipe)."""


_registered: tuple | None = None  # what the store holds: the recipe files as last registered


def _register() -> None:
    """Register the schema and the recipes, again only when a recipe file changed (name,
    size or modification time): registering takes about 0.5 s, half of a compose, which
    a sweep of a hundred points (`audiollm plan -m`) or the tests would pay every time."""
    global _registered
    from hydra.core.config_store import ConfigStore

    from orchestrator.plan.schema import AudioLLMConfig

    recipes = sorted(paths.recipes_dir().glob("*.yaml"))
    signature = tuple((str(path), stat.st_mtime_ns, stat.st_size) for path, stat in ((p, p.stat()) for p in recipes))
    if signature == _registered:
        return
    store = ConfigStore.instance()
    store.store(name="base_config", node=AudioLLMConfig)
    for path in recipes:
        store.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")
    _registered = signature


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
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _register()
    overrides = with_open_dicts(with_default_recipe(overrides))
    try:
        with initialize_config_dir(str(paths.conf_dir()), version_base=None):
            cfg = hydra_compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ComposeError(_explain(exc, overrides)) from None
    missing = _missing_values(cfg)
    if missing:
        raise ComposeError(f"invalid configuration (overrides: {' '.join(overrides)}):\n" + "\n".join(missing))
    return cfg


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
    return f"invalid configuration (overrides: {' '.join(overrides)}):\n{text}"
