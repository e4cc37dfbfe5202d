"""Records -> one MDS dataset, in parallel, resumable, every bad record reported.

Chunking is fixed by the source alone: chunk k holds the records with index
k * chunk_size .. (k + 1) * chunk_size - 1, whatever the number of workers. The workers
encode a chunk's records (encode.py); this process writes them, in record order, as
one MDS directory per chunk (a part), first under a `.partial` name, renamed into place
with its chunk.json (counts, bad records, and the digest of the records it was made
from) once complete: an interrupted import leaves only whole parts behind.

Layout of OUT while importing, and when done:

    OUT/.import/params.json            what this import writes (a rerun must ask the same)
    OUT/.import/parts/000000/          one chunk's MDS shards, index.json, chunk.json
    OUT/.import/finalize.json          written once every part is there: the plan below

    OUT/index.json, OUT/shard.00000.mds ...   the dataset: every part's shards, renumbered in order
    OUT/bad_records.jsonl              one line per bad record: index, where, key, kind, reason
    OUT/import.json                    params, counts, hours, bad records per kind
    OUT/import_source.json             what the source held (a rerun after it changed says so)

Running the same command again continues: parts whose records' digest matches what the
source gives now are kept (and a finished import whose source changed since is refused,
not called done), the others (not written yet, interrupted, or made from
records that changed since: a restored audio file, an edited manifest) are written.
The final shards are a pure function of the source and the params, so they are the same
bytes however often the import was interrupted and however many workers ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from orchestrator.data.importing import FORMATS
from orchestrator.data.importing.encode import AUDIO_FORMATS, EncodeOptions, process
from orchestrator.data.importing.records import (BAD_KINDS, BadRecord, Item, ReaderOptions, Record, SourceError,
                                                 checked, fingerprint)

# Bumped when OUT's layout or the sample schema changes: a resume across versions is refused.
IMPORT_FORMAT = 1
STATE = ".import"
# One digest per chunk of the records the import read (file sizes and modification times,
# transcripts, fields): a rerun compares the source with it. Beside the dataset, not in
# import.json: a file rewritten with the same bytes changes it, and not the dataset.
SOURCE_DIGESTS = "import_source.json"
BASE_COLUMNS = {"audio": "bytes", "text": "str", "duration": "float32", "key": "str"}
# data.max_audio_seconds' default (Whisper's window): longer clips are refused by training
# unless data.long_audio=chunk, so the summary counts them.
LONG_CLIP_S = 30.0


class ImportFailed(RuntimeError):
    """The import cannot go on or cannot be completed (told why and how to fix it)."""


@dataclass(frozen=True)
class ImportParams:
    """Everything the written bytes depend on. A rerun into the same OUT must ask the same."""

    format: str
    source: str
    text_field: Optional[str] = None
    audio_field: Optional[str] = None
    keep_fields: Tuple[str, ...] = ()
    split: Optional[str] = None
    audio_root: Optional[str] = None
    sample_rate: int = 16000
    audio_format: str = "flac"
    chunk_size: int = 1000
    shard_size: str = "64mb"
    version: int = IMPORT_FORMAT

    def as_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["keep_fields"] = list(self.keep_fields)
        return d

    def reader_options(self) -> ReaderOptions:
        return ReaderOptions(text_field=self.text_field, audio_field=self.audio_field, keep_fields=self.keep_fields,
                             split=self.split, audio_root=self.audio_root)

    def columns(self) -> Dict[str, str]:
        return {**BASE_COLUMNS, **{k: "str" for k in self.keep_fields}}


@dataclass
class Report:
    """What an import (or a dry run) did: the summary written to import.json, and this run's own facts."""

    summary: Dict[str, Any]
    out: Path
    dry_run: bool = False
    chunks: int = 0
    chunks_kept: int = 0  # parts found complete and unchanged from an earlier run
    workers: int = 1
    seconds: float = 0.0
    already_done: bool = False
    examples: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)  # bad kind -> first records


def make_params(fmt: str, src: str, opts: ReaderOptions, sample_rate: int = 16000, audio_format: str = "flac",
                chunk_size: int = 1000, shard_size: str = "64mb") -> ImportParams:
    if fmt not in FORMATS:
        raise SourceError(f"unknown format {fmt!r}; one of: {', '.join(FORMATS)}")
    if audio_format not in AUDIO_FORMATS:
        raise SourceError(f"--audio-format {audio_format!r}: one of {', '.join(AUDIO_FORMATS)}")
    if chunk_size < 1 or sample_rate < 1:
        raise SourceError(f"--chunk-size ({chunk_size}) and --sample-rate ({sample_rate}) must be >= 1")
    clash = [k for k in opts.keep_fields if k in BASE_COLUMNS]
    if clash:
        raise SourceError(f"--keep-field {', '.join(clash)}: the import writes its own column of that name "
                          f"({', '.join(BASE_COLUMNS)}); keep another field")
    if len(set(opts.keep_fields)) != len(opts.keep_fields):
        raise SourceError(f"--keep-field names a field twice: {', '.join(opts.keep_fields)}")
    root = str(Path(opts.audio_root).resolve()) if opts.audio_root else None
    is_glob = any(c in src for c in "*?[")
    return ImportParams(format=fmt, source=src if is_glob else str(Path(src).resolve()),
                        text_field=opts.text_field, audio_field=opts.audio_field, keep_fields=tuple(opts.keep_fields),
                        split=opts.split, audio_root=root, sample_rate=sample_rate, audio_format=audio_format,
                        chunk_size=chunk_size, shard_size=shard_size)


def run_import(params: ImportParams, out: str | Path, workers: Optional[int] = None, max_bad_fraction: float = 0.01,
               dry_run: bool = False, progress: bool = True) -> Report:
    """Import params.source into `out` (or, with dry_run, say what would be written)."""
    start = time.perf_counter()
    out = Path(out)
    workers = max(1, workers or os.cpu_count() or 1)
    reader = importlib.import_module(f"orchestrator.data.importing.{params.format}")
    done = _completed(out, params)
    items = reader.read(params.source, params.reader_options())  # refuses an unusable source before anything is written
    text_name = reader.text_source(params.reader_options())
    if done is not None:
        _check_unchanged(out, done, _digests(items, params, text_name))
        return Report(done, out, dry_run=dry_run, already_done=True, workers=workers)
    state = out / STATE
    if not dry_run:
        _open_state(out, params)
        if (state / "finalize.json").is_file():  # interrupted while putting the parts in place
            summary = _apply_finalize(out)
            return Report(summary, out, workers=workers, seconds=time.perf_counter() - start)
    parts = _Parts(state / "parts", params, dry_run)
    enc = EncodeOptions(sample_rate=params.sample_rate, audio_format=params.audio_format, probe=dry_run)
    stats = _Totals()
    chunks = kept = 0
    digests = []
    with _Encoder(workers) as encoder, _progress(progress, params.format) as bar:
        for chunk_id, chunk, digest in _checked_chunks(items, params, text_name):
            digests.append(digest)
            meta = parts.done(chunk_id, digest)
            if meta is None:
                try:
                    meta = parts.write(chunk_id, digest, chunk, encoder, enc, bar)
                except BrokenProcessPool as err:
                    raise ImportFailed(
                        f"an encoding worker died while chunk {chunk_id} (records {chunk[0].index}-"
                        f"{chunk[-1].index}) was encoded ({err}); killed for memory? Run the same command "
                        f"again to continue" + (f" (with fewer --workers than {workers} if memory is short)"
                                                if workers > 1 else "")) from None
            else:
                kept += 1
                bar.update(len(chunk))
            stats.add(meta)
            chunks += 1
            bar.set_postfix(bad=stats.bad, refresh=False)
    summary = stats.summary(params)
    report = Report(summary, out, dry_run=dry_run, chunks=chunks, chunks_kept=kept, workers=workers,
                    examples=stats.examples)
    if summary["records"] == 0:
        raise ImportFailed(f"{params.source} holds no records ({params.format} format); nothing to import")
    problem = bad_share_problem(summary, max_bad_fraction)
    if not dry_run:
        if problem or summary["samples"] == 0:
            _write_lines(out / "bad_records.jsonl", stats.bad_lines)  # the report, to fix the source by
            raise ImportFailed(_failure(summary, problem, out))
        parts.remove_beyond(chunks)
        _plan_finalize(out, parts, chunks, summary, stats.bad_lines, digests)
        _apply_finalize(out)
    report.seconds = time.perf_counter() - start
    if dry_run:
        report.summary["would_fail"] = problem
    return report


def _checked_chunks(items: Iterator[Item], params: ImportParams, text_name: str):
    """(chunk id, its records after the shared checks, the digest of what they hold)."""
    for chunk_id, chunk in _chunks(items, params.chunk_size):
        chunk = [checked(it, params.keep_fields, text_name) if isinstance(it, Record) else it for it in chunk]
        yield chunk_id, chunk, hashlib.sha256("\n".join(fingerprint(it) for it in chunk).encode()).hexdigest()


def _digests(items: Iterator[Item], params: ImportParams, text_name: str) -> List[str]:
    return [digest for _, _, digest in _checked_chunks(items, params, text_name)]


def _check_unchanged(out: Path, done: Dict[str, Any], now: List[str]) -> None:
    """A finished import whose source changed since (an edited manifest, a replaced audio
    file, records added or removed) is not "already imported": refused, saying which records
    changed. Imports finished before digests were recorded cannot tell, and pass."""
    try:
        before = json.loads((out / SOURCE_DIGESTS).read_text())
    except (OSError, ValueError):
        before = None
    if before is None or before == now:
        return
    size = done["params"]["chunk_size"]
    changed = [i for i in range(max(len(before), len(now)))
               if i >= len(before) or i >= len(now) or before[i] != now[i]]
    ranges = ", ".join(f"{i * size}-{(i + 1) * size - 1}" for i in changed[:5]) + (", ..." if len(changed) > 5 else "")
    raise ImportFailed(f"{out} holds a finished import of {done['params']['source']} as it was then; the source has "
                       f"changed since (records {ranges}: {len(changed)} of {max(len(before), len(now))} chunks of "
                       f"{size}), so {out} is not what it holds now. Import into a new directory, or delete {out} and "
                       f"run the same command to import it again")


def bad_share_problem(summary: Dict[str, Any], max_bad_fraction: float) -> Optional[str]:
    bad, records = summary["bad"], summary["records"]
    if records and bad > max_bad_fraction * records:
        return (f"{bad} of {records} records ({100 * bad / records:.2f} %) are bad, more than --max-bad-fraction "
                f"{max_bad_fraction:g} ({100 * max_bad_fraction:g} %)")
    return None


def _failure(summary: Dict[str, Any], problem: Optional[str], out: Path) -> str:
    kinds = ", ".join(f"{n} {k}" for k, n in summary["bad_by_kind"].items())
    what = problem or f"none of the {summary['records']} records could be imported"
    return (f"{what} ({kinds}); each is listed in {out / 'bad_records.jsonl'}. The dataset was not completed. "
            f"Fix the source and run the same command again (only chunks whose records changed are written "
            f"again), or accept the bad records with a larger --max-bad-fraction")


# ---- OUT's state ---------------------------------------------------------------------


def _completed(out: Path, params: ImportParams) -> Optional[Dict[str, Any]]:
    """The summary of a finished import of the same params into `out`, else None; refuses
    a finished import of other params and a directory that is no import at all."""
    if not (out / "index.json").is_file() or (out / STATE).exists():
        return None
    try:
        summary = json.loads((out / "import.json").read_text())
    except (OSError, ValueError):
        raise ImportFailed(f"{out} holds an MDS dataset that `audiollm data import` did not write (no readable "
                           f"import.json); choose a new output directory") from None
    _same_params(out, summary.get("params", {}), params)
    return summary


def _open_state(out: Path, params: ImportParams) -> None:
    state = out / STATE
    recorded = state / "params.json"
    if recorded.is_file():
        _same_params(out, json.loads(recorded.read_text()), params)
        return
    if out.exists() and any(out.iterdir()):
        raise ImportFailed(f"{out} exists and is not an import in progress (no {recorded}); choose a new output "
                           f"directory or delete it")
    (state / "parts").mkdir(parents=True, exist_ok=True)
    _write_json(recorded, params.as_json())


def _same_params(out: Path, recorded: Dict[str, Any], params: ImportParams) -> None:
    asked = params.as_json()
    differ = [f"{k}: {recorded.get(k)!r} there, {asked[k]!r} now" for k in asked if recorded.get(k) != asked[k]]
    if differ:
        raise ImportFailed(f"{out} holds an import with other parameters ({'; '.join(differ)}); run the command "
                           f"that started it to continue it, or import into a new directory (or delete {out})")


class _Parts:
    """The chunks' part directories under OUT/.import/parts."""

    def __init__(self, root: Path, params: ImportParams, dry_run: bool):
        self.root, self.params, self.dry_run = root, params, dry_run
        if not dry_run:
            for partial in root.glob("*.partial"):  # an interrupted part: written again below
                shutil.rmtree(partial)

    def path(self, chunk_id: int) -> Path:
        return self.root / f"{chunk_id:06d}"

    def done(self, chunk_id: int, digest: str) -> Optional[Dict[str, Any]]:
        meta_file = self.path(chunk_id) / "chunk.json"
        if not meta_file.is_file():
            return None
        meta = json.loads(meta_file.read_text())
        if meta.get("digest") == digest:
            return meta
        if not self.dry_run:  # made from records that have changed since: written again
            shutil.rmtree(self.path(chunk_id))
        return None

    def write(self, chunk_id: int, digest: str, chunk: List[Item], encoder: "_Encoder", enc: EncodeOptions,
              bar) -> Dict[str, Any]:
        results = encoder.map([(it, enc) for it in chunk if isinstance(it, Record)])
        bad: List[Dict[str, Any]] = []
        seconds: List[float] = []
        tmp = self.root / f"{chunk_id:06d}.partial"
        writer = None
        if not self.dry_run:
            from streaming import MDSWriter  # imports torch: only where shards are written

            writer = MDSWriter(out=str(tmp), columns=self.params.columns(), size_limit=self.params.shard_size,
                               progress_bar=False)
        try:
            for it in chunk:
                result = it if isinstance(it, BadRecord) else next(results)
                if isinstance(result, BadRecord):
                    bad.append(result.as_dict())
                elif isinstance(result, dict):
                    writer.write(result)
                    seconds.append(result["duration"])
                else:
                    seconds.append(float(result))  # a dry run's probe
                bar.update(1)
        finally:
            if writer is not None:
                writer.finish()
        meta = {"chunk": chunk_id, "digest": digest, "records": len(chunk), "samples": len(seconds),
                "seconds": sum(seconds), "min_seconds": min(seconds, default=None),
                "max_seconds": max(seconds, default=None), "long_clips": sum(s > LONG_CLIP_S for s in seconds),
                "bad": bad}
        if not self.dry_run:
            _write_json(tmp / "chunk.json", meta)
            os.replace(tmp, self.path(chunk_id))  # the part counts as written from here on
        return meta

    def remove_beyond(self, chunks: int) -> None:
        """Parts of chunks the source no longer has (it shrank since they were written)."""
        for part in self.root.iterdir():
            if part.name.isdigit() and int(part.name) >= chunks:
                shutil.rmtree(part)


def _plan_finalize(out: Path, parts: _Parts, chunks: int, summary: Dict[str, Any],
                   bad_lines: List[Dict[str, Any]], digests: List[str]) -> None:
    """Which part shard becomes which dataset shard, and the files written beside them:
    saved before anything moves, so that an interruption here is completed by a rerun."""
    moves, shards = [], []
    for chunk_id in range(chunks):
        part = parts.path(chunk_id)
        for shard in json.loads((part / "index.json").read_text())["shards"]:
            if shard["samples"] == 0:
                continue
            name = f"shard.{len(shards):05d}.mds"
            moves.append([str((part / shard["raw_data"]["basename"]).relative_to(out)), name])
            shards.append({**shard, "raw_data": {**shard["raw_data"], "basename": name}})
    plan = {"moves": moves, "index": {"shards": shards, "version": 2}, "summary": summary, "bad": bad_lines,
            "source_digests": digests}
    _write_json(out / STATE / "finalize.json", plan)


def _apply_finalize(out: Path) -> Dict[str, Any]:
    plan = json.loads((out / STATE / "finalize.json").read_text())
    for src, dst in plan["moves"]:
        if (out / src).is_file():
            os.replace(out / src, out / dst)
        elif not (out / dst).is_file():
            raise ImportFailed(f"shard {out / src} is gone and {out / dst} is not there either; delete {out} and "
                               f"import again")
    _write_lines(out / "bad_records.jsonl", plan["bad"])
    _write_json(out / "import.json", plan["summary"])
    _write_json(out / SOURCE_DIGESTS, plan.get("source_digests"))
    _write_json(out / "index.json", plan["index"])  # last: its presence marks the dataset complete
    shutil.rmtree(out / STATE)
    return plan["summary"]


# ---- the pipeline --------------------------------------------------------------------


def _chunks(items: Iterator[Item], chunk_size: int) -> Iterator[Tuple[int, List[Item]]]:
    """Consecutive records by index; a chunk is handed on as soon as its last record is read."""
    chunk: List[Item] = []
    chunk_id = 0
    for it in items:
        if it.index != chunk_id * chunk_size + len(chunk):
            raise AssertionError(f"reader gave record {it.index} where {chunk_id * chunk_size + len(chunk)} was due")
        chunk.append(it)
        if len(chunk) == chunk_size:
            yield chunk_id, chunk
            chunk, chunk_id = [], chunk_id + 1
    if chunk:
        yield chunk_id, chunk


class _Encoder:
    """encode.process over the workers, results in order: a spawn process pool started at
    the first chunk to write, with one worker too. The resampler's matrix products round
    differently with another number of BLAS threads (OpenBLAS splits the sums otherwise:
    seen here as other FLAC bytes), so every clip is encoded in a worker that starts with
    one BLAS thread, never in this process, whose BLAS threads are set already. A
    ProcessPoolExecutor, not a multiprocessing.Pool: a worker that dies (killed for memory)
    fails the import instead of leaving it waiting for the lost clip forever."""

    _BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

    def __init__(self, workers: int):
        self.workers, self.executor = workers, None
        self._saved_env: Dict[str, Optional[str]] = {}

    def __enter__(self) -> "_Encoder":
        return self

    def __exit__(self, *exc) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def map(self, tasks: List[Tuple[Record, EncodeOptions]]) -> Iterator[Any]:
        if self.executor is None:
            from concurrent.futures import ProcessPoolExecutor

            # The executor starts its workers as tasks arrive: the environment they inherit
            # (one BLAS thread each; the pool is the parallelism) stays set until it is shut down.
            self._saved_env = {k: os.environ.get(k) for k in self._BLAS_ENV}
            os.environ.update({k: "1" for k in self._BLAS_ENV})
            # spawn: no fork of a process that may hold threads (tqdm's, mosaic's).
            self.executor = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"))
        return self.executor.map(process, tasks, chunksize=max(1, min(8, len(tasks) // (4 * self.workers))))


@contextlib.contextmanager
def _progress(enabled: bool, fmt: str):
    from tqdm import tqdm

    bar = tqdm(disable=not enabled, unit="rec", desc=f"import {fmt}", smoothing=0.1)
    try:
        yield bar
    finally:
        bar.close()


class _Totals:
    """Counts over the chunks, in chunk order (the same sums whichever chunks ran now)."""

    EXAMPLES = 3  # bad records shown per kind

    def __init__(self):
        self.records = self.samples = self.bad = self.long_clips = 0
        self.seconds = 0.0
        self.min_s: Optional[float] = None
        self.max_s: Optional[float] = None
        self.by_kind: Dict[str, int] = {}
        self.examples: Dict[str, List[Dict[str, Any]]] = {}
        self.bad_lines: List[Dict[str, Any]] = []

    def add(self, meta: Dict[str, Any]) -> None:
        self.records += meta["records"]
        self.samples += meta["samples"]
        self.seconds += meta["seconds"]
        self.long_clips += meta["long_clips"]
        for s, pick in ((meta["min_seconds"], min), (meta["max_seconds"], max)):
            if s is not None:
                attr = "min_s" if pick is min else "max_s"
                setattr(self, attr, s if getattr(self, attr) is None else pick(getattr(self, attr), s))
        for b in meta["bad"]:
            self.bad += 1
            self.by_kind[b["kind"]] = self.by_kind.get(b["kind"], 0) + 1
            shown = self.examples.setdefault(b["kind"], [])
            if len(shown) < self.EXAMPLES:
                shown.append(b)
            self.bad_lines.append(b)

    def summary(self, params: ImportParams) -> Dict[str, Any]:
        return {"params": params.as_json(), "columns": params.columns(), "records": self.records,
                "samples": self.samples, "bad": self.bad,
                "bad_by_kind": {k: self.by_kind[k] for k in BAD_KINDS if k in self.by_kind},
                "audio_seconds": round(self.seconds, 3), "audio_hours": round(self.seconds / 3600, 4),
                "min_seconds": None if self.min_s is None else round(self.min_s, 3),
                "max_seconds": None if self.max_s is None else round(self.max_s, 3),
                "clips_over_%gs" % LONG_CLIP_S: self.long_clips}


def describe(report: Report, name: str = "NAME") -> str:
    """The import's outcome for the console."""
    s = report.summary
    p = s["params"]
    lines = [f"{p['format']} {p['source']} -> {report.out}" + (" (dry run: nothing written)" if report.dry_run else "")]
    if report.already_done:
        lines.append("  already imported: nothing to do (delete the directory to import again)")
    span = (f", clips {s['min_seconds']:.2f}-{s['max_seconds']:.2f} s" if s["min_seconds"] is not None else "")
    lines.append(f"  {s['records']} records: {s['samples']} samples ({s['audio_hours']:.3f} h of audio{span}), "
                 f"{s['bad']} bad ({100 * s['bad'] / max(s['records'], 1):.2f} %)")
    for kind, count in s["bad_by_kind"].items():
        lines.append(f"    {kind:<18} {count:>6}  ({BAD_KINDS[kind]})")
        for ex in report.examples.get(kind, []):
            lines.append(f"      {ex['where']}: {ex['reason']}")
    long_key = "clips_over_%gs" % LONG_CLIP_S
    if s.get(long_key):
        lines.append(f"  {s[long_key]} clips are longer than {LONG_CLIP_S:g} s: training refuses them unless "
                     f"data.max_audio_seconds is raised or data.long_audio=chunk")
    if s["bad"] and not report.dry_run:
        lines.append(f"  every bad record: {report.out / 'bad_records.jsonl'}")
    if report.dry_run and not report.already_done:
        lines.append(f"  would write {report.chunks} chunks of up to {p['chunk_size']} records"
                     + (f" ({report.chunks_kept} already written)" if report.chunks_kept else "")
                     + f"; columns: {', '.join(f'{k} ({v})' for k, v in s['columns'].items())}")
        lines.append("  (audio headers only were read: a file that cannot be decoded shows up in the import itself)")
        if s.get("would_fail"):
            lines.append(f"  the import would fail: {s['would_fail']}")
    elif not report.already_done:
        lines.append(f"  {report.chunks} chunks in {report.seconds:.1f} s with {report.workers} workers"
                     + (f" ({report.chunks_kept} kept from an earlier run)" if report.chunks_kept else ""))
    if not report.dry_run:
        lines.append(f"  in a data config: - {{name: {name}, path: {report.out.resolve()}}}")
    return "\n".join(lines)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _write_lines(path: Path, rows: List[Dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    os.replace(tmp, path)
