"""Every config key declared in the schema is read by product code.

A key that is declared (orchestrator/plan/schema/*.py) but read nowhere is a silent
no-op: a user sets it, composition accepts it, and nothing changes
(`model.init_checkpoint` was such a key for months). This test walks every field
of every dataclass reachable from the root config, AudioLLMConfig (nested
sections, and entries of lists such as `data.train[]` and `lora.lr_groups[]`),
and looks for a read of it in the product sources: orchestrator/**/*.py and
launchers/**/*.py, minus orchestrator/plan/schema/ (declares), orchestrator/plan/validate.py and its
rules, orchestrator/plan/rules/ (check values, do not use them: in this repository's history lora.alpha,
logger.* and train.eval_interval were validated before any code used them). YAML
under conf/ and recipes/ only sets values, so it does not count either.

Each product file is parsed with `ast` (comments and docstrings never count). A
field `a.b.name` is read when some file has
  * an attribute access `.name`            (cfg.model.encoder.d_model, dec.freeze)
  * a string constant equal to "name"      (section.get("name"), s["name"], getattr(c, "name"))
  * a dotted-path string naming the field, whole or by its last two or more
    components, plain or as an OmegaConf interpolation
    ("model.encoder.mask_padding", "encoder.mask_padding", "${data.seq_length}").
Stricter for ambiguous names of a section's field (a name declared by more than
one schema class, or an everyday word in GENERIC): the file that reads it must
also mention the enclosing field's name, e.g. `model.spec_augment.enabled` needs
a file that reads `enabled` and mentions `spec_augment`. Fields of list entries
are read by generic code (sources.resolve_entries takes any list of entries), so
they get the plain check.

Limits: a static, name-based check. It proves the name is read somewhere, not
that the value reaches the code it should drive, nor that the read is on the
right object (an everyday name read for another purpose passes). It is a tripwire
for keys nobody reads, not a proof of wiring; behaviour is for the other tests.
"""

import ast
import dataclasses
import re
import typing
from collections import defaultdict
from pathlib import Path

from orchestrator.plan.schema import AudioLLMConfig

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = (ROOT / "orchestrator", ROOT / "launchers")
NOT_READERS = (ROOT / "orchestrator" / "plan" / "schema", ROOT / "orchestrator" / "plan" / "validate.py",
               ROOT / "orchestrator" / "plan" / "rules")

# Everyday words: a read of one proves little unless the enclosing section is near.
GENERIC = {"name", "path", "enabled", "kind", "mode", "weight", "seed", "backend", "entry", "setup", "wait"}

# Fields consumed only outside Python (none so far), each with a one-line reason.
ALLOWLIST: dict[str, str] = {}

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\[\d*\])?(?:\.[A-Za-z_]\w*(?:\[\d*\])?)+")
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class SchemaField:
    path: str  # dotted; "[]" after a list of entries: "data.train[].weight"
    name: str
    owner: type  # the dataclass that declares it
    parent: str | None  # the enclosing section's field name; None at the root and in list entries


def _dataclass_in(annotation) -> type | None:
    """The dataclass in an annotation: X, Optional[X], List[X], Dict[str, X]."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    return next(filter(None, map(_dataclass_in, typing.get_args(annotation))), None)


def schema_fields(cls: type, prefix: str = "", parent: str | None = None) -> list[SchemaField]:
    """Every field reachable from dataclass `cls`, depth first."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        out.append(SchemaField(path, f.name, cls, parent))
        nested = _dataclass_in(hints[f.name])
        if nested is not None:
            if typing.get_origin(hints[f.name]) in (list, dict):  # entries: data.train[].path
                out += schema_fields(nested, path + "[].", None)
            else:
                out += schema_fields(nested, path + ".", f.name)
    return out


@dataclasses.dataclass
class FileReads:
    names: set[str]  # read as `.name` or "name"
    paths: set[str]  # dotted-path strings, list indices dropped: "data.train.path"
    words: set[str]  # every identifier and word of a string in the file (for the parent check)


def file_reads(source: str) -> FileReads:
    reads = FileReads(set(), set(), set())
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            reads.names.add(node.attr)
            reads.words.add(node.attr)
        elif isinstance(node, ast.Name):
            reads.words.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.isidentifier():
                reads.names.add(text)
            # A whole string "a.b.c" or an interpolation "${a.b.c}"; a docstring is neither.
            inner = re.fullmatch(r"\$\{(.+)\}", text)
            if _DOTTED.fullmatch(inner.group(1) if inner else text):
                reads.paths.add(re.sub(r"\[\d*\]", "", inner.group(1) if inner else text))
            reads.words.update(_WORD.findall(text))
    return reads


def product_reads() -> dict[Path, FileReads]:
    files = sorted(p for d in PRODUCT_DIRS for p in d.rglob("*.py")
                   if not any(p.is_relative_to(x) for x in NOT_READERS))
    assert len(files) > 20, f"product sources not found under {PRODUCT_DIRS}"
    return {p: file_reads(p.read_text()) for p in files}


def unread_fields(fields: list[SchemaField], sources: dict[Path, FileReads]) -> list[str]:
    """Dotted paths of the fields that no source reads."""
    owners = defaultdict(set)
    for f in fields:
        owners[f.name].add(f.owner)
    all_paths = set().union(*(r.paths for r in sources.values()))
    unread = []
    for f in fields:
        parts = f.path.replace("[]", "").split(".")
        if any(".".join(parts[i:]) in all_paths for i in range(len(parts) - 1)):
            continue
        strict = f.parent is not None and (len(owners[f.name]) > 1 or f.name in GENERIC)
        if not any(f.name in r.names and (not strict or f.parent in r.words) for r in sources.values()):
            unread.append(f.path)
    return unread


def test_every_schema_field_is_read_by_product_code():
    unread = [p for p in unread_fields(schema_fields(AudioLLMConfig), product_reads()) if p not in ALLOWLIST]
    assert not unread, (
        f"{len(unread)} config field(s) declared in orchestrator/plan/schema/ are read by no product code "
        "(orchestrator/, launchers/; validate.py does not count):\n  " + "\n  ".join(unread) + "\n"
        "Wire each one into the code it is meant to drive, or remove it from the schema "
        "(and from conf/ and recipes/). What counts as a read: this file's docstring."
    )


@dataclasses.dataclass
class _Probe:
    never_read_field_xyz: int = 0
    enabled: bool = False  # an everyday name read elsewhere, but never near `made_up_section`
    seq_length: int = 0  # read (data.seq_length): must not be reported


@dataclasses.dataclass
class _ProbeRoot:
    made_up_section: _Probe = dataclasses.field(default_factory=_Probe)
    made_up_entries: typing.List[_Probe] = dataclasses.field(default_factory=list)


def test_checker_reports_unread_fields():
    """The coverage test cannot pass vacuously: made-up keys are reported, read ones are not."""
    assert unread_fields(schema_fields(_ProbeRoot), product_reads()) == [
        "made_up_section",
        "made_up_section.never_read_field_xyz",
        "made_up_section.enabled",
        "made_up_entries",
        "made_up_entries[].never_read_field_xyz",
    ]


def test_read_forms():
    source = '''
"""Docstring naming doc_only_key and model.doc_only_path."""
a = cfg.attr_key  # comment_key
b = section.get("get_key"), section["item_key"], getattr(cfg, "getattr_key")
c = OmegaConf.select(cfg, "model.encoder.dotted_key"), "${data.interp_key}", "data.train[0].indexed_key"
'''
    reads = file_reads(source)
    assert {"attr_key", "get_key", "item_key", "getattr_key"} <= reads.names
    assert {"model.encoder.dotted_key", "data.interp_key", "data.train.indexed_key"} <= reads.paths
    assert not {"doc_only_key", "comment_key"} & reads.names
    assert not any("doc_only_path" in p for p in reads.paths)
