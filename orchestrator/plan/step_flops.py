"""FLOPs of an AudioLLM training step, counted from the micro-batches it ran.

`StepFlops(model, ...).count(batch)` gives one micro-batch's model FLOPs (for MFU),
hardware FLOPs (for HFU), real tokens and token slots; the loop sums them over the
step's micro-batches and the data-parallel ranks. The plan's estimate
(orchestrator/plan/estimate.py) uses the same arithmetic on a planned step (every row full,
every clip at data.max_audio_seconds), so prediction and measurement differ only by
what the batches held; hence no module-level torch import here.

Conventions (one multiply-add = 2 FLOPs; matmuls only: norms, activations, softmax,
RoPE, the embedding lookup, the loss and the optimizer are left out, well under 1%):

- Tokens are the real tokens of the rows (`num_tokens`; `dataset_index` >= 0), not the
  padding slots. The decoder's linears and the logits count per real token.
- Decoder attention: every packed document attends causally to itself, so a document
  of n tokens has n(n+1)/2 (query, key) pairs, and on sliding-window layers (Gemma2:
  even 0-based index) query i sees min(i+1, W) keys; a pair costs 2 x heads x head_dim
  FLOPs for QK^T and as much for attention x V. That is the causal convention of
  NVIDIA's current FLOP formulas (Megatron-Bridge / NeMo `causal_self_attn`: 0.5 s^2
  per sequence) and of FlashAttention's benchmarks, applied per document. PaLM's
  6N + 12LHQT and older Megatron-LM count the full s^2 square of the whole row, which
  for packed rows includes cross-document pairs that are masked out and contribute
  nothing: those numbers run ~2x higher on attention.
- Encoder (bidirectional): per clip in the batch, T positions and T^2 pairs, with
  T = the clip's own encoder frames when model.encoder.mask_padding is on (the model
  needs only those), otherwise the whole window (max_source_positions; the 30-s Whisper
  window is what the pretrained encoder computes on every clip). conv1 counts per mel
  frame (2T), conv2 and the layers per position.
- Adapter: its linears per audio token (adapter output token; the kind's, adapter_kinds.linear_shapes); the CTC head
  (model.adapter.ctc_weight > 0, training only) a linear to vocabulary + blank per
  audio token.
- Backward, per matmul in forward order: the weight gradient (as many FLOPs as the
  forward) when its weight trains, the input gradient (as many) when anything before
  it trains (gradients must pass through it); core attention (no weights) 2x forward
  when anything before it trains. LoRA (rank r on a [out, in] linear): forward
  2r(in+out); backward the two weight gradients, the gradient through B, and the one
  through A when something before trains. So a fully trained stack costs 3x forward
  (the 6N rule), a LoRA-adapted decoder with frozen embeddings about 2x forward (its
  frozen weights' gradients are never computed), and a frozen encoder with nothing
  trained before it costs its forward only. "Trains" is read from the parameters
  that require gradients (after LoRA, model freezes and lr_scale-0 groups).
- Hardware FLOPs = model FLOPs + recomputation: full recompute adds a second forward
  of each recomputed decoder layer (uniform: every layer; block: the first
  recompute_num_layers layers of every pipeline (virtual) stage), selective adds the
  core attention's forward of every layer; only layers that run a backward recompute.
  Work spent on padding (tail slots of rows, masked-out scores the local attention
  backend still computes, encoder frames past a clip up to the batch's longest clip
  in masked mode) is counted in neither: it shows as lower MFU/HFU and in
  `tokens/utilization`.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Optional

from orchestrator.plan.adapter_kinds import adapter_kind, linear_shapes
from orchestrator.plan.model_params import encoder_frame_count, model_name

# The quantities a micro-batch is counted in; FLOPs = sum of items x coefficients.
KINDS = ("token", "pair_full", "pair_window", "mel_frame", "enc_position", "enc_pair", "audio_token")


def parameter_pattern(name: str) -> str:
    """A parameter name with layer numbers replaced by `*` (and DDP/Float16Module
    `module.` prefixes dropped): every layer shares one pattern, and pipeline stages'
    local layer numbers do not matter."""
    return re.sub(r"\.\d+(?=\.)", ".*", model_name(name))


def causal_pairs(n: int, window: Optional[int] = None) -> int:
    """(query, key) pairs of causal attention over n tokens; with a window W (current
    token included) query i sees min(i+1, W) keys."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def recomputed_layers(num_layers: int, granularity: Optional[str], method: Optional[str],
                      recompute_num_layers: Optional[int], pp: int = 1, vpp: Optional[int] = None) -> set:
    """Decoder layers (0-based, global) that full recomputation runs forward twice.
    Layers are split in pp x vpp contiguous chunks; `block` recomputes the first
    recompute_num_layers of each chunk, `uniform` every layer (in groups)."""
    if granularity != "full":
        return set()
    if method != "block" or recompute_num_layers is None:
        return set(range(num_layers))
    chunks = max(1, pp) * (vpp or 1)
    per_chunk = num_layers // chunks
    return {c * per_chunk + j for c in range(chunks) for j in range(min(recompute_num_layers, per_chunk))}


def real_tokens(batch: dict) -> int:
    """Tokens of a micro-batch that belong to a sample (not padding slots): the loader's
    `num_tokens`, else the slots with a dataset (`dataset_index` >= 0)."""
    if "num_tokens" in batch:
        return int(batch["num_tokens"])
    return int((batch["dataset_index"] >= 0).sum())


class _Scan:
    """Walks the model's matmuls in forward order, keeping whether anything before the
    current one trains (then gradients flow through it), and adds each one's forward,
    backward and recompute FLOPs per item to `coef[kind]`."""

    def __init__(self, trained: set, lora_rank: int):
        self.trained, self.rank = trained, lora_rank
        self.upstream = False
        self.coef = {kind: [0.0, 0.0, 0.0] for kind in KINDS}  # forward, backward, recompute

    def marker(self, *patterns: str) -> None:
        """Parameters without matmul FLOPs (norms, mixing weights, embeddings): if they
        train, gradients must reach them."""
        if any(p in self.trained for p in patterns):
            self.upstream = True

    def linear(self, kind: str, prefix: str, n_in: int, n_out: int, weight: Optional[str] = None,
               lora: bool = True, upstream: Optional[bool] = None) -> tuple:
        """A linear [n_out, n_in] per item of `kind` (LoRA on it when its lora_a/lora_b
        train). Returns (forward, backward) per item; `upstream` overrides the running
        flag (a branch such as the CTC head), and then the flag is left as it was."""
        flows = self.upstream if upstream is None else upstream
        forward = 2.0 * n_in * n_out
        weight_trains = (weight or f"{prefix}.weight") in self.trained
        backward = forward * (int(weight_trains) + int(flows))
        adapted = lora and self.rank > 0 and any(f"{prefix}.lora_{ab}.weight" in self.trained for ab in "ab")
        if adapted:
            r = self.rank
            forward += 2.0 * r * (n_in + n_out)
            # dB and the gradient through B always; dA always; the gradient through A if needed
            backward += 2.0 * r * n_out * 2 + 2.0 * r * n_in * (1 + int(flows))
        if upstream is None:
            self.upstream = flows or weight_trains or adapted
        self.add(kind, forward, backward)
        return forward, backward

    def attention(self, kind: str, width: int) -> tuple:
        """Core attention per (query, key) pair: QK^T and attention x V over `width` =
        heads x head_dim; its backward is 2x forward when gradients flow through it."""
        forward = 4.0 * width
        backward = 2 * forward if self.upstream else 0.0
        self.add(kind, forward, backward)
        return forward, backward

    def add(self, kind: str, forward: float, backward: float, recompute: float = 0.0) -> None:
        c = self.coef[kind]
        c[0] += forward
        c[1] += backward
        c[2] += recompute


class StepFlops:
    """FLOPs of AudioLLM micro-batches (see the module docstring).

    model: the `model` config section (schema.ModelConfig or alike); lora_rank: lora.rank;
    recompute: parallel.recompute (granularity, method, num_layers); pp/vpp: pipeline
    layout (block recompute is per stage); padded_vocab: the output layer's width;
    trained: names (or `parameter_pattern`s) of the parameters that train."""

    def __init__(self, model, lora_rank: int, recompute, padded_vocab: int, trained: Iterable[str],
                 pp: int = 1, vpp: Optional[int] = None):
        enc, ada, dec = model.encoder, model.adapter, model.decoder
        self.mask_padding = bool(getattr(enc, "mask_padding", False))
        self.window_positions = int(enc.max_source_positions)
        self.sliding_window = int(dec.sliding_window) if dec.sliding_window else None
        self.trained = {parameter_pattern(n) for n in trained}
        scan = _Scan(self.trained, int(lora_rank or 0))

        # Encoder: conv stack, then the layers (pre-norm: norm, q/k/v, attention, out, norm, fc1, fc2).
        d, f = enc.d_model, enc.ffn_dim
        scan.linear("mel_frame", "encoder.conv1", 3 * enc.num_mel_bins, d, lora=False)
        scan.linear("enc_position", "encoder.conv2", 3 * d, d, lora=False)
        scan.marker("encoder.embed_positions.weight")
        for _ in range(enc.num_layers):
            layer = "encoder.layers.*"
            scan.marker(f"{layer}.self_attn_layer_norm.weight", f"{layer}.self_attn_layer_norm.bias")
            before = after = scan.upstream
            for proj in ("q_proj", "k_proj", "v_proj"):  # side by side: each reads the layer's input
                scan.upstream = before
                scan.linear("enc_position", f"{layer}.self_attn.{proj}", d, d)
                after = after or scan.upstream
            scan.upstream = after
            scan.attention("enc_pair", d)
            scan.linear("enc_position", f"{layer}.self_attn.out_proj", d, d)
            scan.marker(f"{layer}.final_layer_norm.weight", f"{layer}.final_layer_norm.bias")
            scan.linear("enc_position", f"{layer}.fc1", d, f)
            scan.linear("enc_position", f"{layer}.fc2", f, d)
        scan.marker("encoder.layer_norm.weight", "encoder.layer_norm.bias")

        # Adapter (orchestrator/plan/adapter_kinds.py): the layer mix and its norm where the
        # kind has them, then its linears per audio token; the CTC head branches off.
        h = dec.hidden_size
        if adapter_kind(ada).layer_mix:
            scan.marker("adapter.layer_weights", "adapter.norm.weight", "adapter.norm.bias")
        for name, out_dim, in_dim, _ in linear_shapes(ada, d, h):
            scan.linear("audio_token", f"adapter.{name}", in_dim, out_dim)
        if float(getattr(ada, "ctc_weight", 0.0) or 0.0) > 0:
            scan.linear("audio_token", "adapter.ctc_head", h, dec.vocab_size + 1, lora=False, upstream=scan.upstream)

        # Decoder: embedding, layers (Gemma2 sandwich norms), final norm, logits.
        q_width = dec.num_attention_heads * dec.kv_channels
        kv_width = dec.num_query_groups * dec.kv_channels
        scan.marker("language_model.embedding.word_embeddings.weight")
        granularity = getattr(recompute, "granularity", None) if recompute is not None else None
        full = recomputed_layers(dec.num_layers, granularity, getattr(recompute, "method", None),
                                 getattr(recompute, "num_layers", None), pp, vpp)
        layer = "language_model.decoder.layers.*"
        for i in range(dec.num_layers):
            pairs = "pair_window" if self.sliding_window and i % 2 == 0 else "pair_full"
            scan.marker(f"{layer}.input_layernorm.weight")
            qkv = scan.linear("token", f"{layer}.self_attention.linear_qkv", h, q_width + 2 * kv_width)
            attention = scan.attention(pairs, q_width)
            proj = scan.linear("token", f"{layer}.self_attention.linear_proj", q_width, h)
            scan.marker(f"{layer}.post_attention_layernorm.weight", f"{layer}.pre_mlp_layernorm.weight")
            fc1 = scan.linear("token", f"{layer}.mlp.linear_fc1", h, 2 * dec.ffn_hidden_size)
            fc2 = scan.linear("token", f"{layer}.mlp.linear_fc2", dec.ffn_hidden_size, h)
            scan.marker(f"{layer}.post_mlp_layernorm.weight")
            if not scan.upstream:  # no backward through this layer: nothing to recompute
                continue
            if i in full:
                scan.add("token", 0.0, 0.0, qkv[0] + proj[0] + fc1[0] + fc2[0])
                scan.add(pairs, 0.0, 0.0, attention[0])
            elif granularity == "selective" and attention[1] > 0:
                scan.add(pairs, 0.0, 0.0, attention[0])
        scan.marker("language_model.decoder.final_layernorm.weight")
        output = ("language_model.embedding.word_embeddings.weight" if dec.tie_embeddings
                  else "language_model.output_layer.weight")
        scan.linear("token", "language_model.output_layer", h, padded_vocab, weight=output, lora=False)
        self.coefficients = {kind: tuple(c) for kind, c in scan.coef.items()}

    # ---- items ---------------------------------------------------------------------
    def batch_items(self, batch: dict) -> dict:
        """How much of each kind a loader micro-batch (orchestrator.data.packing.collate)
        holds: real tokens, attention pairs of its documents, the encoder's mel frames,
        positions and pairs of its clips, and audio tokens."""
        import torch

        positions, index = batch["position_ids"], batch["dataset_index"]
        real = index >= 0
        # A document starts where positions restart at 0 (so does a row's tail padding,
        # which holds no real token); numbered apart per row, then real tokens counted.
        rows, width = positions.shape
        row_offset = (width + 1) * torch.arange(rows, device=positions.device)[:, None]
        documents = torch.cumsum(positions == 0, dim=1) + row_offset
        lengths = [n for n in documents[real].bincount().tolist() if n]
        clips = batch.get("audio_num_tokens")
        per_clip = [int(n) for n in clips.tolist()] if clips is not None else []
        if self.mask_padding and per_clip:
            mel = [int(n) for n in batch["audio_lengths"].tolist()]
        else:
            mel = [2 * self.window_positions] * len(per_clip)
        frames = [encoder_frame_count(n) for n in mel]
        return {
            "token": real_tokens(batch),
            "pair_full": sum(causal_pairs(n) for n in lengths),
            "pair_window": sum(causal_pairs(n, self.sliding_window) for n in lengths),
            "mel_frame": sum(mel), "enc_position": sum(frames), "enc_pair": sum(t * t for t in frames),
            "audio_token": sum(per_clip),
        }

    def flops(self, items: dict) -> dict:
        """{'model', 'hardware'} FLOPs of `items` (any kinds left out count 0)."""
        model = hardware = 0.0
        for kind, (forward, backward, recompute) in self.coefficients.items():
            n = float(items.get(kind, 0))
            model += n * (forward + backward)
            hardware += n * (forward + backward + recompute)
        return {"model": model, "hardware": hardware}

    def count(self, batch: dict) -> dict:
        """One micro-batch: {'model', 'hardware', 'tokens' (real), 'slots' (token slots)}."""
        items = self.batch_items(batch)
        return {**self.flops(items), "tokens": items["token"], "slots": int(math.prod(batch["tokens"].shape))}
