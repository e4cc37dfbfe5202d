"""Every key of the schema gets a plausible wrong value (tests/orchestrator/config_key_table.py):
plan refuses it, its message naming the key and the value, or the table says why it is
fine and where else it would be refused. A key added to the schema without an entry fails
here; docs/config-keys.md is the table as generated."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.orchestrator.config_key_table import TABLE, markdown, schema_defaults
from tests.orchestrator.test_schema_coverage import _dataclass_in, schema_fields

REPO = Path(__file__).resolve().parents[2]
# A list-of-entries key is tried in the second entry of a list (its field replaced by the
# value tried), after a good first one.
LIST_ENTRIES = {"data.train": ({"name": "a", "path": "'CORPUS/train/tones_a'"},
                               {"name": "b", "path": "'CORPUS/train/tones_b'"}),
                "data.validation": ({"name": "a", "path": "'CORPUS/val/tones_val'"},
                                    {"name": "b", "path": "'CORPUS/val/tones_val'"}),
                "lora.lr_groups": ({"name": "a", "patterns": "['language_model.*']", "lr_scale": "1.0"},
                                   {"name": "b", "patterns": "['*']", "lr_scale": "1.0"})}

def schema_keys() -> set:
    import typing

    from orchestrator.plan.schema import AudioLLMConfig

    keys = set()
    for f in schema_fields(AudioLLMConfig):
        hint = typing.get_type_hints(f.owner)[f.name]
        if _dataclass_in(hint) is None or typing.get_origin(hint) in (list, dict):
            keys.add(f.path)  # a value, or a list of entries; not a section
    return keys


def test_every_schema_key_has_an_entry_and_every_entry_a_key():
    keys = schema_keys()
    assert sorted(keys - set(TABLE)) == [], "schema keys without an entry in tests/orchestrator/config_key_table.py"
    assert sorted(set(TABLE) - keys) == [], "entries of keys the schema no longer has"


def test_the_docs_table_is_the_generated_one():
    assert (REPO / "docs" / "config-keys.md").read_text() == markdown(schema_defaults()), (
        "run `python -m tests.orchestrator.config_key_table` to write docs/config-keys.md again")


@pytest.fixture(scope="module")
def base():
    from orchestrator.plan.compose import compose
    from tests.train.audiollm_runs import data_overrides, shared_corpus

    corpus = shared_corpus()
    return compose(["+recipe=tiny_cpu", *data_overrides(corpus)]), corpus


def _override(key: str, value: str, corpus: Path) -> str:
    if "[]." not in key:
        return f"{key}={value}"
    owner, field = key.split("[].")
    first, second = LIST_ENTRIES[owner]
    entries = [first, {**second, field: value}]
    text = ",".join("{" + ",".join(f"{k}:{v}" for k, v in e.items()) + "}" for e in entries)
    return f"{owner}=[{text}]".replace("CORPUS", str(corpus))

def _errors(cfg, overrides: list) -> list:
    """The plan's errors for `overrides` applied to `cfg` as Hydra applies them (parsed by its
    grammar, merged by OmegaConf); a value of the wrong type fails there, as composing it would."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from orchestrator.plan.resolve import to_object
    from orchestrator.plan.validate import validate

    cfg = copy.deepcopy(cfg)
    try:
        for override in OverridesParser.create().parse_overrides(overrides):
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
        obj = to_object(cfg)
    except Exception as exc:  # noqa: BLE001 - OmegaConf's validation errors
        return [str(exc)]
    return [f.message for f in validate(obj, "plan") if f.severity == "error"]


@pytest.mark.parametrize("key", sorted(TABLE))
def test_a_wrong_value_of_each_key_is_refused_or_said_to_be_fine(base, key):
    cfg, corpus = base
    entry = TABLE[key]
    errors = _errors(cfg, [*entry.needs, _override(key, entry.value, corpus)])
    if entry.works:
        assert errors == [], f"{key}={entry.value}: the table says it is fine ({entry.works}), but plan refuses it"
        return
    leaf = key.rsplit(".", 1)[-1]
    value = entry.value.strip("'")
    named = [e for e in errors if leaf in e and (value in e or not re.fullmatch(r"[\w./<>*-]+", value))]
    assert named, f"{key}={entry.value}: no error names the key and the value: {errors}"
