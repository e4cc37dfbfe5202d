"""What a checkpoint directory is, told from its files alone (submit side: no torch).

- a megatron dist_checkpointing directory (`metadata.json` names its sharded backend):
  a converted checkpoint (`audiollm convert hf-to-megatron`, with CONVERTED_META beside)
  or one step of a training run (`RUN/checkpoints/step_000100`);
- a run directory: its `checkpoints/latest` step;
- a HF model directory (`config.json` with a `model_type`): not loadable before conversion.

Every checkpoint a run saves carries MANIFEST: the size and CRC-32 of each of its files,
written after every rank's files are on disk and before the checkpoint is published.
`manifest_problem` tells a complete checkpoint from one damaged since (a truncated or
overwritten shard, a deleted file): a resume skips a damaged one for the newest complete
one instead of failing in the middle of the load. CRC-32 (zlib, about 4 GB/s on one core)
because this guards against damage, not tampering; a job's ranks each read their share.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterable, Optional, Tuple

CONVERTED_META = "audiollm_checkpoint.json"
# Sub-directories of a HF export (megatron-to-hf) that hf-to-megatron reads back.
ENCODER_SUBDIR = "whisper_encoder"
ADAPTER_SUBDIR = "audio_adapter"
MANIFEST = "manifest.json"
# A run's checkpoint: the parallel layout that wrote it, its data order's canonical
# nodes and the distributed optimizer's layout (None: none), for rules/topology.layout_change.
LAYOUT = "layout.json"
# A run's checkpoint that leaves out the frozen weights it loaded from another checkpoint
# (model.init_checkpoint; train.save_frozen_weights=false): which tensors, where they are,
# and that place's files as the run found them (frozen_source_problem).
FROZEN_SOURCE = "frozen_weights.json"
STEP_DIR = re.compile(r"^step_(\d{6,})$")


def file_record(path: Path) -> dict:
    """{'size', 'crc32'} of one file, read in 16 MiB blocks."""
    crc, size = 0, 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return {"size": size, "crc32": crc}


def checkpoint_files(path: Path) -> list:
    """The files of a checkpoint directory, relative, sorted (the manifest itself excluded)."""
    path = Path(path)
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(path: Path, files: dict) -> None:
    """MANIFEST of the checkpoint at `path`: `files` (name -> file_record)."""
    (Path(path) / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, sort_keys=True) + "\n")


def read_manifest(path: Path) -> Tuple[Optional[dict], Optional[str]]:
    """(files -> record, None), or (None, why there is none usable)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return None, f"no {MANIFEST}"
    try:
        return dict(json.loads(manifest.read_text())["files"]), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{MANIFEST} is unreadable ({type(exc).__name__})"


def manifest_problem(path: Path, files: dict, check_sums: Iterable[str] = ()) -> Optional[str]:
    """What is wrong with checkpoint `path` against its manifest `files`: every file
    present with its size (cheap), and the CRC-32 of those named in `check_sums`; None
    when nothing is."""
    path = Path(path)
    for name, record in sorted(files.items()):
        try:
            size = os.path.getsize(path / name)
        except OSError:
            return f"{name} is missing"
        if size != record["size"]:
            return f"{name} has {size} bytes, {record['size']} were written"
    for name in check_sums:
        if file_record(path / name)["crc32"] != files[name]["crc32"]:
            return f"{name} does not hold what was written (CRC-32 differs)"
    return None


def without_manifest(why: str, dist_format: bool) -> Optional[str]:
    """The problem of a checkpoint whose manifest is unusable (`why`): none for one
    published before checkpoints carried manifests (a dist_checkpointing directory,
    loaded unverified)."""
    return None if why == f"no {MANIFEST}" and dist_format else why


def source_files(path: Path) -> dict:
    """The files of a checkpoint another one leaves its frozen weights in, as recorded in
    FROZEN_SOURCE: its manifest's records (size and CRC-32) where it has one, else each
    file's size."""
    files, _ = read_manifest(path)
    if files is not None:
        return files
    return {name: {"size": os.path.getsize(Path(path) / name)} for name in checkpoint_files(path)}


def frozen_source(path: Path) -> Optional[dict]:
    """FROZEN_SOURCE of the checkpoint at `path` ({'source', 'files', 'tensors'}), or None
    when the checkpoint holds all its model weights."""
    record = Path(path) / FROZEN_SOURCE
    return json.loads(record.read_text()) if record.is_file() else None


def frozen_source_problem(path: Path) -> Optional[str]:
    """Why the frozen weights the checkpoint at `path` leaves in another checkpoint (and
    that one in another, ...) cannot be read back as they were, or None: the place is gone,
    a file of it is missing or of another size, or its manifest differs (another
    checkpoint written there since)."""
    seen = set()
    while (record := frozen_source(path)) is not None:
        source = Path(record["source"])
        head = (f"{path} leaves its {len(record['tensors'])} frozen tensors (train.save_frozen_weights=false) in "
                f"{source}, the model.init_checkpoint of the run that wrote it")
        if str(source) in seen or not source.is_dir():
            return (f"{head}, which does not exist: put that checkpoint back (or the same weights, converted again "
                    f"with `audiollm convert hf-to-megatron` to {source})")
        changed = manifest_problem(source, record["files"])
        manifest, _ = read_manifest(source)
        if changed is None and manifest is not None and manifest != record["files"]:
            changed = f"{MANIFEST} lists other files than when the run started"
        if changed:
            return f"{head}, whose files changed since ({changed}): put back the checkpoint the run started from"
        seen.add(str(source))
        path = source
    return None


def checkpoint_problem(path: Path) -> Optional[str]:
    """One process's whole check of one checkpoint (sizes and checksums); None when it is
    complete (or predates manifests: without_manifest)."""
    files, why = read_manifest(path)
    if files is None:
        return without_manifest(why, is_dist_checkpoint(path))
    return manifest_problem(path, files, sorted(files))


def step_dirs(run_dir: Path) -> list:
    """A run's published checkpoints (checkpoints/step_N), newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name) and p.is_dir()),
                  key=lambda p: int(STEP_DIR.match(p.name).group(1)), reverse=True)


# RUN/checkpoints/holds/<step name>/<holder>.json: another run's checkpoints read their
# frozen weights from that checkpoint of RUN (FROZEN_SOURCE); RUN's retention keeps it.
HOLDS = "holds"


def _run_step(path: Path) -> Optional[Path]:
    """`path` resolved, where it is a published checkpoint of a training run
    (RUN/checkpoints/step_N, or Megatron-LM's iter_ name for it); else None."""
    path = Path(path).resolve()
    return path if STEP_DIR.match(path.name) and path.parent.name == "checkpoints" else None


def hold_checkpoint(source: Path, holder_run_dir: Path) -> Optional[Path]:
    """Where `source` is a checkpoint of a training run, record that the run at
    `holder_run_dir` reads frozen weights from it, so that the source run's retention
    (train.keep_last, train.keep_every) never deletes it; returns the hold's file. None
    where `source` is no run's checkpoint (a converted one: nothing prunes it). Raises
    OSError where the source run's directory cannot be written."""
    step = _run_step(source)
    if step is None:
        return None
    holder = str(Path(holder_run_dir).resolve())
    hold = step.parent / HOLDS / step.name / f"{zlib.crc32(holder.encode()):08x}.json"
    if not hold.is_file():
        hold.parent.mkdir(parents=True, exist_ok=True)
        tmp = hold.with_name(f".{hold.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"run_dir": holder}) + "\n")
        os.replace(tmp, hold)
    return hold


def held_by(checkpoints_root: Path, step_name: str) -> list:
    """The run directories whose checkpoints hold `step_name` of this run (hold_checkpoint).
    A hold whose run directory was deleted holds nothing (a deleted run's checkpoints need
    no frozen weights); one whose run directory's parent is not there either still holds
    (a file system not mounted here may hold the run)."""
    holds = Path(checkpoints_root) / HOLDS / step_name
    if not holds.is_dir():
        return []
    holders = []
    for hold in holds.glob("*.json"):
        try:
            run_dir = Path(json.loads(hold.read_text())["run_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            run_dir = None  # a damaged hold: kept, as its run cannot be told
        if run_dir is None or run_dir.exists() or not run_dir.parent.exists():
            holders.append(str(run_dir or hold))
    return sorted(holders)


def held_checkpoints(checkpoints_root: Path) -> dict:
    """{step name: the run directories that hold it} of the run's checkpoints that are held
    (held_by), in step order."""
    steps = [p.name for p in (Path(checkpoints_root) / HOLDS).glob("*")
             if STEP_DIR.match(p.name) and (Path(checkpoints_root) / p.name).is_dir()]
    steps.sort(key=lambda name: int(STEP_DIR.match(name).group(1)))
    return {step: held for step in steps if (held := held_by(checkpoints_root, step))}


def is_dist_checkpoint(path: Path) -> bool:
    meta = Path(path) / "metadata.json"
    if not meta.is_file():
        return False
    try:
        return "sharded_backend" in json.loads(meta.read_text())
    except (OSError, ValueError):
        return False


def resolve_model_checkpoint(path: str) -> Tuple[Optional[str], Optional[str]]:
    """(dist_checkpointing directory to load weights from, None) or (None, what is wrong
    and how to fix it)."""
    p = Path(path).expanduser()
    if not p.exists():
        return None, (f"{path} does not exist; write it from HF weights with `audiollm convert hf-to-megatron --hf "
                      f"HF_DECODER_DIR --whisper WHISPER_DIR --out {path}`, or point at a run directory or checkpoint")
    if is_dist_checkpoint(p):
        return str(p.resolve()), None
    latest = p / "checkpoints" / "latest"
    if latest.is_file():
        step = p / "checkpoints" / latest.read_text().strip()
        if is_dist_checkpoint(step):
            return str(step.resolve()), None
        return None, f"{path} is a run directory whose checkpoints/latest names {step.name}, which is not a checkpoint"
    config = p / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except ValueError:
            model_type = None
        if model_type:
            return None, (f"{path} is a HF checkpoint (model_type {model_type!r}); convert it first: "
                          f"audiollm convert hf-to-megatron --hf {path} --out {p}_megatron "
                          f"[--whisper WHISPER_DIR], and point at the output")
    return None, (f"{path} is not a checkpoint: expected a directory written by `audiollm convert hf-to-megatron`, "
                  f"a training checkpoint (RUN/checkpoints/step_N) or a run directory")


def checkpoint_at_step(run_dir: Path, step: str) -> Path:
    """A run's checkpoint by step number, or "best": the one `audiollm eval RUN --all`
    named in RUN/eval/best.json. ValueError naming what there is otherwise."""
    run_dir = Path(run_dir)
    if step == "best":
        best = run_dir / "eval" / "best.json"
        if not best.is_file():
            raise ValueError(f"--step best: {best} does not exist; score the run's checkpoints first with "
                             f"`audiollm eval {run_dir} --all`")
        path = run_dir / "checkpoints" / json.loads(best.read_text())["checkpoint"]
        if not path.is_dir():
            raise ValueError(f"--step best: {best} names {path.name}, which is no longer kept in {path.parent}")
        return path
    kept = {int(STEP_DIR.match(p.name).group(1)): p for p in step_dirs(run_dir)}
    if not step.isdigit() or int(step) not in kept:
        raise ValueError(f"--step {step}: {run_dir} keeps checkpoints at steps "
                         f"{', '.join(str(s) for s in sorted(kept)) or '(none)'}; or pass --step best")
    return kept[int(step)]


def set_aside_dirs(run_dir: Path) -> list:
    """Checkpoints an earlier resume found damaged (checkpoints/step_N.damaged), oldest
    first by step (not by name: step_1000000 sorts before step_999999 as text)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = {p: STEP_DIR.match(p.name.removesuffix(".damaged")) for p in root.glob("step_*.damaged")}
    return sorted((p for p, m in steps.items() if m), key=lambda p: int(steps[p].group(1)))


def saved_layout(run_dir: Path) -> Tuple[Optional[str], Optional[dict]]:
    """(name, LAYOUT contents) of the run directory's latest checkpoint; (name, None)
    for one saved before layouts were recorded, (None, None) without a checkpoint."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None, None
    name = pointer.read_text().strip()
    return name, saved_layout_of(pointer.parent / name)


def layout_text(layout: Optional[dict]) -> str:
    """"TP 1 PP 2 CP 1 DP 4" of a parallel layout (LAYOUT's sizes)."""
    return " ".join(f"{k.upper()} {v}" for k, v in layout.items()) if layout else "a layout not recorded"


def saved_layout_of(path: Path) -> Optional[dict]:
    """LAYOUT of the checkpoint at `path`; None for one saved before layouts were recorded."""
    try:
        return json.loads((Path(path) / LAYOUT).read_text())
    except (OSError, ValueError):
        return None
