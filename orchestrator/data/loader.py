"""The training job's data interface: packed micro-batches from a mixture of MDS datasets.

    loader = build_train_loader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size=4,
                                dp_rank=0, dp_size=1, seed=1234)
    batch = next(loader)                   # dict, see orchestrator.data.packing
    state = loader.state_dict()            # save with the checkpoint
    loader.load_state_dict(state)          # the next batch is the one that would have come
    loader.bad_samples()                   # {"dataset/reason": count} for the metrics

    for name, val in build_validation_loaders(...).items():
        for batch in val: ...              # each set opened only while iterated

Order: data-parallel rank r reads only its own samples, in mosaic's partition of
each epoch (`sources.RankOrder`: one canonical node per rank, shuffled with `seed`,
epoch after epoch); position k of the rank's stream is a pure function of (datasets,
seed, dp_size, r, k). Reading, decoding, resampling, log-mel and tokenizing happen in
`data.num_workers` worker processes (0: in the training process), in position order,
at most `data.packing_buffer` samples ahead; packing and collation stay in the
training process. The state is (next position handed to the packer, positions still
waiting in the packing buffer): samples in flight in the workers at a checkpoint are
not in it, so a resumed loader rebuilds the buffer exactly and repeats or drops nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import weakref
from collections import Counter, deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from orchestrator.plan import tasks
from orchestrator.plan.adapter_kinds import frames_per_token
from orchestrator.data import mel, prompts, remote, sources
from orchestrator.data.audio import AudioError, load_audio
from orchestrator.data.packing import Example, Packer, collate
from orchestrator.data.frames import read_frames
from orchestrator.data.prompts import audio_placeholder_count

log = logging.getLogger(__name__)


class BadSampleError(RuntimeError):
    """A sample that cannot be used; names its dataset, shard file and index."""


class SampleProcessor:
    """Raw MDS sample -> Example (decode, resample, chunk, tokenize) in its dataset's
    format (orchestrator.plan.tasks: single clip or conversation), or a reason it is bad.
    `datasets[k]` is the dataset whose samples come with format index k."""

    def __init__(self, data_cfg, encoder_cfg, adapter_cfg, tokenizer, datasets: Sequence[sources.ResolvedDataset],
                 split: str):
        self.cfg = _plain(data_cfg)  # attribute reads on a DictConfig are slow in this per-sample path
        self.max_source_positions = int(encoder_cfg.max_source_positions)
        self.num_mel_bins = int(encoder_cfg.num_mel_bins)
        self.frames_per_token = frames_per_token(adapter_cfg)
        self.window_frames = mel.window_frames_for(self.max_source_positions)
        problems = [p for d in datasets for p in tasks.entry_problems(d.entry or {"name": d.name}, data_cfg, split)]
        if problems:
            raise ValueError("data." + split + ": " + "; ".join(problems))
        self.formats = [tasks.dataset_format(d.entry or {"name": d.name}, data_cfg, d.name) for d in datasets]
        self.builders = self._builders(tokenizer, data_cfg)
        self.audio_token_id = prompts.audio_token_id(tokenizer, data_cfg.audio_token)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.max_samples = int(round(data_cfg.max_audio_seconds * data_cfg.sample_rate))
        self.on_device = data_cfg.features_on == "device"
        # data.silence_padding: training clips only; up to the window (read_frames' 100 frames
        # a second) and data.max_audio_seconds
        self.silence_padding = float(data_cfg.silence_padding) if split == "train" else 0.0
        self.padded_samples = min(self.max_samples, self.window_frames * data_cfg.sample_rate // 100)

    def _builders(self, tokenizer, data_cfg) -> list:
        """One builder per format; datasets with the same template share theirs."""
        common = dict(add_bos=data_cfg.add_bos, add_eos=data_cfg.add_eos, loss_on_prompt=data_cfg.loss_on_prompt,
                      audio_token=data_cfg.audio_token)
        shared: Dict[Any, Any] = {}
        out = []
        for fmt in self.formats:
            if fmt.conversation:
                key = "conversation"
                make = lambda: prompts.ConversationBuilder(tokenizer, **common)  # noqa: E731
            else:
                try:
                    template = fmt.template or prompts.chat_user_template(tokenizer, fmt.instruction)
                except ValueError as err:
                    raise ValueError(f"dataset {fmt.name}: {err}") from None
                key = (template, fmt.ctc)
                make = lambda: prompts.PromptBuilder(tokenizer, template, data_cfg.response_suffix, ctc=fmt.ctc,  # noqa: E731
                                                     **common)
            if key not in shared:
                shared[key] = make()
            out.append(shared[key])
        return out

    def clips(self, audio: np.ndarray) -> List[np.ndarray]:
        if audio.shape[0] <= self.max_samples:
            return [audio]
        seconds = audio.shape[0] / self.cfg.sample_rate
        if self.cfg.long_audio != "chunk":
            raise AudioError(f"clip of {seconds:.2f} s exceeds data.max_audio_seconds ({self.cfg.max_audio_seconds}); "
                             f"set data.long_audio=chunk to split it, or raise data.max_audio_seconds")
        # Consecutive chunks of max_audio_seconds; their placeholder runs follow each other in the prompt.
        chunks = [audio[i:i + self.max_samples] for i in range(0, audio.shape[0], self.max_samples)]
        # A last chunk too short for one audio token (under frames_per_token encoder frames:
        # 0.1 s at layer_mix's frame_stack 5) has nothing the model could read: it is left out.
        if len(chunks) > 1 and self._placeholders(chunks[-1:]) == [0]:
            chunks.pop()
        return chunks

    def _padded(self, clip: np.ndarray, position: int) -> np.ndarray:
        """`clip` with silence around it (data.silence_padding's share of them, drawn from
        data.seed and the sample's place in the order): a random length from the clip's own
        up to the window, the silence split at random before and after."""
        rng = np.random.default_rng([int(self.cfg.seed), int(position)])
        if rng.random() >= self.silence_padding or len(clip) >= self.padded_samples:
            return clip
        total = int(rng.integers(len(clip), self.padded_samples + 1))
        before = int(rng.integers(0, total - len(clip) + 1))
        return np.concatenate([np.zeros(before, clip.dtype), clip, np.zeros(total - len(clip) - before, clip.dtype)])

    def _placeholders(self, clips: Sequence[np.ndarray]) -> List[int]:
        return [audio_placeholder_count(c.shape[0], self.max_source_positions, self.frames_per_token,
                                        self.cfg.audio_tokens)
                for c in clips]

    def _fits(self, tokenized) -> bool:
        return len(tokenized) <= self.cfg.seq_length

    def __call__(self, raw: Dict[str, Any], position: int, dataset_id: int, format_index: Optional[int] = None
                 ) -> Example:
        if "__read_error__" in raw:
            raise AudioError(f"shard read failed: {raw['__read_error__']}")
        k = dataset_id if format_index is None else format_index
        fmt, builder = self.formats[k], self.builders[k]
        missing = [f"{col!r} ({key})" for col, key in fmt.required_columns() if col not in raw]
        if missing:
            raise AudioError(f"no column {', '.join(missing)}; the sample's columns: {sorted(raw)}")
        if fmt.conversation:
            return self._conversation(raw, fmt, builder, position, dataset_id)
        audio = load_audio(raw[fmt.audio_field], raw.get(self.cfg.sample_rate_field), self.cfg.sample_rate,
                           self.cfg.wrong_sample_rate)
        clips = self.clips(audio)
        if self.silence_padding > 0 and len(clips) == 1:
            clips = [self._padded(clips[0], position)]
        text = raw[fmt.text_field]
        if not isinstance(text, str) or not text.strip():
            raise AudioError(f"empty answer in column {fmt.text_field!r} ({fmt.name}'s text_field)")
        instruction = raw.get(fmt.instruction_field) if fmt.instruction_field else None
        counts = self._placeholders(clips)
        tokenized = builder.build(text, counts, instruction)
        if not self._fits(tokenized):
            raise AudioError(f"sample of {len(tokenized)} tokens ({sum(counts)} audio) does not fit "
                             f"data.seq_length ({self.cfg.seq_length}); raise data.seq_length or shorten the clip")
        return Example(position, dataset_id, tokenized, clips)

    def _conversation(self, raw: Dict[str, Any], fmt, builder, position: int, dataset_id: int) -> Example:
        turns = raw[fmt.turns_field]
        if isinstance(turns, (str, bytes)):
            turns = json.loads(turns)
        problems = tasks.conversation_problems(turns, raw.keys())
        if problems:
            raise AudioError(f"conversation in column {fmt.turns_field!r}: " + "; ".join(problems))
        rate = raw.get(self.cfg.sample_rate_field)
        segments: Dict[str, List[np.ndarray]] = {}  # audio column -> its clips
        for turn in turns:
            for column in turn.get("audio") or []:
                if column not in segments:
                    try:
                        segments[column] = self.clips(load_audio(raw[column], rate, self.cfg.sample_rate,
                                                                 self.cfg.wrong_sample_rate))
                    except AudioError as err:
                        raise AudioError(f"audio segment {column!r}: {err}") from None
        truncated = False
        keep = len(turns)
        while True:
            kept = turns[:keep]
            tokenized = builder.build(kept, {i: self._placeholders(c) for i, c in segments.items()})
            if self._fits(tokenized):
                break
            # Cut at the last assistant turn before `keep` (an answer must end the sample).
            shorter = [k + 1 for k in range(keep - 1) if turns[k]["role"] == "assistant"]
            if self.cfg.long_conversation != "truncate" or not shorter:
                hint = ("not even its first answer fits" if self.cfg.long_conversation == "truncate" else
                        "set data.long_conversation=truncate to cut it at a turn boundary")
                raise AudioError(f"conversation of {len(tokenized)} tokens ({sum(tokenized.audio_tokens)} audio) "
                                 f"does not fit data.seq_length ({self.cfg.seq_length}); {hint}, or raise "
                                 f"data.seq_length")
            keep, truncated = shorter[-1], True
        order = [c for turn in turns[:keep] for c in (turn.get("audio") or [])]  # placeholder order
        return Example(position, dataset_id, tokenized, [clip for c in order for clip in segments[c]],
                       truncated=truncated)

    def features(self, examples: Sequence[Example]) -> Dict[str, Any]:
        """The audio entries of a micro-batch of `examples`, clips in order (collate's
        features_fn): "audio_features" (log-mel, computed in one go for the examples that
        do not carry it yet) and "audio_lengths"; under data.features_on=device the
        clips' waveforms ("audio_waveforms", with "audio_mel_bins" and "audio_window_frames"),
        which the training step turns into features on the encoder's device
        (mel.batch_features)."""
        if self.on_device:
            clips = [c for ex in examples for c in ex.clips]
            return {"audio_waveforms": mel.waveforms(clips, self.window_frames),
                    "audio_lengths": self._read_lengths(mel.frame_counts(clips, self.window_frames)),
                    "audio_mel_bins": self.num_mel_bins, "audio_window_frames": self.window_frames}
        todo = [ex for ex in examples if ex.features is None]
        clips = [c for ex in todo for c in ex.clips]
        if clips:
            feats, lengths = mel.features(clips, self.num_mel_bins, self.window_frames)
            at = 0
            for ex in todo:
                n = len(ex.clips)
                ex.features, ex.feature_lengths = feats[at:at + n].clone(), lengths[at:at + n].clone()
                at += n
        if not examples:
            return {"audio_features": torch.zeros(0, self.num_mel_bins, self.window_frames),
                    "audio_lengths": torch.zeros(0, dtype=torch.long)}
        return {"audio_features": torch.cat([ex.features for ex in examples]),
                "audio_lengths": self._read_lengths(torch.cat([ex.feature_lengths for ex in examples]))}

    def _read_lengths(self, valid: torch.Tensor) -> torch.Tensor:
        """The clips' mel frames that the model reads and counts its audio tokens from, as
        their placeholders were counted (data.audio_tokens: frames.read_frames)."""
        return torch.tensor([read_frames(int(n), self.window_frames, self.cfg.audio_tokens) for n in valid.tolist()],
                            dtype=torch.long)

    def for_transport(self, example: Example) -> Example:
        """An Example as a worker process sends it back: its log-mel (the clips left
        behind), or under data.features_on=device its clips; numpy arrays, which are pickled
        as plain bytes between processes, where a torch tensor goes through shared-memory
        file descriptors (measured: about 2x the CPU per sample)."""
        if not self.on_device:
            self.features([example])
            example.clips = []
            example.features, example.feature_lengths = example.features.numpy(), example.feature_lengths.numpy()
        return example


def _received(example: Example) -> Example:
    """An Example from a worker process (SampleProcessor.for_transport), as tensors again."""
    if example.features is not None:
        example.features = torch.from_numpy(example.features)
        example.feature_lengths = torch.from_numpy(example.feature_lengths)
    return example


class FeatureCache:
    """Tokenized samples with their log-mel features (under data.features_on=device their
    clips), by mosaic sample id, up to a memory budget (data.feature_cache_mb). A corpus
    that fits is decoded once and then every later epoch skips decoding, resampling and
    the STFT."""

    def __init__(self, budget_mb: int):
        self.budget = int(budget_mb) * (1 << 20)
        self.used = 0
        self.items: Dict[int, Example] = {}

    def get(self, sample_id: int, position: int, dataset_id: int) -> Optional[Example]:
        hit = self.items.get(sample_id)
        if hit is None:
            return None
        return Example(position, dataset_id, hit.tokenized, hit.clips, sample_id, hit.features, hit.feature_lengths,
                       hit.truncated)

    def put(self, ex: Example) -> None:
        if ex.sample_id < 0 or ex.sample_id in self.items:
            return
        audio = (ex.features.numel() * ex.features.element_size() if ex.features is not None
                 else sum(c.nbytes for c in ex.clips))
        size = audio + ex.tokenized.tokens.nbytes * 3
        if self.used + size > self.budget:
            return
        clips = [] if ex.features is not None else ex.clips
        self.items[ex.sample_id] = Example(-1, ex.dataset_id, ex.tokenized, clips, ex.sample_id, ex.features,
                                           ex.feature_lengths, ex.truncated)
        self.used += size


def _plain(cfg):
    """A read-only attribute view with plain Python values of a config section."""
    from types import SimpleNamespace

    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return SimpleNamespace(**OmegaConf.to_container(cfg, resolve=True))
    return cfg


# Bad samples a dataset must have before its share is judged: one bad sample among the
# first reads is not a broken dataset.
MIN_BAD_TO_JUDGE = 10


def bad_share_problem(bad: Dict[str, float], read: Dict[str, float], max_fraction: float,
                      over: str = "") -> Optional[str]:
    """The stop of data.on_bad_sample=skip: a dataset whose bad samples, at least
    MIN_BAD_TO_JUDGE of them, are more than `max_fraction` of the samples read from it.
    `bad` and `read` per dataset (`over` says whose: the training job sums them over its
    data-parallel ranks, orchestrator.train.loop); the message names every dataset with
    bad samples. None when none is over."""
    over_bound = [name for name in sorted(bad) if bad[name] >= MIN_BAD_TO_JUDGE
                  and bad[name] > max_fraction * read.get(name, 0)]
    if not over_bound:
        return None
    name = over_bound[0]
    b, r = int(bad[name]), int(read.get(name, 0))
    others = [f"{n} {int(bad[n])} of {int(read.get(n, 0))}" for n in sorted(bad) if n != name and bad[n]]
    return (f"dataset {name}: {b} of the {r} samples read{over} are bad ({b / max(r, 1):.0%}, more than "
            f"data.max_bad_fraction={max_fraction:g})" + (f"; bad samples elsewhere: {', '.join(others)}" if others
                                                          else "")
            + ". Where they are: the log's 'skipped a bad sample' lines. Fix or remove the dataset, or raise "
              "data.max_bad_fraction to go on without those samples")


class BadSamples:
    """Skipped samples per dataset (exposed to the metrics), told on the console as they
    are skipped (the first few of each dataset with where they are, then at 10, 100, ...),
    and a stop when one dataset's share of bad samples passes data.max_bad_fraction:
    skipping a few bad samples is what data.on_bad_sample=skip is for, losing a dataset is
    not (bad_share_problem). `judge_here`: judged over the samples this reader has read
    (validation); training loaders leave it to the training job, which judges over every
    data-parallel rank's reads (a broken dataset spread over 8 ranks has 8 times fewer
    bad samples on each)."""

    SHOWN_EACH = 3  # skipped samples told one by one per dataset

    def __init__(self, policy: str, max_fraction: float = 1.0, judge_here: bool = True):
        if policy not in ("error", "skip"):
            raise ValueError(f"data.on_bad_sample={policy!r}; use 'error' or 'skip'")
        self.policy, self.max_fraction, self.judge_here = policy, float(max_fraction), judge_here
        self.counts: Counter = Counter()
        self.read: Counter = Counter()  # samples read per dataset, good and bad

    def good(self, dataset: str) -> None:
        self.read[dataset] += 1

    def handle(self, where: Dict[str, Any], reason: str) -> None:
        place = f"dataset {where['dataset']}: shard {where['shard']}, sample {where['index']}"
        if self.policy == "error":
            raise BadSampleError(f"bad sample in {place}: {reason}. Fix or remove it, or set data.on_bad_sample=skip "
                                 f"to skip and count such samples")
        name = where["dataset"]
        self.counts[name] += 1
        self.read[name] += 1
        bad, read = self.counts[name], self.read[name]
        if bad <= self.SHOWN_EACH:
            log.warning("skipped a bad sample (data.on_bad_sample=skip) in %s: %s", place, reason)
        elif str(bad).strip("0") == "1":  # 10, 100, 1000, ...
            log.warning("dataset %s: %d bad samples skipped of %d read", name, bad, read)
        if self.judge_here:
            problem = bad_share_problem({name: bad}, {name: read}, self.max_fraction)
            if problem:
                raise BadSampleError(f"{problem} (the last in {place}: {reason})")

    def read_of_bad(self) -> Dict[str, int]:
        """Samples read from each dataset that has bad ones (what judging their share needs)."""
        return {name: self.read[name] for name in sorted(self.counts)}

    def as_dict(self) -> Dict[str, int]:
        return dict(sorted(self.counts.items()))

    def state_dict(self) -> Dict[str, Dict[str, int]]:
        return {"bad_samples": self.as_dict(), "read_samples": dict(sorted(self.read.items()))}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.counts = Counter(state.get("bad_samples", {}))
        self.read = Counter(state.get("read_samples", {}))


def _tokenizer(data_cfg, tokenizer_path: Optional[str]):
    from orchestrator.data.tokenizer_build import load_tokenizer

    path = tokenizer_path or data_cfg.tokenizer
    if not path:
        raise ValueError("no tokenizer: set data.tokenizer to a local HF tokenizer directory")
    return load_tokenizer(path, audio_token=data_cfg.audio_token)


class _Cached:
    """A position whose sample the training process already holds in its FeatureCache."""

    def __init__(self, position: int, sample_id: int, dataset_id: int):
        self.position, self.sample_id, self.dataset_id = position, sample_id, dataset_id


class _Bad:
    """A position whose sample cannot be used, and why."""

    def __init__(self, position: int, sample_id: int, reason: str):
        self.position, self.sample_id, self.reason = position, sample_id, reason


class SampleReader:
    """Task (position, sample id, dataset index) -> Example with its log-mel features or
    _Bad, and a run of _Cached positions as it is: the work of the data workers (a map-style dataset, so
    torch's DataLoader runs it in worker processes and returns results in task order)."""

    def __init__(self, mixture, processor: SampleProcessor):
        self.mixture, self.processor = mixture, processor

    def __getitem__(self, task):
        if isinstance(task, list):  # a run of cached positions (_Tasks), passed on as it is
            return task
        position, sample_id, dataset_id = task
        raw = self.mixture[sample_id]
        try:
            example = self.processor(raw, position, dataset_id)
        except (AudioError, ValueError) as err:
            return _Bad(position, sample_id, str(err))
        example.sample_id = sample_id
        return self.processor.for_transport(example)


def _as_is(item):
    return item


class _Tasks:
    """The rank's positions from `start` on, as reader tasks; iterated in the training
    process (by the DataLoader's sampler when there are workers), so it can consult the
    FeatureCache and the resume bookkeeping. It holds the loader weakly: the loader holds
    the iterator over these tasks, and a cycle would keep a dropped loader's mosaic
    shared memory (and its file descriptors) until the next garbage collection."""

    def __init__(self, loader: "TrainLoader", start: int):
        self.loader, self.start = weakref.proxy(loader), start

    CACHED_RUN = 64  # consecutive cached positions sent as one task

    def __iter__(self):
        loader = self.loader
        position = self.start
        run: List[_Cached] = []
        while True:
            if not (position < loader._skip_below and position not in loader._pending_resume):
                sample_id = loader.order.sample_id(position)
                dataset_id = int(loader.locator.streams([sample_id])[0])
                if loader.cache is not None and sample_id in loader.cache.items:
                    # Cached samples need no worker: a run of them is one task (a worker's
                    # round trip per sample cost later epochs more than their packing).
                    run.append(_Cached(position, sample_id, dataset_id))
                    if len(run) == self.CACHED_RUN:
                        yield run
                        run = []
                else:
                    if run:
                        yield run
                        run = []
                    yield position, sample_id, dataset_id
            position += 1  # else: emitted before the checkpoint


def _one_by_one(results: Iterator[Any]) -> Iterator[Any]:
    """Reader results in position order, runs of cached positions taken apart."""
    for result in results:
        if isinstance(result, list):
            yield from result
        else:
            yield result


class TrainLoader:
    """Infinite iterator of packed micro-batches for one data-parallel rank."""

    ORDER = "mosaic-canonical-node-per-dp-rank"  # saved with the state: what a position means

    def __init__(self, data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int, dp_size: int,
                 seed: int, tokenizer_path: Optional[str] = None, shared: Optional["TrainLoader"] = None,
                 num_workers: Optional[int] = None):
        """`shared`: another canonical node's loader of the same process (RankLoader), whose
        opened mixture, tokenizer, reader and feature cache this one uses; `num_workers`:
        this loader's share of data.num_workers (default: all of them)."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size ({dp_size}))")
        if data_cfg.num_workers < 0:
            raise ValueError(f"data.num_workers={data_cfg.num_workers}; use 0 (decode in the training process) "
                             f"or more")
        self.cfg, self.mbs, self.dp_rank, self.dp_size, self.seed = data_cfg, micro_batch_size, dp_rank, dp_size, seed
        self.num_workers = int(data_cfg.num_workers if num_workers is None else num_workers)
        self._owns_mixture = shared is None
        if shared is None:
            self.datasets = sources.resolve_entries(data_cfg.train)
            if not self.datasets:
                raise ValueError("data.train lists no datasets")
            self.processor = SampleProcessor(data_cfg, encoder_cfg, adapter_cfg, _tokenizer(data_cfg, tokenizer_path),
                                             self.datasets, "train")
            remote.check_remote_datasets(self.datasets)  # one error for every unreadable one, before mosaic
            self.mixture = sources.open_mixture(self.datasets, seed=seed, shuffle=data_cfg.shuffle,
                                                cache_root=sources.process_cache_root(data_cfg.cache_dir),
                                                canonical_nodes=dp_size, cache_limit=data_cfg.cache_limit,
                                                download_retry=data_cfg.download_retry)
            check_columns(self.mixture, self.processor.formats, self.datasets, "train")
            self.cache = FeatureCache(data_cfg.feature_cache_mb) if data_cfg.feature_cache_mb > 0 else None
        else:
            if (shared.dp_size, shared.seed) != (dp_size, seed):
                raise ValueError(f"a loader shares the mixture of one with the same canonical nodes and seed: "
                                 f"{(dp_size, seed)} vs {(shared.dp_size, shared.seed)}")
            self.datasets, self.processor, self.mixture, self.cache = (shared.datasets, shared.processor,
                                                                       shared.mixture, shared.cache)
        self.names = sources.stream_names(self.datasets)
        self.epoch_size = int(self.mixture.epoch_size)
        self.order = sources.RankOrder(self.mixture, dp_rank, dp_size)
        self.locator = sources.SampleLocator(self.mixture, self.datasets)
        self.reader = SampleReader(self.mixture, self.processor)
        self.packer = Packer(data_cfg.seq_length, micro_batch_size, data_cfg.packing_buffer, data_cfg.packing)
        self.bad = BadSamples(data_cfg.on_bad_sample, data_cfg.max_bad_fraction, judge_here=False)
        self.truncated: Counter = Counter()  # conversations cut to fit, per dataset
        self.next_position = 0  # the rank's position of the next sample to hand to the packer
        self._skip_below = 0  # after a resume: positions below this were emitted unless pending
        self._pending_resume: set = set()
        self._results: Optional[Iterator] = None
        self._workers = None  # the DataLoader iterator that owns the worker processes
        self.micro_batches = 0

    # ---------------------------------------------------------------- sample stream
    def _open(self, start: int) -> None:
        self._stop_workers()
        tasks = _Tasks(self, start)
        if not self.num_workers:
            self._results = _one_by_one(map(self.reader.__getitem__, iter(tasks)))
            return
        from torch.utils.data import DataLoader

        # At most packing_buffer samples in flight: with the packer's own buffer, memory
        # stays within twice the look-ahead the user set. fork: the workers inherit the
        # opened mixture and tokenizer instead of unpickling them.
        prefetch = max(2, -(-int(self.cfg.packing_buffer) // self.num_workers))
        self._workers = iter(DataLoader(self.reader, sampler=tasks, batch_size=None, collate_fn=_as_is,
                                        num_workers=self.num_workers, prefetch_factor=prefetch,
                                        multiprocessing_context="fork", persistent_workers=False,
                                        worker_init_fn=functools.partial(_die_with, os.getpid())))
        self._results = _one_by_one(self._workers)

    def _stop_workers(self) -> None:
        """Stop the worker processes (a later batch starts new ones)."""
        workers, self._workers, self._results = self._workers, None, None
        if workers is not None:
            # torch has no public call that stops a DataLoader's workers now; its iterator's
            # __del__ calls this one, which is what dropping it would do at some later time.
            workers._shutdown_workers()

    def close(self) -> None:
        """Stop the workers and give back the mixture's shared memory; the loader is
        done (its state_dict still resumes a new one)."""
        self._stop_workers()
        if self._owns_mixture:
            sources.close_mixture(self.mixture)

    def _fill(self) -> None:
        unusable = 0
        if self._results is None:
            self._open(min(sorted(self._pending_resume) + [self.next_position]))
        while not self.packer.full():
            result = next(self._results)
            self.next_position = max(self.next_position, result.position + 1)
            if isinstance(result, _Bad):
                unusable += 1
                if unusable > self.order.per_epoch:
                    raise BadSampleError(f"a whole epoch of the training mixture ({self.order.per_epoch} samples "
                                         f"of data-parallel rank {self.dp_rank}) gave no usable sample; skipped so "
                                         f"far: {self.bad.as_dict()}")
                self.bad.handle(self.locator(result.sample_id), result.reason)
                continue
            if isinstance(result, _Cached):
                example = self.cache.get(result.sample_id, result.position, result.dataset_id)
            else:
                example = _received(result)
                if self.cache is not None:
                    self.cache.put(example)
            self.bad.good(self.names[example.dataset_id])
            if example.truncated:
                self.truncated[self.names[example.dataset_id]] += 1
            self.packer.add(example)
            unusable = 0

    # ---------------------------------------------------------------- iterator
    def __iter__(self) -> "TrainLoader":
        return self

    def __next__(self) -> Dict[str, Any]:
        self._fill()
        rows = self.packer.pop_rows()
        self.micro_batches += 1
        return collate(rows, self.cfg.seq_length, self.processor.pad_id, self.names,
                       self.processor.audio_token_id, num_rows=self.mbs,
                       features_fn=self.processor.features, packed=self.cfg.packing)

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> Dict[str, Any]:
        return {"next_position": self.next_position, "pending": self.packer.pending_positions(),
                "dp_rank": self.dp_rank, "dp_size": self.dp_size, "seed": self.seed, "order": self.ORDER,
                "epoch_size": self.epoch_size, "datasets": self.names, "micro_batches": self.micro_batches,
                **self.bad.state_dict(), "truncated_samples": dict(sorted(self.truncated.items()))}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        mismatched = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in
                      (("dp_size", self.dp_size), ("dp_rank", self.dp_rank), ("seed", self.seed),
                       ("order", self.ORDER), ("epoch_size", self.epoch_size), ("datasets", self.names))
                      if state.get(k) != v]
        if mismatched:
            raise ValueError("the data loader state does not match this run (" + "; ".join(mismatched) +
                             "); resume with the same datasets, seed and data-parallel size (a state saved "
                             "before the sample order was per rank has no 'order' and cannot be resumed)")
        self._stop_workers()
        self.packer.buffer = []
        self._pending_resume = {int(p) for p in state["pending"]}
        self._skip_below = self.next_position = int(state["next_position"])
        self.micro_batches = int(state["micro_batches"])
        self.bad.load_state_dict(state)
        self.truncated = Counter(state.get("truncated_samples", {}))

    def bad_samples(self) -> Dict[str, int]:
        return self.bad.as_dict()

    def sample_counts(self) -> Dict[str, int]:
        """Skipped (data.on_bad_sample=skip) and truncated (data.long_conversation=truncate)
        samples of this rank so far, per dataset, as metric names; and the samples read from
        each dataset with skipped ones (the training job judges their share over all ranks)."""
        return {**{f"bad_samples/{k}": v for k, v in self.bad.as_dict().items()},
                **{f"read_samples/{k}": v for k, v in self.bad.read_of_bad().items()},
                **{f"truncated_samples/{k}": v for k, v in sorted(self.truncated.items())}}


def check_columns(mixture, formats: Sequence[tasks.DatasetFormat], datasets: Sequence[sources.ResolvedDataset],
                  split: str) -> None:
    """Every dataset's first shard has the columns its format reads (mosaic read the
    column names from index.json): one error naming each dataset, column and setting,
    before any sample is read."""
    problems = []
    for k, (fmt, dataset) in enumerate(zip(formats, datasets)):
        shard = mixture.shards[int(mixture.shard_offset_per_stream[k])]
        have = list(getattr(shard, "column_names", []) or [])
        missing = [f"{col!r} ({key})" for col, key in fmt.required_columns() if col not in have]
        if missing:
            problems.append(f"dataset {dataset.name} ({dataset.path}) has no column {', '.join(missing)}; "
                            f"its columns: {have}")
    if problems:
        raise ValueError(f"data.{split}: " + "; ".join(problems) + ". Name the dataset's columns in its entry "
                         "(audio_field, text_field, instruction_field, turns_field)")


class RankLoader:
    """The training micro-batches of one data-parallel rank, at any data-parallel size
    that divides the run's number of canonical nodes.

    The run's sample order has C canonical nodes, fixed at its first start
    (`data.canonical_nodes`; by default the data-parallel size then) and kept in every
    checkpoint. Canonical node c is one TrainLoader (mosaic's partition over C nodes,
    its own packer and position), so its stream of micro-batches depends on nothing but
    the datasets, the seed, C and c. At data-parallel size D (a divisor of C), rank r
    holds the nodes c with c % D == r and hands out the next micro-batch of the node
    that has handed out the fewest (the lowest-numbered of those): no sample is read
    twice or skipped across a change of size, and where the global batch is a multiple
    of micro_batch_size x C, the micro-batches of a step are the same set at every such D
    (only their reduction order changes). At D = C each rank is exactly one node (the
    order of earlier versions)."""

    ORDER = "canonical-nodes"

    def __init__(self, data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int, dp_size: int,
                 seed: int, canonical_nodes: Optional[int] = None, tokenizer_path: Optional[str] = None):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size ({dp_size}))")
        self._args = (data_cfg, encoder_cfg, adapter_cfg, micro_batch_size)
        self.seed, self.tokenizer_path = seed, tokenizer_path
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.configured_nodes = canonical_nodes
        self.canonical_nodes = int(canonical_nodes or dp_size)
        check_canonical_nodes(self.canonical_nodes, dp_size, fixed=False)
        self.nodes: Dict[int, TrainLoader] = {}
        self._open()  # again by load_state_dict where the run's order has other canonical nodes
        self.names = self.nodes[self.owned[0]].names

    @property
    def owned(self) -> List[int]:
        return list(range(self.dp_rank, self.canonical_nodes, self.dp_size))

    def _open(self) -> None:
        data_cfg, encoder_cfg, adapter_cfg, mbs = self._args
        owned = self.owned
        # The rank's worker processes are shared among its nodes (at least one each).
        workers = int(data_cfg.num_workers)
        share = max(1, workers // len(owned)) if workers else 0
        first = None
        for c in owned:
            self.nodes[c] = TrainLoader(data_cfg, encoder_cfg, adapter_cfg, mbs, c, self.canonical_nodes, self.seed,
                                        self.tokenizer_path, shared=first, num_workers=share)
            first = first or self.nodes[c]

    def __iter__(self) -> "RankLoader":
        return self

    def __next__(self) -> Dict[str, Any]:
        node = min(self.nodes.values(), key=lambda n: (n.micro_batches, n.dp_rank))
        return next(node)

    def close(self) -> None:
        for node in reversed(list(self.nodes.values())):  # the mixture's owner last
            node.close()

    def state_dict(self) -> Dict[str, Any]:
        return {"order": self.ORDER, "canonical_nodes": self.canonical_nodes,
                "nodes": [self.nodes[c].state_dict() for c in self.owned]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """`state`: this rank's own saved state, or the states of several ranks merged by
        `merge_rank_states` (a run continued at another size); a state saved before the
        order had canonical nodes is the one node of its rank."""
        nodes = state["nodes"] if state.get("order") == self.ORDER else [state]
        saved = {int(n["dp_rank"]): n for n in nodes}
        total = int(state.get("canonical_nodes") or nodes[0]["dp_size"])
        check_canonical_nodes(total, self.dp_size, configured=self.configured_nodes)
        missing = [c for c in range(self.dp_rank, total, self.dp_size) if c not in saved]
        if missing:
            raise ValueError(f"the checkpoint's data state has no position for canonical node(s) {missing} of "
                             f"{total} (it holds {sorted(saved)}): its rank_state files are incomplete")
        if total != self.canonical_nodes:
            self.close()
            self.nodes, self.canonical_nodes = {}, total
            self._open()
        for c in self.owned:
            self.nodes[c].load_state_dict(saved[c])

    def sample_counts(self) -> Dict[str, int]:
        return dict(sum((Counter(n.sample_counts()) for n in self.nodes.values()), Counter()))


def check_canonical_nodes(canonical_nodes: int, dp_size: int, fixed: bool = True,
                          configured: Optional[int] = None) -> None:
    from orchestrator.plan.parallel_dims import canonical_nodes_problem

    problem = canonical_nodes_problem(canonical_nodes, dp_size, fixed, configured)
    if problem:
        raise ValueError(problem)


def merge_rank_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The data states of every rank of a checkpoint as one state holding every canonical
    node's position, for a run continued at another data-parallel size. Ranks of one
    data-parallel group (TP, PP, CP peers) hold the same nodes in the same state."""
    nodes: Dict[int, Dict[str, Any]] = {}
    total = None
    for state in states:
        own = state["nodes"] if state.get("order") == RankLoader.ORDER else [state]
        total = state.get("canonical_nodes") or own[0]["dp_size"]
        for node in own:
            nodes.setdefault(int(node["dp_rank"]), node)
    return {"order": RankLoader.ORDER, "canonical_nodes": total, "nodes": [nodes[c] for c in sorted(nodes)]}


def build_train_loader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int = 0,
                       dp_size: int = 1, seed: Optional[int] = None,
                       tokenizer_path: Optional[str] = None) -> TrainLoader:
    """data_cfg: the `data` section; encoder_cfg/adapter_cfg: model.encoder / model.adapter."""
    return TrainLoader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size, dp_rank, dp_size,
                       data_cfg.seed if seed is None else seed, tokenizer_path)


class ValidationSuite:
    """All validation datasets as streams of ONE StreamingDataset, opened on first use and
    kept for the run: evaluating again opens nothing new, and hundreds of validation
    datasets cost no more files than one. Samples are read by index (no shuffle, no
    epoch machinery): dataset k owns the contiguous sample ids of its stream."""

    def __init__(self, datasets: Sequence[sources.ResolvedDataset], data_cfg):
        self.datasets = list(datasets)
        self.cfg = data_cfg
        self.formats = [tasks.dataset_format(d.entry or {"name": d.name}, data_cfg, d.name) for d in self.datasets]
        self._mixture = None
        self._pool = None  # the validation workers (data.num_workers), started on first use

    @property
    def mixture(self):
        if self._mixture is None:
            self._mixture = sources.open_mixture(self.datasets, seed=0, shuffle=False,
                                                 cache_root=sources.process_cache_root(self.cfg.cache_dir),
                                                 proportional=False, cache_limit=self.cfg.cache_limit,
                                                 download_retry=self.cfg.download_retry)
            self.locator = sources.SampleLocator(self._mixture, self.datasets)
            check_columns(self._mixture, self.formats, self.datasets, "validation")
        return self._mixture

    def close(self) -> None:
        """Stop the workers and give back the mixture's shared memory (opened again on next use)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            _VALIDATION_READERS.pop(id(self), None)
        if self._mixture is not None:
            sources.close_mixture(self._mixture)
            self._mixture = None

    def read(self, k: int, processor: "SampleProcessor", tasks: Sequence[Tuple[int, int]],
             lookahead: int) -> Iterator[Any]:
        """Each task's (position, sample id) Example of dataset k, or _Bad, in task order.
        With data.num_workers the samples are read, decoded and turned into log-mel by
        worker processes (one pool for every validation dataset, kept for the run), at
        most `lookahead` of this dataset's ahead; otherwise here, the features left to
        collate as before."""
        mixture = self.mixture  # opened before the workers fork: they read through it
        if not self.cfg.num_workers:
            for position, sample_id in tasks:
                yield _validation_example(mixture, processor, k, position, sample_id, with_features=False)
            return
        if self._pool is None:
            import concurrent.futures
            import multiprocessing

            _VALIDATION_READERS[id(self)] = (self, processor)  # what the forked workers find
            self._pool = concurrent.futures.ProcessPoolExecutor(self.cfg.num_workers,
                                                                mp_context=multiprocessing.get_context("fork"),
                                                                initializer=_validation_worker, initargs=(os.getpid(),))
        pending: Deque = deque()
        tasks = iter(tasks)
        try:
            while True:
                while len(pending) < lookahead:
                    task = next(tasks, None)
                    if task is None:
                        break
                    pending.append(self._pool.submit(_read_in_worker, id(self), k, *task))
                if not pending:
                    return
                result = pending.popleft().result()
                yield result if isinstance(result, _Bad) else _received(result)
        finally:  # an evaluation that stops early (train.eval_iters) leaves no work queued
            for future in pending:
                future.cancel()

    def sample_ids(self, k: int) -> range:
        m = self.mixture
        start = int(m.sample_offset_per_stream[k])
        return range(start, start + int(m.samples_per_stream[k]))


class ValidationSet:
    """One validation dataset, read in order; data-parallel rank r reads samples r, r+dp, ..."""

    def __init__(self, suite: ValidationSuite, k: int, processor: SampleProcessor, data_cfg, micro_batch_size: int,
                 dp_rank: int, dp_size: int):
        self.suite, self.k, self.processor, self.cfg = suite, k, processor, data_cfg
        self.mbs, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size
        self.bad = BadSamples(data_cfg.on_bad_sample, data_cfg.max_bad_fraction)
        self.name = suite.datasets[k].name
        self.metric = processor.formats[k].metric  # how generation on this dataset is scored
        self.normaliser = processor.formats[k].normaliser  # and how its text is normalised first (wer, exact)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        ids = self.suite.sample_ids(self.k)
        limit = self.cfg.validation_max_samples
        if limit is not None:
            ids = ids[:limit]
        packer = Packer(self.cfg.seq_length, self.mbs, max(self.cfg.packing_buffer, self.mbs), self.cfg.packing)
        tasks = [(position, ids[position]) for position in range(self.dp_rank, len(ids), self.dp_size)]
        lookahead = max(2 * self.cfg.num_workers, self.mbs)
        for result in self.suite.read(self.k, self.processor, tasks, lookahead):
            if isinstance(result, _Bad):
                self.bad.handle(self.suite.locator(result.sample_id), result.reason)
                continue
            self.bad.good(self.name)
            packer.add(result)
            if packer.full():
                yield self._batch(packer.pop_rows())
        while packer.buffer:
            yield self._batch(packer.pop_rows())

    def _batch(self, rows) -> Dict[str, Any]:
        batch = collate(rows, self.cfg.seq_length, self.processor.pad_id, [self.name],
                        self.processor.audio_token_id, num_rows=self.mbs,
                        features_fn=self.processor.features, packed=self.cfg.packing)
        batch["transcripts"] = [ex.tokenized.reference for row in rows for ex in row]
        return batch


# Validation suites by id, for their forked workers (ValidationSuite.read).
_VALIDATION_READERS: Dict[int, tuple] = {}


def _validation_example(mixture, processor: "SampleProcessor", k: int, position: int, sample_id: int,
                        with_features: bool):
    """Validation sample `sample_id` of dataset k as an Example (its log-mel computed when
    `with_features`, as numpy arrays to cross processes), or _Bad with the reason."""
    try:
        example = processor(mixture[sample_id], position, 0, format_index=k)
    except (AudioError, ValueError) as err:
        return _Bad(position, sample_id, str(err))
    return processor.for_transport(example) if with_features else example


def _validation_worker(parent: int) -> None:
    """A forked validation worker's start: one intra-op thread, as torch's DataLoader
    workers do (the OpenMP pool inherited from the parent, whose threads did not survive
    the fork, would otherwise hang the first parallel op); it ends with its parent."""
    torch.set_num_threads(1)
    _die_with(parent)


def _die_with(parent: int, *_worker_id) -> None:
    """In a forked worker of the training process `parent`: end when it ends. A rank that
    dies hard (the out-of-memory killer, SIGKILL, os._exit) runs no clean-up, and its
    workers, blocked writing a result into a pipe they hold both ends of, lived on
    (an orphaned worker was found an hour after its rank, test suite). Linux's
    parent-death signal; elsewhere (no prctl) the workers keep torch's own check."""
    import ctypes

    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _read_in_worker(suite_id: int, k: int, position: int, sample_id: int):
    suite, processor = _VALIDATION_READERS[suite_id]
    return _validation_example(suite.mixture, processor, k, position, sample_id, with_features=True)


def build_validation_loaders(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int = 0,
                             dp_size: int = 1, tokenizer_path: Optional[str] = None) -> Dict[str, ValidationSet]:
    """One iterable per validation dataset (glob entries: one per match), keyed by name.

    Every batch also carries `transcripts` (the reference answer of each sample, in
    token order; a conversation's last scored assistant turn) and `answer_starts` (where
    in each sample that answer starts: its generation prompt is the tokens before);
    each set has the `metric` its dataset is scored by and the `normaliser` of its text
    (orchestrator.plan.tasks).
    """
    datasets = sources.resolve_entries(data_cfg.validation)
    processor = SampleProcessor(data_cfg, encoder_cfg, adapter_cfg, _tokenizer(data_cfg, tokenizer_path), datasets,
                                "validation")
    remote.check_remote_datasets(datasets)
    suite = ValidationSuite(datasets, data_cfg)
    return {d.name: ValidationSet(suite, k, processor, data_cfg, micro_batch_size, dp_rank, dp_size)
            for k, d in enumerate(datasets)}


def packing_utilization(loader: TrainLoader, micro_batches: int) -> float:
    """Mean share of token slots used over the next `micro_batches` batches."""
    used = slots = 0
    for _ in range(micro_batches):
        batch = next(loader)
        used += batch["num_tokens"]
        slots += batch["tokens"].numel()
    return used / max(slots, 1)


__all__ = ["BadSampleError", "TrainLoader", "ValidationSet", "build_train_loader", "build_validation_loaders"]
