"""The training and validation loaders over real MDS datasets (mosaic streaming)."""

import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from orchestrator.data.loader import (BadSampleError, BadSamples, RankLoader, bad_share_problem, build_train_loader,
                                      build_validation_loaders, merge_rank_states)
from orchestrator.data.sources import resolve_entries
from orchestrator.plan.schema.data import DatasetEntry

from .conftest import data_config, tone_samples, write_mds


@pytest.fixture(scope="module")
def three_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mds")
    for i, (name, n) in enumerate((("alpha", 40), ("beta", 30), ("gamma", 20))):
        write_mds(root / name, tone_samples(n, seed=i, tag=name[0] * 1))
    return root


def _entries(root, weights=(1.0, 1.0, 2.0)):
    return [DatasetEntry(name=n, path=str(root / n), weight=w) for n, w in zip(("alpha", "beta", "gamma"), weights)]


def _signature(batch):
    return (batch["tokens"].clone(), batch["sample_datasets"], batch["audio_features"].sum().item())


def test_mixture_names_and_proportions(three_datasets, tokenizer_dir, encoder_cfg, adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir))
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=3)
    seen = Counter()
    for _ in range(12):
        batch = next(loader)
        seen.update(batch["sample_datasets"])
        # Per-token dataset index agrees with the per-sample names.
        ids = batch["dataset_index"][batch["dataset_index"] >= 0].unique().tolist()
        assert {batch["dataset_names"][i] for i in ids} == set(batch["sample_datasets"])
        assert batch["audio_features"].shape[0] == batch["audio_num_tokens"].numel() == batch["num_samples"]
        assert int((batch["tokens"] == batch["audio_token_id"]).sum()) == int(batch["audio_num_tokens"].sum())
    # gamma has weight 2 of 4: about half the samples although it is the smallest dataset.
    total = sum(seen.values())
    assert 0.38 < seen["gamma"] / total < 0.62, seen
    assert seen["alpha"] > 0 and seen["beta"] > 0


def test_same_seed_same_batches_and_resume_mid_stream_and_across_epochs(three_datasets, tokenizer_dir, encoder_cfg,
                                                                         adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir))
    a = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=5)
    b = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=5)
    states, batches = [], []
    for _ in range(40):  # ~ 2+ epochs of the 90-sample mixture
        states.append(a.state_dict())
        batches.append(_signature(next(a)))
    for i in range(3):
        first = _signature(next(b))
        assert torch.equal(first[0], batches[i][0]) and first[1] == batches[i][1]
    assert a.state_dict()["next_position"] > 2 * a.epoch_size  # we did cross epoch boundaries
    for k in (7, 19, 33):
        resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=5)
        resumed.load_state_dict(states[k])
        for j in range(k, min(k + 4, 40)):
            got = _signature(next(resumed))
            assert torch.equal(got[0], batches[j][0]) and got[1] == batches[j][1], (k, j)
            assert got[2] == pytest.approx(batches[j][2])
    other = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=6)
    assert not torch.equal(_signature(next(other))[0], batches[0][0])
    with pytest.raises(ValueError, match="seed: saved 5, now 6"):
        other.load_state_dict(states[3])


def test_feature_cache_gives_the_same_batches(three_datasets, tokenizer_dir, encoder_cfg, adapter_cfg):
    plain = build_train_loader(data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir)),
                               encoder_cfg, adapter_cfg, micro_batch_size=2, seed=4)
    cached = build_train_loader(data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir),
                                            feature_cache_mb=64), encoder_cfg, adapter_cfg, micro_batch_size=2, seed=4)
    for _ in range(30):  # more than two epochs: later ones come from the cache
        a, b = next(plain), next(cached)
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["audio_features"], b["audio_features"])
        assert torch.equal(a["audio_lengths"], b["audio_lengths"])
    # Weighted sampling repeats gamma and skips some of alpha and beta: most samples were seen.
    assert 50 < len(cached.cache.items) <= 90 and 0 < cached.cache.used <= 64 << 20


def test_features_on_device_sends_the_waveforms_of_the_same_batches(three_datasets, tokenizer_dir, encoder_cfg,
                                                                     adapter_cfg):
    """data.features_on=device, through workers and the feature cache (which then keeps the
    clips): the same micro-batches, carrying the waveforms instead of the log-mel, from which
    the step makes the features the host loader computes; resumes exactly."""
    from orchestrator.data import mel

    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing_buffer=8)
    host = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=4)
    cfg.features_on, cfg.num_workers, cfg.feature_cache_mb = "device", 1, 64
    device = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=4)
    states, batches = [], []
    for _ in range(30):  # past two epochs: the later ones from the cache
        states.append(device.state_dict())
        a, b = next(host), next(device)
        assert "audio_features" not in b and torch.equal(a["tokens"], b["tokens"])
        assert torch.equal(a["audio_lengths"], b["audio_lengths"])
        waves = b["audio_waveforms"]
        assert waves.dtype == torch.float32 and waves.shape[0] == a["audio_features"].shape[0]
        assert waves.shape[1] == max(len(c) for c in _batch_clips(b))  # padded to the longest clip only
        assert (mel.batch_features(b, "cpu") - a["audio_features"]).abs().max() <= 1e-6
        batches.append(b)
    assert device.cache.items and all(ex.features is None and ex.clips for ex in device.cache.items.values())
    device.close()
    cfg.num_workers, cfg.feature_cache_mb = 0, 0
    resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=4)
    resumed.load_state_dict(states[17])
    for j in range(17, 22):
        got = next(resumed)
        assert torch.equal(got["tokens"], batches[j]["tokens"])
        assert torch.equal(got["audio_waveforms"], batches[j]["audio_waveforms"])


def _batch_clips(batch):
    """The clips' true lengths in samples, from their waveforms' last non-zero sample."""
    waves = batch["audio_waveforms"]
    return [waves[i, :int(torch.nonzero(waves[i]).max()) + 1] for i in range(waves.shape[0])]


def record_reads(loader, path):
    """Append the id of every sample `loader` reads from its MDS shards to `path`, one per
    line (from the training process and from its forked data workers alike)."""
    mixture = loader.reader.mixture
    read = mixture.get_item

    def get_item(sample_id, retry=7):
        with open(path, "a") as f:
            f.write(f"{int(sample_id)}\n")
        return read(sample_id, retry)

    mixture.get_item = get_item


def read_ids(path):
    return [int(line) for line in open(path)] if os.path.exists(path) else []


def test_data_parallel_ranks_read_only_their_share(three_datasets, tmp_path, tokenizer_dir, encoder_cfg,
                                                   adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing=False, packing_buffer=4)
    single = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, seed=1)
    epoch = Counter(single.order.epoch_ids(0).tolist())
    ranks = [build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, dp_rank=r, dp_size=3, seed=1)
             for r in range(3)]
    per_epoch = ranks[0].order.per_epoch
    # A third of the epoch each (mosaic pads it to a multiple of 3), not the whole of it.
    assert single.order.per_epoch == single.epoch_size == sum(epoch.values())
    assert all(r.order.per_epoch == per_epoch for r in ranks) and per_epoch == -(-single.epoch_size // 3)
    # Mosaic's partition: the ranks' epochs together are the single rank's epoch, plus
    # the few repeats that make it divide by 3.
    together = Counter(i for r in ranks for i in r.order.epoch_ids(0).tolist())
    assert not (epoch - together) and sum((together - epoch).values()) == 3 * per_epoch - sum(epoch.values())
    states = []
    for r, loader in enumerate(ranks):
        record_reads(loader, tmp_path / f"reads{r}")
        states.append([])
        for _ in range(per_epoch):
            states[r].append(loader.state_dict())
            next(loader)
        # A rank reads its own samples, in its order: the epoch's share and the packing
        # buffer's look-ahead into the next epoch, nothing else.
        own = loader.order.epoch_ids(0).tolist() + loader.order.epoch_ids(1).tolist()
        reads = read_ids(tmp_path / f"reads{r}")
        assert per_epoch <= len(reads) <= per_epoch + 4 and reads == own[:len(reads)]
    # A rank resumed from its checkpoint continues with its own next sample.
    resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, dp_rank=1, dp_size=3, seed=1)
    resumed.load_state_dict(states[1][5])
    again = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, dp_rank=1, dp_size=3, seed=1)
    for _ in range(5):
        next(again)
    assert torch.equal(next(resumed)["tokens"], next(again)["tokens"])
    with pytest.raises(ValueError, match="dp_rank: saved 0, now 1"):
        resumed.load_state_dict(states[0][2])
    with pytest.raises(ValueError, match="order: saved None"):
        resumed.load_state_dict({k: v for k, v in states[1][2].items() if k != "order"})


def test_workers_give_the_same_batches_and_resume_exactly(three_datasets, tokenizer_dir, encoder_cfg, adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing_buffer=8)
    plain = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=7)
    cfg.num_workers = 2
    workers = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=7)
    states, batches = [], []
    for _ in range(30):  # past the first epoch boundary
        states.append(workers.state_dict())
        got = next(workers)
        expected = next(plain)
        assert torch.equal(got["tokens"], expected["tokens"]) and got["sample_datasets"] == expected["sample_datasets"]
        assert torch.equal(got["audio_features"], expected["audio_features"])
        batches.append(got)
    assert states[-1]["next_position"] > workers.order.per_epoch
    for k in (3, 17):  # samples were in flight in the workers when these states were taken
        resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=7)
        resumed.load_state_dict(states[k])
        for j in range(k, k + 5):
            got = next(resumed)
            assert torch.equal(got["tokens"], batches[j]["tokens"]), (k, j)
            assert torch.equal(got["audio_features"], batches[j]["audio_features"])
        resumed.close()
    workers.close()


def test_the_workers_of_a_rank_that_dies_hard_end_with_it(three_datasets, tokenizer_dir, tmp_path):
    """A training process killed without clean-up (out-of-memory killer, os._exit) takes
    its data workers with it: they were found blocked an hour on, writing to a pipe
    nobody read."""
    import subprocess
    import sys
    import time

    import psutil

    from tests.distributed_run import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = tmp_path / "rank.log"  # a file, not a pipe: a surviving worker would hold a pipe open
    with open(log, "w") as out:
        subprocess.run([sys.executable, str(Path(__file__).with_name("dying_rank_script.py")), str(tokenizer_dir),
                        *(str(three_datasets / name) for name in ("alpha", "beta", "gamma"))],
                       stdout=out, stderr=subprocess.STDOUT, timeout=120, env=env, cwd=REPO)
    (line,) = [line for line in log.read_text().splitlines() if line.startswith("WORKERS ")]
    workers = [int(pid) for pid in line.split()[1:]]
    assert len(workers) == 2, log.read_text()

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 20  # torch's own parent check would take 5 s, if the worker got to it
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [pid for pid in workers if alive(pid)]
    for pid in survivors:  # leave nothing behind, whatever the verdict
        psutil.Process(pid).kill()
    assert survivors == []


def _shared_memory_descriptors() -> int:
    """This process's open descriptors of shared-memory blocks (mosaic's, in /dev/shm)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/")
        except OSError:  # closed meanwhile
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc/self/fd")
def test_closed_loaders_give_back_their_shared_memory_and_files(three_datasets, tokenizer_dir, encoder_cfg,
                                                               adapter_cfg):
    """Mosaic holds every opened mixture's shared memory until the process exits (about
    14 descriptors each); close() gives it back, so opening loaders again and again does
    not accumulate descriptors (a notebook, an evaluation service, this suite). Counted
    on the shared-memory descriptors, which close() releases at once: the total also
    moves with the worker queues' pipes, which their feeder threads close a moment later."""
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), num_workers=1,
                      validation=[DatasetEntry(name="val_beta", path=str(three_datasets / "beta"))])

    def open_use_close():
        loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=0)
        next(loader)
        (val,) = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2).values()
        next(iter(val))
        held = _shared_memory_descriptors()
        loader.close()
        val.suite.close()
        return held

    before = _shared_memory_descriptors()
    held = [open_use_close() for _ in range(3)]
    assert min(held) >= before + 10  # the control: an open loader and suite hold their shared memory
    assert _shared_memory_descriptors() == before


def test_seven_hundred_datasets_in_one_mixture(tmp_path, tokenizer_dir, encoder_cfg, adapter_cfg):
    for i in range(700):
        write_mds(tmp_path / "many" / f"part{i:04d}", tone_samples(1, seed=i, min_s=0.1, max_s=0.2))
    cfg = data_config([DatasetEntry(name="many", path=str(tmp_path / "many" / "part*"), weight=1.0)],
                      tokenizer=str(tokenizer_dir), packing_buffer=64)
    resolved = resolve_entries(cfg.train)
    assert len(resolved) == 700 and resolved[0].name == "many/part0000"
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=4, seed=0)
    names = set()
    for _ in range(10):
        names.update(next(loader)["sample_datasets"])
    assert len(names) > 100  # the mixture draws from many of them
    # Open files, memory and proportions of 720 + 85 datasets: tests/data/test_many_datasets.py


def test_validation_sets_read_everything_in_order_once(three_datasets, tokenizer_dir, encoder_cfg, adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir),
                      validation=[DatasetEntry(name="val_beta", path=str(three_datasets / "beta")),
                                  DatasetEntry(name="val_gamma", path=str(three_datasets / "gamma"))])
    sets = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2)
    assert list(sets) == ["val_beta", "val_gamma"]
    got = [t for b in sets["val_gamma"] for t in b["transcripts"]]
    assert len(got) == 20 and all(t.startswith("g") for t in got)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(10):  # evaluating again opens nothing new
        assert got == [t for b in sets["val_gamma"] for t in b["transcripts"]]  # same order every time
        assert len([t for b in sets["val_beta"] for t in b["transcripts"]]) == 30
    assert len(os.listdir("/proc/self/fd")) == fds
    halves = [build_validation_loaders(cfg, encoder_cfg, adapter_cfg, 2, dp_rank=r, dp_size=2)["val_beta"]
              for r in range(2)]
    per_rank = [[t for b in h for t in b["transcripts"]] for h in halves]
    assert sorted(per_rank[0] + per_rank[1]) == sorted(t for b in sets["val_beta"] for t in b["transcripts"])
    assert len(per_rank[0]) == 15
    cfg.validation_max_samples = 5
    assert sum(b["num_samples"] for b in build_validation_loaders(cfg, encoder_cfg, adapter_cfg, 2)["val_beta"]) == 5


@pytest.mark.parametrize("features_on", ["cpu", "device"])
def test_validation_read_by_workers_gives_the_same_batches_in_the_same_order(three_datasets, tokenizer_dir,
                                                                              encoder_cfg, adapter_cfg, features_on):
    """data.num_workers=2: the validation samples are read, decoded and turned into log-mel
    by worker processes (one pool for every validation dataset), the batches bit for bit
    those read in the training process, in the same order, with a bad sample told the same
    way; interleaved datasets (as the round-robin evaluation draws them) too. Under
    data.features_on=device the workers send the clips, and the batches their waveforms."""
    import numpy as np

    from orchestrator.data.audio import encode_flac

    bad = write_mds(three_datasets.parent / f"val_with_bad_{features_on}", tone_samples(6, seed=5)[:3] + [
        {"audio": encode_flac(np.zeros(16000 * 7, np.float32), 16000), "text": "one"}] + tone_samples(6, seed=5)[3:])
    validation = [DatasetEntry(name="val_beta", path=str(three_datasets / "beta")),
                  DatasetEntry(name="val_bad", path=str(bad))]

    def batches(workers):
        cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), validation=validation,
                          num_workers=workers, on_bad_sample="skip", features_on=features_on)
        sets = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2)
        next(iter(sets["val_beta"]))  # an evaluation that stops early (its queued reads are cancelled)
        readers = {name: iter(vset) for name, vset in sets.items()}
        drawn = []
        while readers:  # one batch of each in turn
            for name in list(readers):
                batch = next(readers[name], None)
                if batch is None:
                    del readers[name]
                else:
                    drawn.append((name, batch))
        next(iter(sets.values())).suite.close()  # stops the workers
        return drawn, {name: vset.bad.as_dict() for name, vset in sets.items()}

    (own, own_bad), (workers, workers_bad) = batches(0), batches(2)
    assert [name for name, _ in own] == [name for name, _ in workers] and len(own) >= 5
    for (name, a), (_, b) in zip(own, workers):
        assert sorted(a) == sorted(b), name
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (name, key)
            else:
                assert a[key] == b[key], (name, key)
    assert own_bad == workers_bad and own_bad["val_bad"] == {"val_bad": 1}


def test_train_and_validation_batches_from_the_demo_config_shape(three_datasets, tokenizer_dir, encoder_cfg,
                                                                  adapter_cfg):
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing=False)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=3, seed=0))
    assert batch["tokens"].shape == (3, 128) and batch["audio_features"].shape == (3, 80, 500)
    assert batch["packed"] is False and batch["num_samples"] == 3


def test_missing_dataset_and_bad_glob_are_clear_errors(tmp_path, tokenizer_dir):
    with pytest.raises(FileNotFoundError, match="not an MDS dataset.*index.json"):
        resolve_entries([DatasetEntry(name="x", path=str(tmp_path / "nope"))])
    with pytest.raises(FileNotFoundError, match="no MDS dataset.*matches"):
        resolve_entries([DatasetEntry(name="x", path=str(tmp_path / "nope*"))])
    with pytest.raises(ValueError, match="glob patterns are expanded for local paths only"):
        resolve_entries([DatasetEntry(name="x", path="s3://bucket/a/*")])


def test_bad_samples_error_names_dataset_shard_and_index_or_are_skipped_and_counted(
        tmp_path, tokenizer_dir, encoder_cfg, adapter_cfg):
    import numpy as np

    from orchestrator.data.audio import encode_flac

    good = tone_samples(6, seed=1)
    bad = {
        "undecodable": {"audio": b"\x00garbage" * 10, "text": "one"},
        "empty_text": {"audio": good[0]["audio"], "text": "   "},
        "too_long_audio": {"audio": encode_flac(np.zeros(16000 * 6, np.float32), 16000), "text": "one"},
        "wrong_rate": {"audio": encode_flac(np.zeros(8000, np.float32), 8000), "text": "two"},
        "too_many_tokens": {"audio": good[1]["audio"], "text": " ".join(["seven"] * 200)},
    }
    for reason, sample in bad.items():
        path = write_mds(tmp_path / reason, good[:3] + [sample] + good[3:])
        cfg = data_config([DatasetEntry(name=reason, path=str(path))], tokenizer=str(tokenizer_dir),
                          shuffle=False, wrong_sample_rate="refuse", packing_buffer=8)
        if reason == "wrong_rate":
            with pytest.raises(BadSampleError, match=r"dataset wrong_rate: shard .*shard\.00000\.mds, sample 3: "
                                                     r"audio is at 8000 Hz"):
                next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0))
            cfg.wrong_sample_rate = "resample"
            assert next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0))["num_samples"] > 0
            continue
        expected = {"undecodable": "cannot decode", "empty_text": "empty answer",
                    "too_long_audio": "exceeds data.max_audio_seconds", "too_many_tokens": "does not fit"}[reason]
        with pytest.raises(BadSampleError, match=rf"dataset {reason}: shard \S+shard\.\d{{5}}\.mds, sample 3: "
                                                 rf".*{expected}.*on_bad_sample=skip"):
            next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0))
        cfg.on_bad_sample = "skip"
        loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0)
        samples = sum(next(loader)["num_samples"] for _ in range(3))
        assert samples > 0 and loader.bad_samples()[reason] >= 1
        assert loader.state_dict()["bad_samples"][reason] >= 1


def test_long_audio_is_chunked_when_configured(tmp_path, tokenizer_dir, encoder_cfg, adapter_cfg):
    import numpy as np

    from orchestrator.data.audio import encode_flac

    path = write_mds(tmp_path / "long", [{"audio": encode_flac(np.full(16000 * 12, 0.1, np.float32), 16000),
                                          "text": "one two"}])
    cfg = data_config([DatasetEntry(name="long", path=str(path))], tokenizer=str(tokenizer_dir), long_audio="chunk",
                      packing=False, seq_length=256)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 1, seed=0))
    # 12 s in 5-s chunks: 5 + 5 + 2 s -> 50 + 50 + 20 placeholders, one run after another.
    assert batch["audio_num_tokens"].tolist() == [50, 50, 20]
    assert batch["audio_lengths"].tolist() == [500, 500, 200]
    # 10.05 s: the last 0.05 s would make no audio token (under frame_stack 5 encoder frames): left out.
    path = write_mds(tmp_path / "tail", [{"audio": encode_flac(np.full(16080 * 10, 0.1, np.float32), 16000),
                                          "text": "one two"}])
    cfg = data_config([DatasetEntry(name="tail", path=str(path))], tokenizer=str(tokenizer_dir), long_audio="chunk",
                      packing=False, seq_length=256)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 1, seed=0))
    assert batch["audio_num_tokens"].tolist() == [50, 50]


def test_the_ctc_loss_of_a_chunked_recording_runs_over_all_its_windows(tmp_path, tokenizer_dir, tokenizer,
                                                                        encoder_cfg, adapter_cfg):
    """data.long_audio=chunk cuts a 12-s recording into 3 windows, one sample with one
    transcript: its auxiliary CTC loss aligns the transcript over the windows' adapter
    frames one after another (the later windows join the first), is finite, equals the
    CTC of the concatenated frames, and its gradient reaches every window's frames."""
    import numpy as np
    import torch

    from orchestrator.data.audio import encode_flac
    from orchestrator.models.adapters import JOINS_PREVIOUS, AudioAdapter, ctc_losses
    from orchestrator.train.audiollm_provider import ctc_clip_groups, ctc_samples

    path = write_mds(tmp_path / "long", [{"audio": encode_flac(np.full(16000 * 12, 0.1, np.float32), 16000),
                                          "text": "one two three"}])
    cfg = data_config([DatasetEntry(name="long", path=str(path))], tokenizer=str(tokenizer_dir), long_audio="chunk",
                      packing=False, seq_length=256)
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 1, seed=0))
    per_clip = ctc_samples(batch, set(tokenizer.all_special_ids))
    assert isinstance(per_clip[0], tuple) and per_clip[1:] == [JOINS_PREVIOUS, JOINS_PREVIOUS]
    assert ctc_clip_groups(per_clip) == [(0, [0, 1, 2])]
    transcript = per_clip[0][2]
    assert tokenizer.decode(transcript).strip() == "one two three"

    windows = batch["audio_num_tokens"].tolist()  # 50 + 50 + 20 adapter frames
    adapter = AudioAdapter(num_states=2, d_model=8, hidden_size=16, frame_stack=5, ctc_vocab_size=len(tokenizer))
    frames = torch.randn(sum(windows), 16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    loss = ctc_losses(adapter, frames, windows, [s[2] if isinstance(s, tuple) else s for s in per_clip])
    assert loss.shape == (1,) and torch.isfinite(loss).all() and float(loss.detach()) > 0
    assert torch.equal(loss, ctc_losses(adapter, frames, [sum(windows)], [transcript]))
    loss.sum().backward()
    assert all(float(g.abs().sum()) > 0 for g in frames.grad.split(windows))


def test_corrupt_shard_names_the_shard(tmp_path, tokenizer_dir, encoder_cfg, adapter_cfg):
    path = write_mds(tmp_path / "corrupt", tone_samples(12, seed=2), size_limit=1 << 14)
    shards = sorted(path.glob("shard.*.mds"))
    assert len(shards) >= 2
    victim = shards[1]
    data = bytearray(victim.read_bytes())
    data[:64] = b"\xff" * 64  # the sample offset table at the start of the shard
    victim.write_bytes(bytes(data))
    cfg = data_config([DatasetEntry(name="corrupt", path=str(path))], tokenizer=str(tokenizer_dir), shuffle=False,
                      packing_buffer=16)
    with pytest.raises(BadSampleError, match=rf"dataset corrupt: shard \S+{victim.name}, sample \d+"):
        for _ in range(4):
            next(build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0))
    cfg.on_bad_sample = "skip"
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0)
    for _ in range(4):
        next(loader)
    assert loader.bad_samples()["corrupt"] >= 1


@pytest.mark.multiprocess
def test_torchrun_ranks_with_workers_read_half_each_and_resume_exactly(three_datasets, tmp_path, tokenizer_dir,
                                                                       encoder_cfg, adapter_cfg):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    from orchestrator.runtime.ports import free_port

    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing=False, packing_buffer=4,
                      num_workers=2, validation=[DatasetEntry(name="val_beta", path=str(three_datasets / "beta"))])
    single = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, seed=11)
    epoch = Counter(single.order.epoch_ids(0).tolist())
    spec = {"data": OmegaConf.to_container(cfg), "seed": 11, "resume_at": 9, "after": 6}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    port = free_port()
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={port}",
                           str(Path(__file__).with_name("dp_loader_script.py")), str(tmp_path / "spec.json"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=repo)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_epoch = ranks[0]["per_epoch"]
    assert per_epoch == ranks[1]["per_epoch"] and 2 * per_epoch - sum(epoch.values()) in (0, 1, 2)
    # Each rank read its half of the epoch plus at most what was in flight (the packing
    # buffer and 2 workers x 2 prefetched samples) - not the other rank's samples.
    shares = [Counter(r["epoch_ids"][:per_epoch]) for r in ranks]
    for r, rank in enumerate(ranks):
        reads = Counter(read_ids(tmp_path / f"reads{r}"))
        assert not (shares[r] - reads), f"rank {r} did not read all of its share"
        extra = reads - shares[r]
        assert sum(extra.values()) <= 4 + 2 * 2, (r, extra)
        assert not (extra - Counter(rank["epoch_ids"][per_epoch:])), "read beyond its own order"
    assert not (epoch - (shares[0] + shares[1]))  # the union is the whole epoch
    for rank in ranks:
        assert rank["resumed"] == rank["continued"]  # same batches after a resume with workers
    v0, v1 = ranks[0]["val"]["val_beta"], ranks[1]["val"]["val_beta"]
    full = [t for b in build_validation_loaders(cfg, encoder_cfg, adapter_cfg, 2)["val_beta"] for t in b["transcripts"]]
    assert len(v0) == len(v1) == 15 and sorted(v0 + v1) == sorted(full)


def test_skipping_counts_what_the_job_judges_and_names_the_dataset(tmp_path, tokenizer_dir, encoder_cfg, adapter_cfg,
                                                                   caplog):
    """data.on_bad_sample=skip with a dataset whose samples are all garbage: the first
    skips are told with their place; the training loader goes on counting (the training
    job judges data.max_bad_fraction over every data-parallel rank's counts,
    tests/train/test_damaged_run.py), and the judgement of these counts names the
    dataset and the bound; a validation reader judges its own reads and stops."""
    good = write_mds(tmp_path / "good", tone_samples(24, seed=1))
    broken = write_mds(tmp_path / "broken", [{"audio": b"not audio at all", "text": "one two"}] * 24)
    cfg = data_config([DatasetEntry(name="good", path=str(good)), DatasetEntry(name="broken", path=str(broken))],
                      tokenizer=str(tokenizer_dir), shuffle=False, packing_buffer=8, on_bad_sample="skip")
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0)
    with caplog.at_level("WARNING", logger="orchestrator.data.loader"):
        while loader.bad.counts["broken"] < 12:
            next(loader)
    told = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("skipped a bad sample (data.on_bad_sample=skip) in dataset broken: shard ") for m in told) == 3
    assert "dataset broken: 10 bad samples skipped of 10 read" in told
    counts = loader.sample_counts()
    assert counts["bad_samples/broken"] == counts["read_samples/broken"] >= 12 and "read_samples/good" not in counts
    problem = bad_share_problem(dict(loader.bad.counts), dict(loader.bad.read), 0.01)
    assert re.match(r"dataset broken: (\d+) of the \1 samples read are bad \(100%, more than data.max_bad_fraction="
                    r"0.01\)\. .*raise data.max_bad_fraction", problem), problem
    assert bad_share_problem({"broken": 9}, {"broken": 9}, 0.01) is None  # too few to judge
    assert bad_share_problem({"broken": 10}, {"broken": 2000}, 0.01) is None  # under the bound
    validation = BadSamples("skip", 0.01)  # judges its own reads
    with pytest.raises(BadSampleError, match=r"dataset v: 10 of the 10 samples read are bad .* \(the last in dataset v: "
                                             r"shard s, sample 9: garbage\)"):
        for i in range(10):
            validation.handle({"dataset": "v", "shard": "s", "index": i}, "garbage")
    # A higher bound goes on without them; the counts survive a resume.
    cfg.max_bad_fraction = 1.0
    loader = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0)
    for _ in range(6):
        next(loader)
    state = loader.state_dict()
    assert state["bad_samples"]["broken"] >= 10 and state["read_samples"]["good"] > 0
    resumed = build_train_loader(cfg, encoder_cfg, adapter_cfg, 2, seed=0)
    resumed.load_state_dict(state)
    assert resumed.bad.read == loader.bad.read and resumed.bad.counts == loader.bad.counts


def _key(batch):
    return tuple(batch["tokens"].flatten().tolist()), float(batch["audio_features"].double().sum())


def test_a_run_continues_at_another_data_parallel_size_with_the_same_steps(three_datasets, tokenizer_dir,
                                                                           encoder_cfg, adapter_cfg):
    """Four canonical nodes; a global batch of 4 micro-batches. Three steps each at DP 4,
    2, 1 and 4 again, each phase resumed from the merged states of the one before (as a
    checkpoint's rank files are merged): every step reads the same micro-batches as a
    straight DP-4 run (so no sample is lost or read twice), and DP 3 is refused with the
    sizes that continue the run."""
    cfg = data_config(_entries(three_datasets), tokenizer=str(tokenizer_dir), packing=False, packing_buffer=4)

    def ranks(dp, nodes=4):
        return [RankLoader(cfg, encoder_cfg, adapter_cfg, 1, r, dp, seed=1, canonical_nodes=nodes) for r in range(dp)]

    def step(loaders):
        per_rank = 4 // len(loaders)
        return sorted(_key(next(loader)) for loader in loaders for _ in range(per_rank))

    straight = ranks(4)
    expected = [step(straight) for _ in range(12)]
    # At DP = canonical nodes each rank is exactly its node: the order of a plain loader.
    plain = build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=1, dp_rank=2, dp_size=4, seed=1)
    again = RankLoader(cfg, encoder_cfg, adapter_cfg, 1, 2, 4, seed=1)
    assert [_key(next(plain)) for _ in range(5)] == [_key(next(again)) for _ in range(5)]
    for loader in [*straight, plain, again]:
        loader.close()

    got, states = [], None
    for dp in (4, 2, 1, 4):
        loaders = ranks(dp)
        if states is not None:
            merged = merge_rank_states(states)
            for loader in loaders:
                loader.load_state_dict(merged)
        got += [step(loaders) for _ in range(3)]
        states = [loader.state_dict() for loader in loaders]
        for loader in loaders:
            loader.close()
    assert got == expected

    three = RankLoader(cfg, encoder_cfg, adapter_cfg, 1, 0, 3, seed=1)
    with pytest.raises(ValueError, match="data-parallel size 3 does not divide the run's 4 canonical nodes.*"
                                         "sizes that continue it: 1, 2, 4"):
        three.load_state_dict(merge_rank_states(states))
    with pytest.raises(ValueError, match="data.canonical_nodes=8, but this run.s sample order was fixed at 4"):
        RankLoader(cfg, encoder_cfg, adapter_cfg, 1, 0, 4, seed=1, canonical_nodes=8).load_state_dict(
            merge_rank_states(states))
