"""Greedy decoding with the AudioLLM, batched over prompts, at the training layout.

    from orchestrator.models.generate import greedy_generate
    ids = greedy_generate(model, prompts, audio_features, audio_lengths, stop_ids=[eos, end_of_turn],
                          max_new_tokens=32, pad_id=pad)     # list of generated id lists

`model` is this rank's AudioLLM chunk (the whole model at pipeline size 1). Every rank
of a model replica -- its tensor- and pipeline-parallel peers -- calls it with the same
arguments and gets the same tokens. Each prompt is a list of token ids holding its
clips' audio placeholders (the data side's prompt: bos, user turn with <audio> x n,
model turn opener). A row stops at the first of its stop ids (not included in the
output; `stop_ids` is one list for all rows or one list per row) or after
`max_new_tokens`; decoding ends when every row has stopped.

With the KV cache (`use_cache=True`, orchestrator.models.kv_cache): the encoder and
adapter run once and the audio embeddings are fused once, in one prefill forward over
the padded prompts (`padding_side` left or right: each row keeps its own positions, so
the tokens do not depend on it); then one forward per new token, each attending to the
cache. Layouts:
- tensor parallel: each rank holds its heads' cache; the greedy token is the argmax
  over the vocabulary shards (ties: the lowest id, as one argmax over the whole);
- pipeline parallel: each stage passes the hidden states of the new columns to the
  next one every step (point-to-point), and the last stage broadcasts the new tokens
  to the pipeline;
- sequence parallel: off while decoding (kv_cache.decoding);
- context parallel: a context-parallel rank holds the whole model's weights of its
  pipeline stage and decodes whole rows alone; the caller gives it its own prompts.
Virtual pipeline chunks are not supported.

Joint CTC/attention decoding (`ctc_weight` > 0; orchestrator/models/ctc_prefix.py): the
rows that transcribe their clips (`ctc_rows`) choose each token among the decoder's
JOINT_CANDIDATES most likely by (1 - w) * the decoder's log-probability + w * the gain
of the adapter's CTC prefix score (model.adapter.ctc_weight > 0 gives the head); the
other rows stay greedy. At pipeline size 1 (the CTC head lives on the first stage, the
token is chosen on the last; training with the CTC loss needs pp = 1 too).

Without the cache (`use_cache=False`, tp = pp = 1 only): every step re-runs the
training forward over the whole right-padded sequence -- the slow reference that the
cached path is tested against.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from orchestrator.models.ctc_prefix import CTCPrefixScorer
from orchestrator.models.fusion import check_audio_placeholders, fuse_audio
from orchestrator.models.kv_cache import KVCache, decoding

StopIds = Union[Sequence[int], Sequence[Sequence[int]]]
PADDING_SIDES = ("left", "right")
# Joint CTC/attention decoding rescores this many of the decoder's most likely tokens at
# each step (a "pre-beam", as ESPnet's decoders do): the CTC prefix score is computed for
# these only.
JOINT_CANDIDATES = 6


@torch.no_grad()
def greedy_generate(model, prompts: Sequence[Sequence[int]], audio_features: Optional[torch.Tensor],
                    audio_lengths: Optional[Sequence[int]], stop_ids: StopIds, max_new_tokens: int = 32,
                    pad_id: int = 0, audio_clip_rows: Optional[Sequence[int]] = None, use_cache: bool = True,
                    padding_side: str = "left", ctc_weight: float = 0.0,
                    ctc_rows: Optional[Sequence[bool]] = None) -> List[List[int]]:
    """Greedy continuation of each prompt. `audio_features` [clips, mel, frames] and
    `audio_lengths` belong to the placeholders of the prompts in order; `audio_clip_rows`
    gives each clip's prompt index (default: clip i belongs to prompt i). `ctc_weight` > 0:
    joint CTC/attention decoding of the rows marked in `ctc_rows` (default: every row
    with clips), whose answer is their clips' transcript."""
    if not prompts:
        return []
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be >= 1")
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side={padding_side!r} is not one of {PADDING_SIDES}")
    if min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token")
    config = model.language_model.config
    if (config.virtual_pipeline_model_parallel_size or 1) > 1:
        raise ValueError("greedy_generate does not run with virtual pipeline chunks (parallel.vpp)")
    if not use_cache and not (model.pre_process and model.post_process and config.tensor_model_parallel_size == 1):
        raise ValueError(f"decoding without the KV cache runs at tensor and pipeline size 1 (got tp "
                         f"{config.tensor_model_parallel_size}, pp {config.pipeline_model_parallel_size}); "
                         f"use_cache=True decodes at any layout")
    stops = _stop_table(stop_ids, len(prompts))
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight={ctc_weight} must be within [0, 1]")
    if ctc_weight > 0:
        if not (model.pre_process and model.post_process):
            raise ValueError(f"joint CTC/attention decoding (ctc_weight={ctc_weight}) runs at pipeline size 1: the "
                             f"CTC head is on the first stage and the tokens are chosen on the last (got pp "
                             f"{config.pipeline_model_parallel_size}); decode at --pp 1 or with ctc_weight 0")
        if model.adapter.ctc_head is None:
            raise ValueError(f"joint CTC/attention decoding (ctc_weight={ctc_weight}) needs the adapter's CTC head, "
                             f"which only a model trained with model.adapter.ctc_weight > 0 has; use ctc_weight 0")
        if ctc_rows is not None and len(ctc_rows) != len(prompts):
            raise ValueError(f"{len(ctc_rows)} ctc_rows for {len(prompts)} prompts")
    joint = (ctc_weight, ctc_rows) if ctc_weight > 0 else None
    was_training = model.training
    model.eval()
    try:
        run = _decode_cached if use_cache else _decode_uncached
        return run(model, prompts, audio_features, audio_lengths, stops, max_new_tokens, int(pad_id),
                   audio_clip_rows, padding_side, joint)
    finally:
        model.train(was_training)


def _stop_table(stop_ids: StopIds, rows: int) -> torch.Tensor:
    """[rows, n] stop ids (-1: none), from one list for all rows or one list per row."""
    if not stop_ids:
        raise ValueError("stop_ids is empty: give the end-of-turn and/or eos token ids")
    per_row = [list(s) for s in stop_ids] if isinstance(stop_ids[0], (list, tuple)) else [list(stop_ids)] * rows
    if len(per_row) != rows:
        raise ValueError(f"{len(per_row)} lists of stop ids for {rows} prompts: give one list, or one per prompt")
    if any(not s for s in per_row):
        raise ValueError("a prompt has no stop ids: give each at least its end-of-turn or eos id")
    width = max(len(s) for s in per_row)
    return torch.tensor([[int(x) for x in s] + [-1] * (width - len(s)) for s in per_row], dtype=torch.long)


def _device(model) -> torch.device:
    return next(model.language_model.parameters()).device


def _padded(prompts, pad_id: int, side: str):
    """[b, L] ids, real-token mask, each column's position in its row, each row's last column."""
    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    real = torch.zeros((b, width), dtype=torch.bool)
    positions = torch.zeros((b, width), dtype=torch.long)
    last = torch.empty(b, dtype=torch.long)
    for i, p in enumerate(prompts):
        start = width - len(p) if side == "left" else 0
        ids[i, start:start + len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        real[i, start:start + len(p)] = True
        positions[i, start:start + len(p)] = torch.arange(len(p))
        last[i] = start + len(p) - 1
    return ids, real, positions, last


def _prompt_audio(model, ids, audio_features, audio_lengths, audio_clip_rows, device):
    """The adapter's output for the prompts' clips (first stage), after checking that the
    placeholders of `ids` take whole clips in order; None without audio."""
    if not model.pre_process:
        return None
    if audio_features is None:
        check_audio_placeholders(ids, model.audio_token_id, [])  # placeholders without audio
        return None
    lengths = [int(n) for n in audio_lengths]
    check_audio_placeholders(ids, model.audio_token_id, [model.adapter_tokens(n) for n in lengths], audio_clip_rows)
    return model.audio_embeddings(audio_features.to(device), lengths)


def vocab_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[b, vocab shard] logits -> [b] ids of the maximum over the whole (tensor-parallel)
    vocabulary. Ties go to the lowest id, as one argmax over the unsplit vocabulary."""
    from megatron.core import parallel_state as ps

    index = logits.argmax(dim=-1)
    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return index
    values = logits.gather(-1, index[:, None])[:, 0]
    index = index + ps.get_tensor_model_parallel_rank() * logits.shape[-1]
    group = ps.get_tensor_model_parallel_group()
    all_values, all_index = [torch.empty_like(values) for _ in range(tp)], [torch.empty_like(index) for _ in range(tp)]
    dist.all_gather(all_values, values, group=group)
    dist.all_gather(all_index, index, group=group)
    best = torch.stack(all_values).argmax(dim=0)  # first maximum: the lowest rank holds the lowest ids
    return torch.stack(all_index).gather(0, best[None])[0]


def vocab_top(logits: torch.Tensor, k: int):
    """[b, vocab shard] logits -> the k most likely ids over the whole (tensor-parallel)
    vocabulary [b, k] and their log-probabilities [b, k], most likely first."""
    from megatron.core import parallel_state as ps

    logits = logits.float()
    tp = ps.get_tensor_model_parallel_world_size()
    group = ps.get_tensor_model_parallel_group() if tp > 1 else None
    peak = logits.max(dim=-1).values
    if tp > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    mass = (logits - peak[:, None]).exp().sum(dim=-1)
    if tp > 1:
        dist.all_reduce(mass, group=group)
    values, index = logits.topk(min(k, logits.shape[-1]), dim=-1)
    if tp > 1:
        index = index + ps.get_tensor_model_parallel_rank() * logits.shape[-1]
        all_values, all_index = [torch.empty_like(values) for _ in range(tp)], [torch.empty_like(index) for _ in range(tp)]
        dist.all_gather(all_values, values, group=group)
        dist.all_gather(all_index, index, group=group)
        values, best = torch.cat(all_values, dim=-1).topk(k, dim=-1)
        index = torch.cat(all_index, dim=-1).gather(-1, best)
    return values - (peak + mass.log())[:, None], index


class _JointCTC:
    """Joint CTC/attention choice of each row's next token (the module's docstring)."""

    def __init__(self, model, audio, audio_lengths, audio_clip_rows, rows: int, weight: float, ctc_rows, stops):
        per_clip = [model.adapter_tokens(int(n)) for n in audio_lengths]
        log_probs = torch.log_softmax(model.adapter.ctc_head(audio).float(), dim=-1).split(per_clip)
        owner = list(audio_clip_rows) if audio_clip_rows is not None else list(range(len(per_clip)))
        pieces = [[] for _ in range(rows)]
        for clip, row in enumerate(owner):
            pieces[row].append(log_probs[clip])
        wanted = [True] * rows if ctc_rows is None else [bool(r) for r in ctc_rows]
        self.rows = torch.tensor([wanted[r] and bool(pieces[r]) for r in range(rows)], device=audio.device)
        empty = log_probs[0].new_zeros((0, log_probs[0].shape[-1]))
        scored = [torch.cat(pieces[r]) if bool(self.rows[r]) else empty for r in range(rows)]
        self.scorer = CTCPrefixScorer(torch.nn.utils.rnn.pad_sequence(scored, batch_first=True),
                                      torch.tensor([len(x) for x in scored], device=audio.device))
        self.weight, self.stops = weight, stops

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, vocab shard] final logits -> [b] tokens; advances the CTC prefixes."""
        greedy = vocab_argmax(logits)
        log_probs, candidates = vocab_top(logits, JOINT_CANDIDATES)
        extended = self.scorer.extend(candidates)
        ends = (candidates[:, :, None] == self.stops[:, None, :]).any(dim=-1)
        gain = torch.where(ends, self.scorer.complete()[:, None], extended[0]) - self.scorer.prefix[:, None]
        choice = ((1 - self.weight) * log_probs + self.weight * gain).argmax(dim=-1)
        rows = torch.arange(len(choice), device=choice.device)
        self.scorer.advance(candidates, choice, extended, keep=self.rows & ~ends[rows, choice])
        return torch.where(self.rows, candidates[rows, choice], greedy)


class _Pipeline:
    """Point-to-point hand-over of the new columns' hidden states between pipeline
    stages, and the last stage's tokens to every stage."""

    def __init__(self, model):
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.size = ps.get_pipeline_model_parallel_world_size()
        self.dtype = model.language_model.config.pipeline_dtype or model.language_model.config.params_dtype
        self.hidden = model.language_model.config.hidden_size

    def receive(self, columns: int, rows: int, device) -> torch.Tensor:
        buffer = torch.empty((columns, rows, self.hidden), dtype=self.dtype, device=device)
        dist.recv(buffer, src=self.ps.get_pipeline_model_parallel_prev_rank())
        return buffer

    def send(self, hidden: torch.Tensor) -> None:
        dist.send(hidden.to(self.dtype).contiguous(), dst=self.ps.get_pipeline_model_parallel_next_rank())

    def share_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.broadcast(tokens, src=self.ps.get_pipeline_model_parallel_last_rank(),
                           group=self.ps.get_pipeline_model_parallel_group())
        return tokens


def _decode_cached(model, prompts, audio_features, audio_lengths, stops, max_new_tokens, pad_id, audio_clip_rows,
                   padding_side, joint):
    lm = model.language_model
    device = _device(model)
    pipeline = _Pipeline(model)
    b = len(prompts)
    ids, real, positions, last = _padded(prompts, pad_id, padding_side)
    audio = _prompt_audio(model, ids, audio_features, audio_lengths, audio_clip_rows, device)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    ids, real, positions, last = (t.to(device) for t in (ids, real, positions, last))
    stops = stops.to(device)
    chooser = _chooser(model, audio, audio_lengths, audio_clip_rows, b, joint, stops)
    inv_freqs = tuple(None if f is None else f.to(device) for f in lm.rotary_inv_freqs())
    rows = torch.arange(b, device=device)
    cache = KVCache(capacity=ids.shape[1] + max_new_tokens)

    def forward(step_ids, step_positions, step_real, step_last, step_audio=None):
        """One decoder forward of this stage over the new columns; the new tokens on every stage."""
        cache.begin(step_positions, step_real, inv_freqs)
        columns = step_positions.shape[1]
        if lm.pre_process:
            embeddings = lm.embed_tokens(step_ids)
            if step_audio is not None:
                embeddings = fuse_audio(embeddings, step_ids, step_audio, model.audio_token_id)
            hidden = lm.scale_embeddings(embeddings)  # [s, b, h]; no split: sequence parallel is off
        else:
            hidden = pipeline.receive(columns, b, device)
            lm.set_input_tensor(hidden)
        out = lm.decoder(hidden_states=hidden, attention_mask=None)
        tokens = torch.empty(b, dtype=torch.long, device=device)
        if lm.post_process:
            tokens = chooser(_last_logits(lm, out[step_last, rows]))
        else:
            pipeline.send(out)
        return pipeline.share_tokens(tokens)

    out: List[List[int]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool, device=device)
    with decoding(lm, cache):
        try:
            nxt = forward(ids, positions, real, last, audio)
            for step in range(max_new_tokens):
                done = done | (nxt[:, None] == stops).any(dim=1)
                for i in torch.nonzero(~done).flatten().tolist():
                    out[i].append(int(nxt[i]))
                if bool(done.all()) or step == max_new_tokens - 1:
                    break
                column = torch.where(done, torch.full_like(nxt, pad_id), nxt)[:, None]
                nxt = forward(column, (lengths + step)[:, None], torch.ones_like(column, dtype=torch.bool),
                              torch.zeros_like(lengths))
        finally:
            if not lm.pre_process:
                lm.set_input_tensor(None)
    return out


def _chooser(model, audio, audio_lengths, audio_clip_rows, rows: int, joint, stops):
    """The last stage's choice of the next tokens from [b, vocab shard] logits: greedy, or
    joint CTC/attention (`joint`: (weight, ctc_rows)) where any row transcribes audio."""
    if joint is None or audio is None:
        return vocab_argmax
    chosen = _JointCTC(model, audio, audio_lengths, audio_clip_rows, rows, joint[0], joint[1], stops)
    return chosen.choose if bool(chosen.rows.any()) else vocab_argmax


def _last_logits(lm, hidden: torch.Tensor) -> torch.Tensor:
    """[b, h] final hidden states (after the last norm) -> [b, vocab shard] logits through
    the output layer and the final softcap (the last stage)."""
    weight = lm.shared_embedding_or_output_weight() if lm.share_embeddings_and_output_weights else None
    logits, _ = lm.output_layer(hidden[None], weight=weight)  # [1, b, vocab shard]
    return lm.cap_logits(logits[0])


def _decode_uncached(model, prompts, audio_features, audio_lengths, stops, max_new_tokens, pad_id,
                     audio_clip_rows, padding_side, joint):
    """Right-padded prompts; with causal attention a row's logits at its last real
    position do not see the padding after it, so no attention mask is needed."""
    lm = model.language_model
    device = _device(model)
    b = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    total = int(lengths.max()) + max_new_tokens
    tokens = torch.full((b, total), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    audio = _prompt_audio(model, tokens, audio_features, audio_lengths, audio_clip_rows, device)
    tokens = tokens.to(device)
    stops = stops.to(device)
    chooser = _chooser(model, audio, audio_lengths, audio_clip_rows, b, joint, stops)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    cur = lengths.clone().to(device)
    rows = torch.arange(b, device=device)
    out: List[List[int]] = [[] for _ in range(b)]
    for _ in range(max_new_tokens):
        width = int(cur.max())
        ids = tokens[:, :width]
        embeddings = lm.embed_tokens(ids)
        if audio is not None:
            embeddings = fuse_audio(embeddings, ids, audio, model.audio_token_id)
        positions = torch.arange(width, device=device).unsqueeze(0).expand(b, -1)
        logits = lm(ids, positions, None, decoder_input=lm.scale_embeddings(embeddings))  # [b, s, v]
        nxt = chooser(logits[rows, cur - 1])
        finished = (nxt[:, None] == stops).any(dim=1) | done
        for i in torch.nonzero(~finished).flatten().tolist():
            out[i].append(int(nxt[i]))
        tokens[rows, cur] = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        done = finished
        if bool(done.all()):
            break
        cur = cur + (~done).long()
    return out
