"""Production-sized dataset lists: 720 training and 85 validation MDS datasets in one run.

The datasets are tiny (the mixture machinery is what is under test, not decoding):
the training ones are copies of one 50-sample text-only dataset (two shards each),
except the last, written on its own with texts no other dataset has; each
validation dataset is written with its own transcripts (2-5 samples, audio shared).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.data import loader as loader_mod
from orchestrator.data import sources
from orchestrator.data.audio import encode_flac
from orchestrator.plan.schema.data import DatasetEntry

from .conftest import data_config, tone, write_mds

NUM_TRAIN = 720
NUM_VALIDATION = 85
# Samples per training dataset. Mosaic's proportions are exact up to one sample per
# dataset per epoch (see test_mixture_proportions_follow_the_weights); with s samples
# per dataset the epoch holds E = 720 * s samples and that rounding moves at most
# 720 / E = 1 / s of the mixture, so s = 50 bounds it by 2% for any weights.
TRAIN_SAMPLES = 50
TRAIN_COLUMNS = {"text": "str"}
SHARD_BYTES = 600  # two shards per training dataset: the locator has to cross shard boundaries


def _train_texts(tag: str):
    return [f"{tag} sample {j}" for j in range(TRAIN_SAMPLES)]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    template = write_mds(root / "template", [{"text": t} for t in _train_texts("copy")], TRAIN_COLUMNS, SHARD_BYTES)
    assert len(list(template.glob("shard.*.mds"))) >= 2
    train_dir = root / "train"
    for i in range(NUM_TRAIN - 1):
        shutil.copytree(template, train_dir / f"t{i:03d}")
    last = f"t{NUM_TRAIN - 1:03d}"
    write_mds(train_dir / last, [{"text": t} for t in _train_texts(last)], TRAIN_COLUMNS, SHARD_BYTES)
    # Weights drawn once from a fixed generator over 1..10 (production weights span about that).
    weights = np.random.default_rng(20240611).uniform(1.0, 10.0, NUM_TRAIN)
    train = [DatasetEntry(name=f"t{i:03d}", path=str(train_dir / f"t{i:03d}"), weight=float(w))
             for i, w in enumerate(weights)]

    clips = [encode_flac(tone(0.1 + 0.02 * j, freq=300 + 50 * j, seed=j), 16000) for j in range(5)]
    validation, val_texts = [], []
    for k in range(NUM_VALIDATION):
        texts = [f"v{k:02d} {j} the cat sees" for j in range(2 + k % 4)]
        write_mds(root / "val" / f"v{k:02d}", [{"audio": clips[j], "text": t} for j, t in enumerate(texts)])
        validation.append(DatasetEntry(name=f"v{k:02d}", path=str(root / "val" / f"v{k:02d}")))
        val_texts.append(texts)
    return SimpleNamespace(root=root, train=train, weights=weights, validation=validation, val_texts=val_texts)


@pytest.fixture(scope="module")
def train_mixture(many):
    datasets = sources.resolve_entries(many.train)
    mixture = sources.open_mixture(datasets, seed=17, shuffle=True,
                                   cache_root=sources.process_cache_root(str(many.root / "cache")))
    return datasets, mixture


# Run in a fresh interpreter: opens a 1-dataset mixture (one-off lazy files), then the
# mixture under test, and reports the file descriptors and the shared-memory segments
# (created, not merely attached) of the second open. Segment creation is recorded by
# wrapping the stdlib SharedMemory class that mosaic's own wrapper instantiates.
_FD_PROBE = r"""
import json, os, sys
from types import SimpleNamespace
import streaming.base.shared.memory as mosaic_memory
from orchestrator.data import sources

created = []

class Recording(mosaic_memory.BuiltinSharedMemory):
    def __init__(self, name=None, create=False, size=0):
        super().__init__(name, create, size)
        if create:
            created.append(self.name.lstrip("/"))

mosaic_memory.BuiltinSharedMemory = Recording

def fds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the descriptor listdir itself used
            pass
    return out

spec = json.loads(open(sys.argv[1]).read())
def open_(entries):
    datasets = sources.resolve_entries([SimpleNamespace(**e) for e in entries])
    return sources.open_mixture(datasets, seed=0, shuffle=True, cache_root=sources.process_cache_root(spec["cache"]))
warm = open_(spec["entries"][:1])
before = fds()
created.clear()
mixture = open_(spec["entries"])
after = fds()
print(json.dumps({"before": before, "after": after, "created": created, "prefix": int(mixture._shm_prefix_int)}))
"""


def _fd_probes(tmp: Path, root: Path, entry_lists):
    """Runs one probe per entry list, one after the other (two probes registering mosaic
    shared memory at the same moment can race for a prefix, and the loser's retry would
    create segments under two prefixes), returns their reports."""
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    reports = []
    for n, entries in enumerate(entry_lists):
        spec = tmp / f"fd_probe{n}.json"
        spec.write_text(json.dumps({"entries": [{"name": e.name, "path": e.path, "weight": e.weight} for e in entries],
                                    "cache": str(root / "cache")}))
        proc = subprocess.run([sys.executable, "-c", _FD_PROBE, str(spec)], capture_output=True, text=True, env=env,
                              cwd=repo, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return reports


def _undeleted(targets):
    return [t[:-len(" (deleted)")] if t.endswith(" (deleted)") else t for t in targets]


def _classify_added(report, data_root: Path):
    """The descriptors an open added: on the shared-memory segments it created ('own'), on
    segments of other mosaic datasets alive on this machine ('attached': mosaic's prefix
    scan opens each registered prefix's segments and keeps the handles until exit), on
    files of the datasets, anything else."""
    # A segment some other process unlinked while it was open reads "<path> (deleted)".
    added = Counter(_undeleted(report["after"])) - Counter(_undeleted(report["before"]))
    created = {f"/dev/shm/{name}" for name in report["created"]}
    own, attached, data, other = Counter(), Counter(), Counter(), Counter()
    for target, count in added.items():
        if target in created:
            own[target.rsplit("/", 1)[-1]] += count
        elif target.startswith("/dev/shm/"):
            attached[target.rsplit("/", 1)[-1].split("_", 1)[0]] += count
        elif target.startswith(str(data_root)):
            data[target] += count
        else:
            other[target] += count
    return own, attached, data, other


def test_open_file_descriptors_do_not_grow_with_the_dataset_count(many, tmp_path):
    from streaming.base.constant import SHM_TO_CLEAN

    small, large = _fd_probes(tmp_path, many.root, [many.train[:20], many.train])
    for report in (small, large):
        # One registration for the whole mixture: every segment the open created carries
        # the mixture's one prefix (a StreamingDataset per dataset would create a prefix each).
        assert {name.split("_", 1)[0] for name in report["created"]} == {f"{report['prefix']:06d}"}, report["created"]
    assert sorted(n.split("_", 1)[1] for n in small["created"]) == sorted(n.split("_", 1)[1] for n in large["created"])
    own20, attached20, data20, other20 = _classify_added(small, many.root)
    own720, attached720, data720, other720 = _classify_added(large, many.root)
    # What mosaic holds open per StreamingDataset (not per stream): its shared-memory
    # segments (at most streaming's SHM_TO_CLEAN names), each twice (the shm_open
    # descriptor and its mmap). No shard or index file, lock or pipe stays open.
    assert sum(own720.values()) == sum(own20.values()) <= 2 * len(SHM_TO_CLEAN), (own20, own720)
    assert not data20 and not data720, (data20, data720)
    assert not other20 and not other720, (other20, other720)
    # Not counted: the prefix scan's handles on the segments of other live mosaic datasets
    # (the probe's warm-up mixture, concurrent test processes; a few per other dataset,
    # more when open_mixture retries after a registration race). They depend on what else
    # runs on the machine, not on the datasets listed.
    assert f"{small['prefix']:06d}" not in attached20 and f"{large['prefix']:06d}" not in attached720
    # So the growth, less those attached handles, is the same for 720 datasets as for 20.
    growth20 = sum(own20.values()) + sum(data20.values()) + sum(other20.values())
    growth720 = sum(own720.values()) + sum(data720.values()) + sum(other720.values())
    assert growth720 - growth20 == 0, (growth20, growth720)


def test_mixture_proportions_follow_the_weights(many, train_mixture):
    """Proportions over whole epochs of the training order, against the normalised weights.

    How mosaic mixes (streaming Stream.apply_weights, StreamingDataset.resample_streams):
    the epoch has E = sum of the datasets' sizes samples (open_mixture sets no epoch
    size); dataset i gets choose_i = floor(E p_i) samples plus one for S = E - sum floor(E p_i)
    datasets picked once with the seed, S = sum frac(E p_i) < N. choose_i is fixed when the
    mixture is opened, and every epoch holds exactly choose_i samples of dataset i (which
    ones, and in which order, changes per epoch). So, with c_i dataset i's count over K
    whole epochs and q_i = c_i / (K E):
      per dataset  |c_i / K - E p_i| < 1, i.e. |q_i - p_i| < 1/E,
      as a whole   TV(q, p) = 1/2 sum |q_i - p_i| = (1/E) sum over the S bumped datasets
                   of (1 - frac(E p_i)) <= S / E < N / E.
    "Within 2%" is that total-variation bound: at most 2% of the samples would have to move
    to another dataset to match the weights exactly. With N = 720 and 50 samples each,
    N / E = 1/50 = 2%, whatever the weights.

    Why not per-dataset relative errors, or a 10k-sample prefix: with 720 datasets each
    has ~14 of 10k samples, so integer
    rounding alone moves a dataset's share by several percent of itself (the lightest ones
    get ~2.5 of 10k samples), and a prefix of a shuffled epoch adds sampling noise of order
    sqrt(14)/14 per dataset (a total variation of ~10% at 10k samples) that no 2% test
    could pass for every seed. Whole epochs are
    deterministic; the check uses as many as reach 10k samples (at least two, to see the
    composition repeat).
    """
    datasets, mixture = train_mixture
    n, e = len(datasets), int(mixture.epoch_size)
    assert n == NUM_TRAIN and e == NUM_TRAIN * TRAIN_SAMPLES
    p = many.weights / many.weights.sum()
    locator = sources.SampleLocator(mixture, datasets)
    order = sources.RankOrder(mixture, dp_rank=0, dp_size=1)
    assert order.per_epoch == e  # one rank reads the whole epoch, unpadded
    epochs = max(2, math.ceil(10_000 / e))
    per_epoch = np.stack([np.bincount(locator.streams(order.epoch_ids(k)), minlength=n) for k in range(epochs)])
    assert (per_epoch == per_epoch[0]).all(), "the per-dataset counts differ between epochs"
    counts = per_epoch.sum(axis=0)
    q = counts / counts.sum()

    deviation = np.abs(counts / epochs - e * p)  # samples per epoch
    assert deviation.max() < 1.0, f"dataset {int(deviation.argmax())}: {deviation.max():.3f} samples per epoch off"
    assert np.abs(q - p).max() < 1.0 / e
    tv = 0.5 * float(np.abs(q - p).sum())
    bumped = int(round(e - np.floor(e * p).sum()))  # S
    assert tv <= bumped / e + 1e-12 and bumped < n
    assert tv < n / e <= 0.02, f"total variation {tv:.4f}"
    # Every dataset is in the mixture (the smallest weight still gives E p_i > 1).
    assert counts.min() > 0

    # The same epoch dealt to 8 data-parallel ranks (one canonical node each): every rank
    # gets its own span, and together they read the epoch's multiset above plus mosaic's
    # padding (repeats so that all ranks get the same count).
    mixture8 = sources.open_mixture(datasets, seed=17, shuffle=True,
                                    cache_root=sources.process_cache_root(str(many.root / "cache")),
                                    canonical_nodes=8)
    ranks = [sources.RankOrder(mixture8, r, 8) for r in range(8)]
    together = sum(np.bincount(locator.streams(o.epoch_ids(0)), minlength=n) for o in ranks)
    padding = 8 * ranks[0].per_epoch - e
    assert all(o.per_epoch == ranks[0].per_epoch for o in ranks)
    assert 0 <= padding < 8
    assert (together >= per_epoch[0]).all() and int((together - per_epoch[0]).sum()) == padding


def test_locator_names_the_last_dataset_and_index(many, train_mixture):
    datasets, mixture = train_mixture
    locator = sources.SampleLocator(mixture, datasets)
    last = NUM_TRAIN - 1
    first_id = int(mixture.epoch_size) - TRAIN_SAMPLES  # epoch size = total samples; the last stream is at the end
    ids = np.arange(first_id, first_id + TRAIN_SAMPLES)
    assert (locator.streams(ids) == last).all()
    assert locator.streams([first_id - 1])[0] == last - 1
    shards = set()
    expected = _train_texts(f"t{last:03d}")  # no other dataset has these texts
    for j, sample_id in enumerate(ids.tolist()):
        where = locator(sample_id)
        assert where["dataset"] == f"t{last:03d}" and where["stream_id"] == last and where["index"] == j, where
        assert Path(where["shard"]).parent == Path(many.train[last].path)
        assert Path(where["shard"]).is_file()
        shards.add(where["shard"])
        assert mixture[sample_id]["text"] == expected[j]
    assert len(shards) >= 2  # the index runs on across the dataset's shard boundary
    # The last dataset's samples in the training order are its own, each located the same way.
    order = sources.RankOrder(mixture, 0, 1)
    epoch = order.epoch_ids(0)
    drawn = epoch[locator.streams(epoch) == last].tolist()
    assert drawn and all(mixture[i]["text"] == expected[locator(i)["index"]] for i in drawn)


def test_validation_suite_opens_once_and_each_set_owns_its_samples(many, monkeypatch, tokenizer_dir, encoder_cfg,
                                                                   adapter_cfg):
    opened = []
    real_open = sources.open_mixture

    def counting_open(*args, **kwargs):
        opened.append(len(args[0]))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(sources, "open_mixture", counting_open)
    cfg = data_config(validation=many.validation, tokenizer=str(tokenizer_dir))
    sets = loader_mod.build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2)
    names = [e.name for e in many.validation]
    assert list(sets) == names
    suites = {id(s.suite) for s in sets.values()}
    assert len(suites) == 1
    suite = next(iter(sets.values())).suite
    assert opened == []  # nothing is opened before the first evaluation

    covered = []
    for k, name in enumerate(names):
        ids = suite.sample_ids(k)
        texts = many.val_texts[k]
        assert len(ids) == len(texts), name
        assert [suite.mixture[i]["text"] for i in ids] == texts, name
        covered.extend(ids)
    # The sets partition the suite's samples: each id belongs to exactly one dataset.
    assert sorted(covered) == list(range(sum(len(t) for t in many.val_texts)))

    # Evaluating a set end to end reads exactly its transcripts, in order, from the same mixture.
    for name in (names[0], names[-1], names[0]):
        transcripts = [t for batch in sets[name] for t in batch["transcripts"]]
        assert transcripts == many.val_texts[names.index(name)]
    assert opened == [NUM_VALIDATION]  # one open for the 85 sets, kept across evaluations
