"""Greedy decoding with the AudioLLM on one process (tp = pp = 1), batched over clips.

    from orchestrator.models.generate import greedy_generate
    ids = greedy_generate(model, prompts, audio_features, audio_lengths, stop_ids=[eos, end_of_turn],
                          max_new_tokens=32, pad_id=pad)     # list of generated id lists

Each prompt is a list of token ids holding its clips' audio placeholders (the data
side's prompt: bos, user turn with <audio> x n, model turn opener). Prompts are
right-padded into one [b, L] batch; with causal attention a row's logits at its last
real position do not see the padding after it, so no attention mask is needed.

No KV cache: every step re-runs the decoder over the whole (short) sequence. The
encoder and adapter run once; the audio embeddings are scattered into the token
embeddings again at every step. A row stops at the first stop id (not included in
the output) or after `max_new_tokens`; decoding ends when every row has stopped.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from orchestrator.models.fusion import check_audio_placeholders, fuse_audio


@torch.no_grad()
def greedy_generate(model, prompts: Sequence[Sequence[int]], audio_features: Optional[torch.Tensor],
                    audio_lengths: Optional[Sequence[int]], stop_ids: Sequence[int], max_new_tokens: int = 32,
                    pad_id: int = 0, audio_clip_rows: Optional[Sequence[int]] = None) -> List[List[int]]:
    """Greedy continuation of each prompt. `audio_features` [clips, mel, frames] and
    `audio_lengths` belong to the placeholders of the prompts in order; `audio_clip_rows`
    gives each clip's prompt index (default: clip i belongs to prompt i)."""
    if not prompts:
        return []
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be >= 1")
    if not stop_ids:
        raise ValueError("stop_ids is empty: give the end-of-turn and/or eos token ids")
    if not (model.pre_process and model.post_process):
        raise ValueError("greedy_generate needs the whole model on one process (pipeline size 1)")
    if model.config.tensor_model_parallel_size != 1:
        raise ValueError(f"greedy_generate runs with tensor_model_parallel_size 1 "
                         f"(got {model.config.tensor_model_parallel_size})")
    was_training = model.training
    model.eval()
    try:
        return _decode(model, prompts, audio_features, audio_lengths, stop_ids, max_new_tokens, pad_id,
                       audio_clip_rows)
    finally:
        model.train(was_training)


def _decode(model, prompts, audio_features, audio_lengths, stop_ids, max_new_tokens, pad_id, audio_clip_rows):
    lm = model.language_model
    device = lm.embedding.word_embeddings.weight.device
    b = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    if int(lengths.min()) < 1:
        raise ValueError("every prompt needs at least one token")
    total = int(lengths.max()) + max_new_tokens
    tokens = torch.full((b, total), int(pad_id), dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    tokens = tokens.to(device)
    audio = per_clip = None
    if audio_features is not None:
        clip_lengths = [int(n) for n in audio_lengths]
        audio = model.audio_embeddings(audio_features.to(device), clip_lengths)
        per_clip = [model.adapter_tokens(n) for n in clip_lengths]
    stop = torch.tensor(sorted(set(int(s) for s in stop_ids)), device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    cur = lengths.clone().to(device)
    rows = torch.arange(b, device=device)
    out: List[List[int]] = [[] for _ in range(b)]
    for _ in range(max_new_tokens):
        width = int(cur.max())
        ids = tokens[:, :width]
        embeddings = lm.embed_tokens(ids)
        check_audio_placeholders(ids, model.audio_token_id, per_clip if audio is not None else [],
                                 audio_clip_rows if audio is not None else None)
        if audio is not None:
            embeddings = fuse_audio(embeddings, ids, audio, model.audio_token_id)
        positions = torch.arange(width, device=device).unsqueeze(0).expand(b, -1)
        logits = lm(ids, positions, None, decoder_input=lm.scale_embeddings(embeddings))  # [b, s, v]
        nxt = logits[rows, cur - 1].argmax(dim=-1)
        finished = torch.isin(nxt, stop) | done
        for i in torch.nonzero(~finished).flatten().tolist():
            out[i].append(int(nxt[i]))
        tokens[rows, cur] = torch.where(finished, torch.full_like(nxt, int(pad_id)), nxt)
        done = finished
        if bool(done.all()):
            break
        cur = cur + (~done).long()
    return out
