"""The AudioLLM and the MDS loader behind the training loop's interfaces
(components.ModelProvider, components.BatchSource).

Micro-batches from the loader are [B, S] rows (orchestrator.data.packing) and go
through the model as rows: unpacked rows are one sample each under causal attention;
packed rows add a per-row document mask, so attention costs B*S^2, not (B*S)^2 as THD
over the flattened micro-batch would. Without pipeline parallelism the columns that
are padding in every row are cut before the forward and the per-token loss is padded
back to [B, S] (zeros there, where `loss_mask` is 0 too); with it, the schedule sends
fixed [S, B, hidden] tensors between stages, so rows keep their full length.

Under context parallelism (parallel.cp > 1) every rank of a CP group reads the same
micro-batch and `ContextParallelBatches` gives it its share (trimmed the same way first,
to a multiple of 2*CP*TP columns): the loop's loss and statistics then see this rank's
tokens only, and megatron sums token counts and gradients over the data x context
parallel ranks. The provider encodes only the clips this rank needs (those its
placeholders hold, and with the auxiliary CTC loss those whose transcripts it trains)
and scatters the routed frames (orchestrator.data.context_parallel).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from orchestrator.models.fusion import check_audio_placeholders, check_routed_frames
from orchestrator.models.adapters import JOINS_PREVIOUS
from orchestrator.train import megatron_config as mcfg

def audiollm_config(plan):
    """The plan's composed config as the typed schema object (attribute access, each
    section passed on to the function that owns it)."""
    from omegaconf import OmegaConf

    from orchestrator.plan.schema import AudioLLMConfig

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AudioLLMConfig), plan.config))


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The AudioLLM inside DDP / Float16Module wrappers."""
    while not hasattr(model, "pre_process") and hasattr(model, "module"):
        model = model.module
    return model


class AudioLLMProvider:
    """Builds AudioLLM chunks (fp32 on CPU; on GPU bf16 when the plan says bf16, built in
    that dtype rather than wrapped in Float16Module) and runs a loader micro-batch
    through one."""

    # The AudioLLM builds its own precision (a frozen encoder may stay fp32, the
    # adapter's layer mix sums in fp32): the loop must not cast the whole chunk.
    wrap_float16 = False

    def __init__(self, model_cfg, dims, *, audio_token_id: int, special_ids=(), lora_rank: int = 0,
                 encoder_lora: bool = False, seed: int = 0, ctc_weight: Optional[float] = None,
                 padded_vocab_size: Optional[int] = None, recompute=None):
        """`dims`: the sizes (orchestrator.plan.parallel_dims.ParallelDims: the Plan's);
        `special_ids`: the tokenizer's special tokens (CTC targets are the transcript's
        tokens without the chat markers); `seed`: with the data-parallel rank, seeds each
        clip's augmentation; `ctc_weight`: the CTC loss's weight (model.adapter.ctc_weight
        unless given); `padded_vocab_size` (the Plan's) and `recompute` (parallel.recompute):
        what the FLOP counter counts."""
        self.model_cfg, self.dims = model_cfg, dims
        self.audio_token_id, self.special_ids = int(audio_token_id), set(special_ids)
        self.lora_rank, self.encoder_lora, self.seed = int(lora_rank), encoder_lora, int(seed)
        self.ctc_weight = float(model_cfg.adapter.ctc_weight if ctc_weight is None else ctc_weight)
        self.padded_vocab_size, self.recompute = padded_vocab_size, recompute

    @classmethod
    def from_plan(cls, plan, cfg=None) -> "AudioLLMProvider":
        """The job's provider: the Plan's model and sizes, the tokenizer's ids (`cfg`: the
        plan's typed config, audiollm_config(plan), where the caller has it)."""
        from orchestrator.data.tokenizer_build import load_tokenizer

        cfg = cfg or audiollm_config(plan)
        tokenizer = load_tokenizer(cfg.data.tokenizer, audio_token=cfg.data.audio_token)
        return cls.with_ids(plan, int(tokenizer.convert_tokens_to_ids(cfg.data.audio_token)),
                            tokenizer.all_special_ids, cfg)

    @classmethod
    def with_ids(cls, plan, audio_token_id: int, special_ids=(), cfg=None) -> "AudioLLMProvider":
        """The Plan's model and sizes with these token ids (the full-size probe has no
        tokenizer: its ids need only be inside the vocabulary)."""
        cfg = cfg or audiollm_config(plan)
        return cls(cfg.model, plan.dims, audio_token_id=audio_token_id, special_ids=special_ids,
                   lora_rank=int(cfg.lora.rank), encoder_lora=int(cfg.lora.rank) > 0 and bool(cfg.lora.encoder),
                   seed=plan.seed, padded_vocab_size=plan.padded_vocab_size, recompute=cfg.parallel.recompute)

    def build(self, config, pre_process: bool, post_process: bool, vp_stage: Optional[int], decisions=None):
        from orchestrator.models.audiollm import build_audiollm

        target = {} if decisions is None else {"on_gpu": decisions.cuda, "attention": decisions.attention}
        return build_audiollm(self.model_cfg, config, pre_process, post_process, audio_token_id=self.audio_token_id,
                              random_init=mcfg.draws_random_init(config), vp_stage=vp_stage,
                              encoder_lora=self.encoder_lora, padded_vocab_size=self.padded_vocab_size, **target)

    def forward(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        inner = _unwrapped(model)
        if "cp_slots" in batch:
            return self._forward_context_parallel(model, inner, batch)
        seq = batch["tokens"].shape[1]
        width = trimmed_width(batch, self.dims)
        device = next(model.parameters()).device
        if inner.pre_process:  # on the host copy: the model never reads the ids (a host sync on GPUs)
            check_audio_placeholders(batch["tokens"][:, :width], self.audio_token_id, batch["audio_num_tokens"].tolist(),
                                     batch["audio_clip_rows"].tolist())
        inputs = model_inputs(batch, width, device, with_audio=inner.pre_process)
        if inner.training and "audio_features" in inputs:
            inputs["audio_seeds"] = clip_seeds(batch["audio_clip_keys"], self.seed)
        samples = []
        if self.ctc_weight > 0 and inner.training and "audio_features" in inputs:
            per_clip = ctc_samples(batch, self.special_ids)
            samples = [(s[0], s[1], int(s[1].sum())) for s in per_clip if isinstance(s, tuple)]
            if samples:
                inputs["ctc_targets"] = [s[2] if isinstance(s, tuple) else s for s in per_clip]
        output = model(**inputs)
        if samples:
            output, ctc = output
            output = output + ctc_per_token(ctc, samples, tuple(output.shape), self.ctc_weight)
        if inner.post_process:  # per-token loss [rows, width] -> [rows, seq]
            return torch.nn.functional.pad(output, (0, seq - width))
        return output

    def _forward_context_parallel(self, model, inner, batch: dict) -> torch.Tensor:
        """This CP rank's share (ContextParallelBatches) -> its per-token loss [B, S / CP]."""
        from orchestrator.data.context_parallel import frame_index_within
        from orchestrator.data.mel import batch_features
        from orchestrator.data.packing import row_document_mask

        full, slots = batch["cp_unsplit"], batch["cp_slots"]
        device = next(model.parameters()).device
        width = slots.numel() * self.dims.cp
        inputs = dict(input_ids=batch["tokens"].to(device), position_ids=batch["position_ids"].to(device),
                      labels=batch["labels"].to(device), attention_mask=None)
        if full["packed"]:  # this rank's query rows of the row's document mask, keys in global order
            inputs["attention_mask"] = row_document_mask(full["position_ids"][:, :width], slots).to(device)
        samples = []
        if inner.pre_process and full["audio_lengths"].numel():
            clips = batch["audio_clips"]
            if self.ctc_weight > 0 and inner.training:
                held = torch.zeros(full["tokens"].shape, dtype=torch.bool)
                held[:, slots] = True
                per_clip = ctc_samples(full, self.special_ids)
                # A sample's CTC loss is spread over its trained tokens: a rank that trains
                # some of them needs that loss, hence the encoding of all the sample's clips.
                trains_here = [k for first, members in ctc_clip_groups(per_clip)
                               if bool((per_clip[first][1] & held[per_clip[first][0]]).any()) for k in members]
                clips = torch.unique(torch.cat([clips, torch.tensor(trains_here, dtype=torch.long)]))
                targets = [(per_clip[k][2] if isinstance(per_clip[k], tuple) else per_clip[k]) if k in trains_here
                           else None for k in clips.tolist()]
                samples = [(per_clip[k][0], per_clip[k][1][slots], int(per_clip[k][1].sum()))
                           for k in clips.tolist() if k in trains_here and isinstance(per_clip[k], tuple)]
                if samples:
                    inputs["ctc_targets"] = targets
            frames = frame_index_within(clips, batch["audio_frames"], full["audio_num_tokens"]) if clips.numel() else \
                torch.zeros(0, dtype=torch.long)
            check_routed_frames(batch["tokens"], self.audio_token_id, frames)
            if clips.numel():
                inputs.update(audio_features=batch_features(full, device, clips),
                              audio_lengths=full["audio_lengths"][clips].tolist(),
                              audio_seeds=clip_seeds(full["audio_clip_keys"][clips], self.seed) if inner.training
                              else None,
                              audio_frame_index=frames)
        output = model(**inputs)
        if samples:
            output, ctc = output
            output = output + ctc_per_token(ctc, samples, tuple(output.shape), self.ctc_weight)
        return output

    def flop_counter(self, trained: set):
        """Counts a loader micro-batch's FLOPs as the model computes them (decoder over its
        real tokens and documents, encoder over the clips present, adapter and CTC head;
        orchestrator.plan.step_flops), given the names of the parameters that train."""
        from orchestrator.plan.step_flops import StepFlops

        return StepFlops(self.model_cfg, self.lora_rank, self.recompute, self.padded_vocab_size, trained,
                         pp=self.dims.pp, vpp=self.dims.vpp).count


def clip_seeds(clip_keys: torch.Tensor, seed: int) -> List[int]:
    """Seed of each clip's training-time random draws (SpecAugment masks, adapter dropout):
    a hash of (training seed, data-parallel rank, sample position, clip number in the
    sample). It depends on the clip alone, not on the layout that encodes it: CP ranks
    encode different subsets of a micro-batch's clips and must mask a clip they share
    alike, and CP=2 then trains exactly as CP=1. Positions grow epoch after epoch, so a
    sample seen again is augmented anew."""
    import hashlib

    from megatron.core import parallel_state as ps

    dp_rank = ps.get_data_parallel_rank()
    return [int.from_bytes(hashlib.blake2b(f"{seed}/{dp_rank}/{position}/{clip}".encode(), digest_size=8).digest(),
                           "little") >> 1 for position, clip in clip_keys.tolist()]


def trimmed_width(batch: dict, dims) -> int:
    """Columns a micro-batch is cut to before the forward: up to its last used column,
    rounded up to a multiple of TP (sequence parallel splits the sequence over TP ranks)
    times 2*CP (the context-parallel chunks); the full length under pipeline
    parallelism, whose schedule sends fixed [S, B, hidden] tensors between stages."""
    from orchestrator.data.packing import used_columns

    seq = batch["tokens"].shape[1]
    if dims.pp > 1:
        return seq
    cp = dims.cp
    multiple = dims.tp * (2 * cp if cp > 1 else 1)
    return min(seq, -(-used_columns(batch) // multiple) * multiple)


def model_inputs(batch: dict, width: int, device, with_audio: bool = True) -> dict:
    """AudioLLM.forward arguments for the first `width` columns of a loader micro-batch:
    rows as they are, a per-row document mask for packed rows, and the clips with the
    row each belongs to."""
    from orchestrator.data.mel import batch_features
    from orchestrator.data.packing import row_document_mask

    tokens, labels, positions = (batch[k][:, :width].to(device) for k in ("tokens", "labels", "position_ids"))
    inputs = dict(input_ids=tokens, position_ids=positions, labels=labels,
                  attention_mask=row_document_mask(positions) if batch["packed"] else None)
    if with_audio and batch["audio_lengths"].numel():
        # Lengths and rows as host lists: the model reads them without touching device memory.
        inputs.update(audio_features=batch_features(batch, device), audio_lengths=batch["audio_lengths"].tolist(),
                      audio_clip_rows=batch["audio_clip_rows"].tolist())
    return inputs


def ctc_samples(batch: dict, special_ids: set) -> list:
    """(row, trained positions [S] bool, transcript token ids) of each clip's sample, in
    clip order; None for a clip whose sample is not its transcript (audio_clip_ctc: a
    dataset of another task, a conversation); JOINS_PREVIOUS for the later windows of a
    recording cut into several (data.long_audio=chunk: one transcript over all of its
    windows). A sample is a document of its row (positions restart at 0 at each); its
    transcript is its trained labels without special tokens (end of turn, eos)."""
    tokens, labels = batch["tokens"], batch["labels"]
    trained = batch["loss_mask"] > 0
    documents = torch.cumsum(batch["position_ids"] == 0, dim=1)
    rows = batch["audio_clip_rows"].tolist()
    per_clip = batch["audio_num_tokens"].tolist()
    audio_id = int(batch["audio_token_id"])
    ctc = batch["audio_clip_ctc"].tolist() if "audio_clip_ctc" in batch else [True] * len(rows)
    placeholders = {r: (tokens[r] == audio_id).nonzero().flatten().tolist() for r in set(rows)}
    used = {r: 0 for r in placeholders}
    samples, seen, previous = [], set(), None
    for row, count, wanted in zip(rows, per_clip, ctc):
        first = placeholders[row][used[row]]
        used[row] += count
        if not wanted:
            samples.append(None)
            previous = None
            continue
        document = int(documents[row, first])
        if (row, document) == previous:  # the next window of the same recording
            samples.append(JOINS_PREVIOUS)
            continue
        if (row, document) in seen:
            raise ValueError(f"row {row}: a sample whose audio clips are not one after another; the auxiliary CTC "
                             f"loss (model.adapter.ctc_weight) aligns its transcript over its clips in order")
        seen.add((row, document))
        previous = (row, document)
        positions = trained[row] & (documents[row] == document)
        targets = [int(t) for t in labels[row][positions].tolist() if int(t) not in special_ids]
        samples.append((row, positions, targets))
    return samples


def ctc_clip_groups(per_clip: list) -> list:
    """(first clip, all its clips) of each sample with a CTC target in ctc_samples' list."""
    groups = []
    for k, entry in enumerate(per_clip):
        if isinstance(entry, tuple):
            groups.append((k, [k]))
        elif entry == JOINS_PREVIOUS:
            groups[-1][1].append(k)
    return groups


def ctc_per_token(ctc: torch.Tensor, shares: list, shape: tuple, weight: float) -> torch.Tensor:
    """`shape` [rows, width] to add to the per-token loss: `weight` x each clip's CTC loss
    spread evenly over its sample's trained tokens, so the loop's mean over trained
    tokens becomes LM loss + weight x CTC loss per trained token. `shares`: per clip with a
    CTC loss (the order of `ctc`), (row, trained positions of the row held here, count of
    the sample's trained tokens over the whole row); under context parallelism a rank
    holds part of the positions and the shares of all CP ranks add up to the clip's loss."""
    rows, width = shape
    per_row = [torch.zeros(width, dtype=ctc.dtype, device=ctc.device) for _ in range(rows)]
    for k, (row, positions, count) in enumerate(shares):
        share = positions[:width].to(device=ctc.device, dtype=ctc.dtype)
        per_row[row] = per_row[row] + share * (weight * ctc[k] / max(count, 1))
    return torch.stack(per_row)


class LoaderBatches:
    """BatchSource over the MDS training loader of this data-parallel rank; its state
    (sample position, pending packer buffer) is the loader's own."""

    def __init__(self, loader):
        self.loader = loader
        self.dataset_names = list(loader.names)

    def next_microbatch(self) -> dict:
        return next(self.loader)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def merge_states(self, states: list) -> dict:
        from orchestrator.data.loader import merge_rank_states

        return merge_rank_states(states)

    def sample_counts(self) -> dict:
        return self.loader.sample_counts()


class ValidationBatches:
    """BatchSource over all validation datasets, read round-robin (one batch of each in
    turn, so that even a few evaluation batches, train.eval_iters, cover every dataset),
    starting again when all are exhausted. `dataset_index` is remapped to this source's
    list of names. The state is the number of batches drawn, so the loop's restart
    (load_state_dict of the initial state) starts from the beginning."""

    def __init__(self, validation_sets: Dict[str, object]):
        if not validation_sets:
            raise ValueError("no validation datasets (data.validation is empty)")
        self.sets = list(validation_sets.values())
        self.dataset_names: List[str] = list(validation_sets)
        self.drawn = 0
        self._iter = None

    def _batches(self):
        while True:
            readers = {k: iter(vset) for k, vset in enumerate(self.sets)}
            drawn = 0
            while readers:
                for k in list(readers):
                    batch = next(readers[k], None)
                    if batch is None:
                        del readers[k]
                        continue
                    index = batch["dataset_index"]
                    batch["dataset_index"] = torch.where(index >= 0, torch.full_like(index, k), index)
                    drawn += 1
                    yield batch
            if not drawn:
                raise ValueError(f"the validation datasets {self.dataset_names} give this data-parallel rank no "
                                 f"batch: add samples or lower the data-parallel size")

    def next_microbatch(self) -> dict:
        if self._iter is None:
            self._iter = self._batches()
        self.drawn += 1
        return next(self._iter)

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self._iter = self._batches()
        self.drawn = 0
        for _ in range(int(state["drawn"])):
            self.next_microbatch()


class ContextParallelBatches:
    """BatchSource that gives this CP rank its share of another source's micro-batches:
    trimmed to `trimmed_width` columns, then split (orchestrator.data.context_parallel).
    Every rank of the CP group reads the same micro-batches (they share a data-parallel
    rank); the state is the wrapped source's."""

    def __init__(self, source, dims, cp_rank: int):
        self.source, self.dims, self.cp_rank = source, dims, cp_rank
        self.dataset_names = source.dataset_names

    def next_microbatch(self) -> dict:
        from orchestrator.data.context_parallel import PER_TOKEN_KEYS, split_batch

        batch = self.source.next_microbatch()
        width = trimmed_width(batch, self.dims)
        trimmed = {**batch, **{k: batch[k][:, :width] for k in PER_TOKEN_KEYS if k in batch}}
        share = split_batch(trimmed, self.dims.cp, self.cp_rank)
        share["cp_unsplit"] = batch  # the micro-batch as read (FLOP counts, CTC targets, packed documents)
        return share

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)

    def merge_states(self, states: list) -> dict:
        return self.source.merge_states(states)

    def sample_counts(self) -> dict:
        return self.source.sample_counts()


def for_context_parallel(source, dims):
    """`source` as this rank reads it: its context-parallel share under `dims.cp` > 1."""
    if dims.cp == 1:
        return source
    from megatron.core import parallel_state as ps

    return ContextParallelBatches(source, dims, ps.get_context_parallel_rank())


def build_audiollm_components(plan, dp_rank: int, dp_size: int):
    """Components for an AudioLLM plan: the provider, the train loader of this DP rank and
    (when data.validation lists datasets) the validation source. With data.replica_reader
    only one rank of each model replica builds the loaders and reads; the others receive
    its micro-batches (orchestrator/train/replica_reader.py)."""
    from orchestrator.data.loader import RankLoader, build_validation_loaders
    from orchestrator.train.loop import Components
    from orchestrator.train.replica_reader import ReplicaBatches, replica_group

    cfg = audiollm_config(plan)
    mbs = plan.micro_batch_size
    provider = AudioLLMProvider.from_plan(plan, cfg)
    replica = replica_group() if cfg.data.replica_reader else None
    reads = replica is None or replica[2]
    train_source = val = generation = loaders = None
    if reads:
        train = RankLoader(cfg.data, cfg.model.encoder, cfg.model.adapter, mbs, dp_rank, dp_size, cfg.data.seed,
                           cfg.data.canonical_nodes)
        train_source = LoaderBatches(train)
    if cfg.data.validation:
        if reads:
            # One set of validation loaders (one open validation mixture) serves the loss and generation.
            loaders = build_validation_loaders(cfg.data, cfg.model.encoder, cfg.model.adapter, mbs, dp_rank, dp_size)
            val = ValidationBatches(loaders)
        if cfg.train.eval_generation:
            from orchestrator.train.generation_eval import GenerationEvaluation

            generation = GenerationEvaluation(loaders or {}, cfg.data.tokenizer, cfg.train, replica)
    if replica is not None:
        group, reader, _ = replica
        train_source = ReplicaBatches(train_source, group, reader)
        val = ReplicaBatches(val, group, reader) if cfg.data.validation else None
    train_source = for_context_parallel(train_source, plan.dims)
    val = for_context_parallel(val, plan.dims) if val is not None else None
    return Components(provider=provider, train_source=train_source, val_source=val, generation_eval=generation)
