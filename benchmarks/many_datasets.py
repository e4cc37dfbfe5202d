"""Cost of a production-sized dataset list: 720 training and 85 validation MDS datasets.

    PYTHONPATH=. .venv/bin/python benchmarks/many_datasets.py [--train 720] [--validation 85]
        [--samples 50] [--shard-bytes 600] [--dir DIR]

Writes tiny local MDS datasets under DIR (a temp directory by default; removed after):
the training ones are copies of one --samples-sample text dataset (weights drawn
from a fixed generator over 1..10), the validation ones copies of a 4-sample one.
Then, in this process:
  open          sources.open_mixture over the training datasets (one canonical node) and
                loader.ValidationSuite over the validation ones: wall time, open file
                descriptors and resident memory (VmRSS) before and after. Descriptors are
                split into those on the shared memory the open created and those mosaic's
                prefix scan attached to (other mosaic datasets alive on the machine).
  order         sources.RankOrder at dp 1, 8 and 64 (a mixture opened with that many
                canonical nodes): open time, then one epoch's ids for rank 0 (first
                epoch and a later one; mosaic partitions the whole epoch for all ranks).
  locator       sources.SampleLocator: build time; per sample, the vectorised streams()
                over an epoch and one __call__ (dataset, shard, index) at a time.
  proportions   realised shares of one whole epoch at dp 1 (and of the union of the 8
                ranks' epochs at dp 8), and of the first 10k positions, against the
                normalised weights: largest absolute share difference, total variation.
Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def _fds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
        out.append(target[:-len(" (deleted)")] if target.endswith(" (deleted)") else target)
    return out


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _opened(fn, prefix_of):
    """Runs an open; returns (result, seconds, own fds, attached fds, other fds, RSS before, after)."""
    gc.collect()
    before, rss0 = Counter(_fds()), _rss_mib()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    rss1 = _rss_mib()
    added = Counter(_fds()) - before
    own_prefix = f"/dev/shm/{prefix_of(result):06d}_"
    own = sum(c for t, c in added.items() if t.startswith(own_prefix))
    attached = sum(c for t, c in added.items() if t.startswith("/dev/shm/") and not t.startswith(own_prefix))
    other = sum(added.values()) - own - attached
    return result, seconds, own, attached, other, rss0, rss1


def _write_datasets(root: Path, args):
    from streaming import MDSWriter

    def write(path: Path, texts):
        with MDSWriter(out=str(path), columns={"audio": "bytes", "text": "str"}, size_limit=args.shard_bytes,
                       progress_bar=False) as w:
            for j, text in enumerate(texts):
                w.write({"audio": bytes(16), "text": text})

    write(root / "train_template", [f"sample {j}" for j in range(args.samples)])
    write(root / "val_template", [f"val {j}" for j in range(4)])
    for i in range(args.train):
        shutil.copytree(root / "train_template", root / "train" / f"t{i:04d}")
    for k in range(args.validation):
        shutil.copytree(root / "val_template", root / "val" / f"v{k:03d}")
    weights = np.random.default_rng(0).uniform(1.0, 10.0, args.train)
    train = [SimpleNamespace(name=f"t{i:04d}", path=str(root / "train" / f"t{i:04d}"), weight=float(w))
             for i, w in enumerate(weights)]
    validation = [SimpleNamespace(name=f"v{k:03d}", path=str(root / "val" / f"v{k:03d}"), weight=1.0)
                  for k in range(args.validation)]
    return train, validation, weights


def _shares(locator, ids, n):
    counts = np.bincount(locator.streams(ids), minlength=n)
    return counts / counts.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=720)
    parser.add_argument("--validation", type=int, default=85)
    parser.add_argument("--samples", type=int, default=50, help="samples per training dataset")
    parser.add_argument("--shard-bytes", type=int, default=600, help="MDS shard size limit")
    parser.add_argument("--dir", default=None, help="where to write the datasets (default: a temp dir, removed)")
    args = parser.parse_args()

    from orchestrator.data import sources
    from omegaconf import OmegaConf

    from orchestrator.data.loader import ValidationSuite
    from orchestrator.plan.schema.data import DataConfig

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="many_datasets_"))
    rows = []

    def row(name, value, note=""):
        rows.append((name, value, note))

    try:
        start = time.perf_counter()
        train_entries, val_entries, weights = _write_datasets(root, args)
        row("datasets written", f"{args.train} train + {args.validation} val", f"{time.perf_counter() - start:.1f} s")
        cache = sources.process_cache_root(str(root / "cache"))
        datasets = sources.resolve_entries(train_entries)
        val_datasets = sources.resolve_entries(val_entries)

        # Warm-up: imports and mosaic's one-off lazy files are not charged to the rows below.
        sources.open_mixture(datasets[:1], seed=0, shuffle=True, cache_root=cache)

        mixture, secs, own, attached, other, rss0, rss1 = _opened(
            lambda: sources.open_mixture(datasets, seed=0, shuffle=True, cache_root=cache),
            lambda m: m._shm_prefix_int)
        n, epoch = len(datasets), int(mixture.epoch_size)
        row("train open (dp 1)", f"{secs * 1e3:.0f} ms", f"{n} datasets, {len(mixture.shards)} shards, "
            f"epoch {epoch} samples")
        row("train open: fds added", f"{own + other}", f"{own} on its own shared memory, {other} other; "
            f"+{attached} attached to other live mosaic datasets")
        row("train open: RSS", f"{rss0:.0f} -> {rss1:.0f} MiB", f"+{rss1 - rss0:.1f} MiB")

        suite = ValidationSuite(val_datasets, OmegaConf.structured(DataConfig(cache_dir=str(root / "cache"))))
        _, secs, own, attached, other, rss0, rss1 = _opened(lambda: suite.mixture, lambda m: m._shm_prefix_int)
        row("validation open", f"{secs * 1e3:.0f} ms", f"{len(val_datasets)} datasets, {len(suite.mixture.shards)} "
            f"shards")
        row("validation open: fds added", f"{own + other}", f"{own} on its own shared memory, {other} other; "
            f"+{attached} attached to other live mosaic datasets")
        row("validation open: RSS", f"{rss0:.0f} -> {rss1:.0f} MiB", f"+{rss1 - rss0:.1f} MiB")
        row("process now", f"{len(_fds())} fds, {_rss_mib():.0f} MiB RSS", "")

        start = time.perf_counter()
        locator = sources.SampleLocator(mixture, datasets)
        row("SampleLocator build", f"{(time.perf_counter() - start) * 1e3:.1f} ms", "")

        p = weights / weights.sum()
        for dp in (1, 8, 64):
            start = time.perf_counter()
            m = mixture if dp == 1 else sources.open_mixture(datasets, seed=0, shuffle=True, cache_root=cache,
                                                             canonical_nodes=dp)
            open_s = time.perf_counter() - start
            start = time.perf_counter()
            order = sources.RankOrder(m, 0, dp)  # computes epoch 0
            first = time.perf_counter() - start
            start = time.perf_counter()
            order.epoch_ids(1)
            later = time.perf_counter() - start
            row(f"RankOrder dp {dp}: one epoch", f"{first * 1e3:.0f} ms / {later * 1e3:.0f} ms",
                f"epoch 0 / epoch 1, rank 0 reads {order.per_epoch} per epoch"
                + (f"; mixture open {open_s * 1e3:.0f} ms" if dp > 1 else ""))
            if dp == 1:
                ids = order.epoch_ids(0)
                start = time.perf_counter()
                locator.streams(ids)
                vec = (time.perf_counter() - start) / len(ids)
                probe = ids[:min(len(ids), 20000)]
                start = time.perf_counter()
                for sample_id in probe.tolist():
                    locator(sample_id)
                one = (time.perf_counter() - start) / len(probe)
                row("SampleLocator per sample", f"{vec * 1e9:.0f} ns / {one * 1e6:.1f} us",
                    f"streams() over an epoch / __call__ one at a time ({len(probe)} calls)")
                q = _shares(locator, ids, n)
                row("proportions, 1 epoch (dp 1)",
                    f"max |q-p| {np.abs(q - p).max():.2e}, TV {0.5 * np.abs(q - p).sum():.4f}",
                    f"{len(ids)} samples; bound: max < 1/E = {1 / epoch:.2e}, TV < N/E = {n / epoch:.4f}")
                positions = np.array([order.sample_id(k) for k in range(10_000)])
                q = _shares(locator, positions, n)
                row("proportions, first 10k positions", f"max |q-p| {np.abs(q - p).max():.2e}, "
                    f"TV {0.5 * np.abs(q - p).sum():.4f}", "a prefix of shuffled epochs: sampling noise")
            if dp == 8:
                together = np.concatenate([sources.RankOrder(m, r, dp).epoch_ids(0) for r in range(dp)])
                q = _shares(locator, together, n)
                row("proportions, 1 epoch (8 ranks together)", f"max |q-p| {np.abs(q - p).max():.2e}, "
                    f"TV {0.5 * np.abs(q - p).sum():.4f}", f"{len(together)} samples (with mosaic's padding)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)

    width = [max(len(str(r[i])) for r in rows + [("quantity", "value", "note")]) for i in range(3)]
    print(f"{'quantity':<{width[0]}}  {'value':<{width[1]}}  note")
    print(f"{'-' * width[0]}  {'-' * width[1]}  {'-' * width[2]}")
    for name, value, note in rows:
        print(f"{name:<{width[0]}}  {value:<{width[1]}}  {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
