"""The training job's data interface: packed micro-batches from a mixture of MDS datasets.

    loader = build_train_loader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size=4,
                                dp_rank=0, dp_size=1, cp_size=1, seed=1234)
    batch = next(loader)                   # dict, see orchestrator.data.packing
    state = loader.state_dict()            # save with the checkpoint
    loader.load_state_dict(state)          # the next batch is the one that would have come
    loader.bad_samples()                   # {"dataset/reason": count} for the metrics

    for name, val in build_validation_loaders(...).items():
        for batch in val: ...              # each set opened only while iterated

Order: every rank walks the same global sample order (one mosaic StreamingDataset
over all training datasets, shuffled with `seed`, epoch after epoch); sample g
belongs to data-parallel rank g % dp_size and only that rank decodes it. The state
is (next global position, positions still waiting in the packing buffer), so a
resumed loader rebuilds the buffer exactly and repeats or drops nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from orchestrator.data import mel, sources
from orchestrator.data.audio import AudioError, load_audio
from orchestrator.data.packing import Example, Packer, collate
from orchestrator.data.prompts import PromptBuilder, audio_placeholder_count


class BadSampleError(RuntimeError):
    """A sample that cannot be used; names its dataset, shard file and index."""


class SampleProcessor:
    """Raw MDS sample -> Example (decode, resample, chunk, tokenize), or a reason it is bad."""

    def __init__(self, data_cfg, encoder_cfg, adapter_cfg, tokenizer, pad_multiple: int = 1):
        self.cfg = _plain(data_cfg)  # attribute reads on a DictConfig are slow in this per-sample path
        self.max_source_positions = int(encoder_cfg.max_source_positions)
        self.num_mel_bins = int(encoder_cfg.num_mel_bins)
        self.frame_stack = int(adapter_cfg.frame_stack)
        self.window_frames = mel.window_frames_for(self.max_source_positions)
        self.prompts = PromptBuilder(tokenizer, data_cfg.prompt_template, data_cfg.response_suffix,
                                     add_bos=data_cfg.add_bos, add_eos=data_cfg.add_eos,
                                     loss_on_prompt=data_cfg.loss_on_prompt, audio_token=data_cfg.audio_token)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_multiple = pad_multiple
        self.max_samples = int(round(data_cfg.max_audio_seconds * data_cfg.sample_rate))

    def clips(self, audio: np.ndarray) -> List[np.ndarray]:
        if audio.shape[0] <= self.max_samples:
            return [audio]
        seconds = audio.shape[0] / self.cfg.sample_rate
        if self.cfg.long_audio != "chunk":
            raise AudioError(f"clip of {seconds:.2f} s exceeds data.max_audio_seconds ({self.cfg.max_audio_seconds}); "
                             f"set data.long_audio=chunk to split it, or raise data.max_audio_seconds")
        # Consecutive chunks of max_audio_seconds; their placeholder runs follow each other in the prompt.
        return [audio[i:i + self.max_samples] for i in range(0, audio.shape[0], self.max_samples)]

    def __call__(self, raw: Dict[str, Any], position: int, dataset_id: int) -> Example:
        if "__read_error__" in raw:
            raise AudioError(f"shard read failed: {raw['__read_error__']}")
        cfg = self.cfg
        if cfg.audio_field not in raw:
            raise AudioError(f"no column {cfg.audio_field!r} (data.audio_field); columns: {sorted(raw)}")
        audio = load_audio(raw[cfg.audio_field], raw.get(cfg.sample_rate_field), cfg.sample_rate,
                           cfg.wrong_sample_rate)
        clips = self.clips(audio)
        text = raw.get(cfg.text_field)
        if not isinstance(text, str) or not text.strip():
            raise AudioError(f"empty transcript in column {cfg.text_field!r} (data.text_field)")
        counts = [audio_placeholder_count(c.shape[0], self.max_source_positions, self.frame_stack, cfg.audio_tokens)
                  for c in clips]
        tokenized = self.prompts.build(text, counts)
        needed = -(-len(tokenized) // self.pad_multiple) * self.pad_multiple
        if needed > cfg.seq_length:
            raise AudioError(f"sample of {len(tokenized)} tokens ({sum(counts)} audio) does not fit "
                             f"data.seq_length ({cfg.seq_length}); raise data.seq_length or shorten the clip")
        return Example(position, dataset_id, tokenized, clips)

    def features(self, examples: Sequence[Example], cache: Optional["FeatureCache"] = None):
        """Log-mel of every clip of `examples`, in order; computed in one batch for those
        not cached (and cached when there is room)."""
        todo = [ex for ex in examples if ex.features is None]
        clips = [c for ex in todo for c in ex.clips]
        if clips:
            feats, lengths = mel.features(clips, self.num_mel_bins, self.window_frames)
            at = 0
            for ex in todo:
                n = len(ex.clips)
                ex.features, ex.feature_lengths = feats[at:at + n].clone(), lengths[at:at + n].clone()
                at += n
                if cache is not None:
                    cache.put(ex)
        if not examples:
            return torch.zeros(0, self.num_mel_bins, self.window_frames), torch.zeros(0, dtype=torch.long)
        return (torch.cat([ex.features for ex in examples]), torch.cat([ex.feature_lengths for ex in examples]))


class FeatureCache:
    """Tokenized samples with their log-mel features, by mosaic sample id, up to a memory
    budget (data.feature_cache_mb). A corpus that fits is decoded once and then every
    later epoch skips decoding, resampling and the STFT."""

    def __init__(self, budget_mb: int):
        self.budget = int(budget_mb) * (1 << 20)
        self.used = 0
        self.items: Dict[int, Example] = {}

    def get(self, sample_id: int, position: int, dataset_id: int) -> Optional[Example]:
        hit = self.items.get(sample_id)
        if hit is None:
            return None
        return Example(position, dataset_id, hit.tokenized, [], sample_id, hit.features, hit.feature_lengths)

    def put(self, ex: Example) -> None:
        if ex.sample_id < 0 or ex.sample_id in self.items:
            return
        size = ex.features.numel() * ex.features.element_size() + ex.tokenized.tokens.nbytes * 3
        if self.used + size > self.budget:
            return
        self.items[ex.sample_id] = Example(-1, ex.dataset_id, ex.tokenized, [], ex.sample_id, ex.features,
                                           ex.feature_lengths)
        self.used += size


def _plain(cfg):
    """A read-only attribute view with plain Python values of a config section."""
    from types import SimpleNamespace

    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return SimpleNamespace(**OmegaConf.to_container(cfg, resolve=True))
    return cfg


class BadSamples:
    """Counts of skipped samples per dataset (exposed to the metrics)."""

    def __init__(self, policy: str):
        if policy not in ("error", "skip"):
            raise ValueError(f"data.on_bad_sample={policy!r}; use 'error' or 'skip'")
        self.policy = policy
        self.counts: Counter = Counter()

    def handle(self, where: Dict[str, Any], reason: str) -> None:
        message = (f"bad sample in dataset {where['dataset']}: shard {where['shard']}, sample {where['index']}: "
                   f"{reason}. Fix or remove it, or set data.on_bad_sample=skip to skip and count such samples")
        if self.policy == "error":
            raise BadSampleError(message)
        self.counts[where["dataset"]] += 1

    def as_dict(self) -> Dict[str, int]:
        return dict(sorted(self.counts.items()))


def _tokenizer(data_cfg, tokenizer_path: Optional[str]):
    from orchestrator.data.tokenizer_build import load_tokenizer

    path = tokenizer_path or data_cfg.tokenizer
    if not path:
        raise ValueError("no tokenizer: set data.tokenizer to a local HF tokenizer directory")
    return load_tokenizer(path, audio_token=data_cfg.audio_token)


class TrainLoader:
    """Infinite iterator of packed micro-batches for one data-parallel rank."""

    def __init__(self, data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int, dp_size: int,
                 cp_size: int, seed: int, tokenizer_path: Optional[str] = None):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size ({dp_size}))")
        if data_cfg.num_workers:
            raise ValueError(f"data.num_workers={data_cfg.num_workers}: decoding runs in the training process; "
                             f"set data.num_workers=0")
        self.cfg, self.mbs, self.dp_rank, self.dp_size, self.seed = data_cfg, micro_batch_size, dp_rank, dp_size, seed
        pad_multiple = 2 * cp_size if (cp_size > 1 and data_cfg.packing) else 1
        self.processor = SampleProcessor(data_cfg, encoder_cfg, adapter_cfg, _tokenizer(data_cfg, tokenizer_path),
                                         pad_multiple)
        self.datasets = sources.resolve_entries(data_cfg.train)
        if not self.datasets:
            raise ValueError("data.train lists no datasets")
        self.names = sources.stream_names(self.datasets)
        self.mixture = sources.open_mixture(self.datasets, seed=seed, shuffle=data_cfg.shuffle,
                                            cache_root=sources.process_cache_root(data_cfg.cache_dir))
        self.epoch_size = int(self.mixture.epoch_size)
        self.packer = Packer(data_cfg.seq_length, micro_batch_size, data_cfg.packing_buffer, data_cfg.packing,
                             pad_multiple)
        self.bad = BadSamples(data_cfg.on_bad_sample)
        self.cache = FeatureCache(data_cfg.feature_cache_mb) if data_cfg.feature_cache_mb > 0 else None
        self.next_position = 0  # global position of the next sample to draw
        self._skip_below = 0  # after a resume: positions below this were emitted unless pending
        self._pending_resume: set = set()
        self._iter: Optional[Iterator] = None
        self._iter_epoch = -1
        self.micro_batches = 0

    # ---------------------------------------------------------------- sample stream
    def _start(self, position: int) -> None:
        epoch, offset = divmod(position, self.epoch_size)
        self.mixture.load_state_dict({"epoch": epoch, "sample_in_epoch": offset, "num_canonical_nodes": 1,
                                      "shuffle_seed": self.seed, "initial_physical_nodes": 1})
        self._iter = iter(self.mixture)
        self._iter_epoch = epoch
        self.next_position = position

    def _draw(self) -> Dict[str, Any]:
        if self._iter is None:
            self._start(self.next_position)
        while True:
            try:
                raw = next(self._iter)
                break
            except StopIteration:
                self._start((self._iter_epoch + 1) * self.epoch_size)
        return raw

    def _fill(self) -> None:
        drawn_without_use = 0
        while not self.packer.full():
            drawn_without_use += 1
            if drawn_without_use > self.epoch_size + self.dp_size:
                raise BadSampleError(f"a whole epoch of the training mixture ({self.epoch_size} samples) gave no "
                                     f"usable sample for data-parallel rank {self.dp_rank}; skipped so far: "
                                     f"{self.bad.as_dict()}")
            raw = self._draw()
            position = self.next_position
            self.next_position += 1
            if position % self.dp_size != self.dp_rank:
                continue
            if position < self._skip_below and position not in self._pending_resume:
                continue  # emitted before the checkpoint
            sample_id = int(raw["__sample_id__"])
            where = sources.locate(self.mixture, sample_id, self.datasets)
            cached = self.cache.get(sample_id, position, where["stream_id"]) if self.cache else None
            if cached is not None:
                self.packer.add(cached)
                drawn_without_use = 0
                continue
            try:
                example = self.processor(raw, position, where["stream_id"])
                example.sample_id = sample_id
            except (AudioError, ValueError) as err:
                self.bad.handle(where, str(err))
                continue
            self.packer.add(example)
            drawn_without_use = 0

    # ---------------------------------------------------------------- iterator
    def __iter__(self) -> "TrainLoader":
        return self

    def __next__(self) -> Dict[str, Any]:
        self._fill()
        rows = self.packer.pop_rows()
        self.micro_batches += 1
        return collate(rows, self.cfg.seq_length, self.processor.pad_id, self.processor.pad_multiple, self.names,
                       self.processor.prompts.audio_token_id, num_rows=self.mbs,
                       features_fn=lambda examples: self.processor.features(examples, self.cache),
                       packed=self.cfg.packing)

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> Dict[str, Any]:
        return {"next_position": self.next_position, "pending": self.packer.pending_positions(),
                "dp_rank": self.dp_rank, "dp_size": self.dp_size, "seed": self.seed,
                "epoch_size": self.epoch_size, "datasets": self.names, "micro_batches": self.micro_batches,
                "bad_samples": self.bad.as_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        mismatched = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in
                      (("dp_size", self.dp_size), ("dp_rank", self.dp_rank), ("seed", self.seed),
                       ("epoch_size", self.epoch_size), ("datasets", self.names)) if state.get(k) != v]
        if mismatched:
            raise ValueError("the data loader state does not match this run (" + "; ".join(mismatched) +
                             "); resume with the same datasets, seed and data-parallel size")
        pending = [int(p) for p in state["pending"]]
        self.packer.buffer = []
        self._pending_resume = set(pending)
        self._skip_below = int(state["next_position"])
        self._start(min(pending + [self._skip_below]))
        self.micro_batches = int(state["micro_batches"])
        self.bad.counts = Counter(state.get("bad_samples", {}))

    def bad_samples(self) -> Dict[str, int]:
        return self.bad.as_dict()


def build_train_loader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int = 0,
                       dp_size: int = 1, cp_size: int = 1, seed: Optional[int] = None,
                       tokenizer_path: Optional[str] = None) -> TrainLoader:
    """data_cfg: the `data` section; encoder_cfg/adapter_cfg: model.encoder / model.adapter."""
    return TrainLoader(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size, dp_rank, dp_size, cp_size,
                       data_cfg.seed if seed is None else seed, tokenizer_path)


class ValidationSuite:
    """All validation datasets as streams of ONE StreamingDataset, opened on first use and
    kept for the run: evaluating again opens nothing new, and hundreds of validation
    datasets cost no more files than one. Samples are read by index (no shuffle, no
    epoch machinery): dataset k owns the contiguous sample ids of its stream."""

    def __init__(self, datasets: Sequence[sources.ResolvedDataset], cache_dir: Optional[str]):
        self.datasets = list(datasets)
        self.cache_dir = cache_dir
        self._mixture = None

    @property
    def mixture(self):
        if self._mixture is None:
            self._mixture = sources.open_mixture(self.datasets, seed=0, shuffle=False,
                                                 cache_root=sources.process_cache_root(self.cache_dir),
                                                 proportional=False)
        return self._mixture

    def sample_ids(self, k: int) -> range:
        m = self.mixture
        first = int(m.shard_offset_per_stream[k])
        last = first + int(m.shards_per_stream[k])
        start = int(m.samples_per_shard[:first].sum())
        return range(start, start + int(m.samples_per_shard[first:last].sum()))


class ValidationSet:
    """One validation dataset, read in order; data-parallel rank r reads samples r, r+dp, ..."""

    def __init__(self, suite: ValidationSuite, k: int, processor: SampleProcessor, data_cfg, micro_batch_size: int,
                 dp_rank: int, dp_size: int):
        self.suite, self.k, self.processor, self.cfg = suite, k, processor, data_cfg
        self.mbs, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size
        self.bad = BadSamples(data_cfg.on_bad_sample)
        self.name = suite.datasets[k].name

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        ids = self.suite.sample_ids(self.k)
        limit = self.cfg.validation_max_samples
        if limit is not None:
            ids = ids[:limit]
        mixture = self.suite.mixture
        packer = Packer(self.cfg.seq_length, self.mbs, max(self.cfg.packing_buffer, self.mbs), self.cfg.packing,
                        self.processor.pad_multiple)
        transcripts: Dict[int, str] = {}
        for position in range(self.dp_rank, len(ids), self.dp_size):
            sample_id = ids[position]
            raw = mixture[sample_id]
            try:
                packer.add(self.processor(raw, position, 0))
            except (AudioError, ValueError) as err:
                self.bad.handle(sources.locate(mixture, sample_id, self.suite.datasets), str(err))
                continue
            transcripts[position] = str(raw.get(self.cfg.text_field, "")).strip()
            if packer.full():
                yield self._batch(packer.pop_rows(), transcripts)
        while packer.buffer:
            yield self._batch(packer.pop_rows(), transcripts)

    def _batch(self, rows, transcripts: Dict[int, str]) -> Dict[str, Any]:
        batch = collate(rows, self.cfg.seq_length, self.processor.pad_id, self.processor.pad_multiple, [self.name],
                        self.processor.prompts.audio_token_id, num_rows=self.mbs,
                        features_fn=self.processor.features, packed=self.cfg.packing)
        batch["transcripts"] = [transcripts.pop(ex.position) for row in rows for ex in row]
        return batch


def build_validation_loaders(data_cfg, encoder_cfg, adapter_cfg, micro_batch_size: int, dp_rank: int = 0,
                             dp_size: int = 1, cp_size: int = 1,
                             tokenizer_path: Optional[str] = None) -> Dict[str, ValidationSet]:
    """One iterable per validation dataset (glob entries: one per match), keyed by name.

    Every batch also carries `transcripts` (the reference text of each sample, in
    token order) for word error rates; the prompt of a sample is its tokens before
    the first trained label (loss_mask).
    """
    pad_multiple = 2 * cp_size if (cp_size > 1 and data_cfg.packing) else 1
    processor = SampleProcessor(data_cfg, encoder_cfg, adapter_cfg, _tokenizer(data_cfg, tokenizer_path), pad_multiple)
    datasets = sources.resolve_entries(data_cfg.validation)
    suite = ValidationSuite(datasets, data_cfg.cache_dir)
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
