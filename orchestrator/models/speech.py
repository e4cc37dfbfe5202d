"""Speech side of the AudioLLM: HF Whisper encoder and the frame-stacking adapter.

Encoder window, two modes (`model.encoder.mask_padding`):

- false (Whisper's own behaviour, right for pretrained weights): HF `WhisperEncoder`
  runs on exactly 2*max_source_positions mel frames (3000 for 30-s Whisper), every
  frame attending to every other, padding included. Shorter inputs are padded on the
  right with `pad_value` up to that window. The best padding is the feature
  extractor's own (log-mel of zero audio), so the data side pads the waveform.
- true (for encoders trained from scratch on short clips): the encoder runs on the
  batch's longest clip (plus a few frames of the features' own padding, so the
  convolutions see the same edge for every clip) and each clip's frames attend only to
  that clip's frames. A clip's encoding is then the same whatever batch it is in and
  however long the window is, and no time is spent on padding.

Either way, padding frames are removed (per sample, by the true mel length) before
the adapter. Either way the layers are run here, one by one, not through HF's
`WhisperEncoder.forward(output_hidden_states=True)`: transformers 5 collects hidden
states with forward hooks on every layer and attention module that read a ContextVar,
which `torch.compile` cannot trace, so a compiled layer (`model.compile=layers`) would
break its graph on them (found on the first GPU run of the compiled layers).

Which encoder states are mixed: HF's `hidden_states` tuple holds num_layers+1 entries,
the convolution/position embedding and the residual stream after layers 1..N-1 (all
before any final norm), and last the output of layer N *after* the encoder's final
LayerNorm. The adapter mixes the N layer outputs, entries 1..N, as HF gives them: the
embedding entry (entry 0) carries no context, and the last entry is what Whisper's own
decoder reads. The adapter's LayerNorm after the mix evens out the scale difference
between the un-normalised entries and the normalised last one. Mixing weights start
at zero (a uniform average).
"""

from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence

import torch
from torch import nn

from orchestrator.plan.model_params import audio_token_count, encoder_frame_count  # noqa: F401  (re-exported)


def whisper_encoder_config(encoder, attention: str = "eager"):
    """HF WhisperConfig for the `model.encoder` section (`attention`: HF's attn_implementation)."""
    from transformers import WhisperConfig

    return WhisperConfig(
        d_model=encoder.d_model, encoder_layers=encoder.num_layers, encoder_attention_heads=encoder.num_heads,
        encoder_ffn_dim=encoder.ffn_dim, num_mel_bins=encoder.num_mel_bins,
        max_source_positions=encoder.max_source_positions, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, encoder_layerdrop=0.0, attn_implementation=attention,
        init_std=float(getattr(encoder, "init_std", 0.02)),
    )


def build_whisper_encoder(encoder, precision: str = "fp32", random_init: bool = True,
                          device: torch.device | str = "cpu") -> nn.Module:
    """`precision` (orchestrator.plan.kernels.encoder_precision): fp32 with HF's eager attention,
    or bf16 weights with PyTorch's SDPA. Weights are drawn in fp32 either way, on `device`
    (whisper-large-v3's draws take about 10 s on a 2-core host, well under one on a GPU,
    from its default generator, which every rank seeds alike); with `random_init` False,
    where a checkpoint overwrites every one of them (the encoder has no buffers), they are
    allocated and not drawn: built on the meta device, then given memory on `device`."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    bf16 = precision == "bf16"
    config = whisper_encoder_config(encoder, "sdpa" if bf16 else "eager")
    if not random_init:
        with torch.device("meta"):
            module = WhisperEncoder(config)
        module = module.to_empty(device=device)
    elif torch.device(device).type == "cpu":
        module = WhisperEncoder(config)
    else:
        with torch.device(device):
            module = WhisperEncoder(config)
    module = module.float()
    if bf16:
        module.to(torch.bfloat16)
    if encoder.freeze:
        module.requires_grad_(False)
    return module


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor made on the host, on `device` without stalling the host: on CUDA from
    pinned memory, asynchronously (a copy from pageable memory waits for the GPU's queue)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


# Mel frames kept after the longest clip in masked mode: conv1 (kernel 3) and conv2
# (kernel 3, stride 2) read up to 3 frames past a clip's last one.
_EDGE_FRAMES = 4


def run_encoder(encoder: nn.Module, features: torch.Tensor, pad_value: float = 0.0,
                mel_lengths: Optional[Sequence[int]] = None) -> List[torch.Tensor]:
    """features [b, mel, frames <= window] -> the N layer outputs of HF's hidden_states
    (entries 1..N), each [b, frames/2, d], in the encoder's dtype (fp32). Without
    `mel_lengths`: HF's forward over the whole window. With them: the masked forward
    over the longest clip (see the module docstring)."""
    window = 2 * encoder.config.max_source_positions
    frames = features.shape[-1]
    if frames > window:
        raise ValueError(
            f"audio features have {frames} mel frames, more than the encoder window "
            f"2*max_source_positions = {window}; cut clips or raise model.encoder.max_source_positions"
        )
    if features.shape[1] != encoder.config.num_mel_bins:
        raise ValueError(f"audio features have {features.shape[1]} mel bins; the encoder expects "
                         f"model.encoder.num_mel_bins = {encoder.config.num_mel_bins}")
    dtype = encoder.conv1.weight.dtype
    features = features.to(dtype)
    if mel_lengths is None:
        width = window
    else:  # even, so conv2's stride-2 output covers every kept frame
        width = min(window, max(int(n) for n in mel_lengths) + _EDGE_FRAMES)
        width += width % 2
    if frames < width:
        features = nn.functional.pad(features, (0, width - frames), value=pad_value)
    features = features[..., :width]
    frozen = not any(p.requires_grad for p in encoder.parameters())
    # Autocast off (the encoder runs in its own precision); autocast knows CPU and CUDA
    # only, and the meta device (shape-only runs) has nothing to switch off.
    no_autocast = (torch.autocast(device_type=features.device.type, enabled=False)
                   if features.device.type in ("cpu", "cuda") else contextlib.nullcontext())
    with no_autocast, torch.set_grad_enabled(
            torch.is_grad_enabled() and not frozen):
        return encoder_states(encoder, features, mel_lengths)


def encoder_states(encoder: nn.Module, features: torch.Tensor,
                   mel_lengths: Optional[Sequence[int]] = None) -> List[torch.Tensor]:
    """HF WhisperEncoder's forward (no layerdrop: the config has none; no head mask) on a
    window of any even length; with `mel_lengths`, a key mask keeps each clip's attention
    inside its own frames. Returns what HF's hidden_states[1:] holds: the outputs of
    layers 1..N-1, then layer N's output after the final LayerNorm."""
    act = nn.functional.gelu
    hidden = act(encoder.conv2(act(encoder.conv1(features)))).permute(0, 2, 1)
    frames = hidden.shape[1]
    hidden = hidden + encoder.embed_positions.weight[:frames]
    hidden = nn.functional.dropout(hidden, p=encoder.dropout, training=encoder.training)
    mask = None
    if mel_lengths is not None:
        valid = to_device(torch.tensor([encoder_frame_count(int(n)) for n in mel_lengths]), hidden.device)
        keys_out = torch.arange(frames, device=hidden.device)[None, :] >= valid[:, None]  # [b, frames]
        mask = torch.zeros(keys_out.shape, dtype=hidden.dtype, device=hidden.device)
        mask = mask.masked_fill(keys_out, torch.finfo(hidden.dtype).min)[:, None, None, :]  # additive, [b, 1, 1, k]
    states = []
    for layer in encoder.layers:
        out = layer(hidden, mask, layer_head_mask=None)
        hidden = out[0] if isinstance(out, tuple) else out
        states.append(hidden)
    states[-1] = encoder.layer_norm(hidden)
    return states


class _LayerMix(torch.autograd.Function):
    """sum_i w_i * float(state_i), keeping the states as they are for the backward: autograd
    would keep an fp32 copy of each (the weights' gradient reads them), twice the size of a
    bf16 encoder's outputs; at whisper-large-v3's 32 layers and 6 clips of 30 s that is
    1.5 GB per micro-batch (seen by the full-size probe, orchestrator/probe/, on the first
    pipeline stage of gemma2_whisper_tp4pp2). The same sum in the same order, in fp32."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *states: torch.Tensor) -> torch.Tensor:
        mixed = torch.zeros(states[0].shape, dtype=torch.float32, device=states[0].device)
        for w, state in zip(weights, states):
            mixed += w * state.float()
        ctx.save_for_backward(weights, *states)
        return mixed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, *states = ctx.saved_tensors
        grad_weights = None
        if ctx.needs_input_grad[0]:
            grad_weights = torch.stack([(grad * state.float()).sum() for state in states])
        grad_states = [(grad * w).to(state.dtype) if ctx.needs_input_grad[i + 1] else None
                       for i, (w, state) in enumerate(zip(weights, states))]
        return (grad_weights, *grad_states)


class AudioAdapter(nn.Module):
    """Softmax-weighted sum of the encoder layer outputs -> LayerNorm -> stack
    `frame_stack` consecutive frames -> Linear(kd, kd) -> SiLU -> Dropout -> Linear(kd, hidden)."""

    def __init__(self, num_states: int, d_model: int, hidden_size: int, frame_stack: int = 5, dropout: float = 0.0,
                 ctc_vocab_size: int = 0):
        super().__init__()
        self.frame_stack = frame_stack
        stacked = frame_stack * d_model
        self.layer_weights = nn.Parameter(torch.zeros(num_states))
        self.norm = nn.LayerNorm(d_model)
        self.linear_1 = nn.Linear(stacked, stacked)
        self.act = nn.SiLU()
        self.dropout = nn.Dropout(dropout)
        self.linear_2 = nn.Linear(stacked, hidden_size)
        # Optional auxiliary CTC head: the vocabulary plus a blank (the last index).
        self.ctc_head = nn.Linear(hidden_size, ctc_vocab_size + 1) if ctc_vocab_size else None

    def mix(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        # Summed in fp32 whatever the encoder's and the adapter's precision, then in the
        # adapter's dtype (bf16 on GPUs, with the decoder) from the norm on.
        weights = torch.softmax(self.layer_weights.float(), dim=0)
        return self.norm(_LayerMix.apply(weights, *states).to(self.norm.weight.dtype))

    def forward(self, states: Sequence[torch.Tensor], mel_lengths: Sequence[int],
                generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
        """Encoder states [b, frames, d] and each sample's true mel length -> audio tokens
        of all samples, flattened in sample order: [sum of tokens, hidden]. With
        `generators` (one per sample) each sample's dropout mask is drawn from its own."""
        mixed = self.mix(states)
        if mixed.shape[0] != len(mel_lengths):
            raise ValueError(f"{mixed.shape[0]} audio samples but {len(mel_lengths)} audio lengths")
        stacks = []
        for i, mel_len in enumerate(mel_lengths):
            tokens = audio_token_count(int(mel_len), self.frame_stack)
            frames = tokens * self.frame_stack
            if frames > mixed.shape[1]:
                raise ValueError(f"audio sample {i}: length {int(mel_len)} mel frames exceeds the encoder window")
            stacks.append(mixed[i, :frames].reshape(tokens, -1))
        stacked = torch.cat(stacks, dim=0)
        hidden = self.act(self.linear_1(stacked))
        p = self.dropout.p
        if generators is None or not self.training or p == 0:
            return self.linear_2(self.dropout(hidden))
        keep = to_device(torch.cat([torch.empty(len(piece), hidden.shape[1]).bernoulli_(1 - p, generator=g)
                                    for piece, g in zip(stacks, generators)]), hidden.device).to(hidden.dtype)
        return self.linear_2(hidden * keep / (1 - p))


# A clip's CTC target that says: this clip continues the sample of the clip before it (a
# long recording cut into windows, data.long_audio=chunk), whose transcript is aligned
# over the windows' audio tokens one after another.
JOINS_PREVIOUS = "joins the previous clip"


def ctc_losses(adapter: AudioAdapter, audio_tokens: torch.Tensor, tokens_per_clip: Sequence[int],
               targets: Sequence) -> torch.Tensor:
    """CTC loss of each sample with a target [samples with targets]: the adapter's CTC head
    over its clips' audio tokens (`audio_tokens` [sum of tokens, hidden], clips in order;
    a sample's clips are its first and the JOINS_PREVIOUS ones after it, concatenated)
    against its transcript's token ids; a clip whose target is None (its sample is not
    its transcript) is left out. A transcript longer than its audio tokens cannot be
    aligned and gives 0 (zero_infinity) rather than an infinite loss."""
    if adapter.ctc_head is None:
        raise ValueError("the adapter has no CTC head (model.adapter.ctc_weight is 0)")
    if len(targets) != len(tokens_per_clip):
        raise ValueError(f"{len(targets)} CTC targets for {len(tokens_per_clip)} audio clips")
    samples: list = []  # [target, audio tokens] per sample, its clips' tokens summed
    for i, (target, tokens) in enumerate(zip(targets, tokens_per_clip)):
        if isinstance(target, str) and target == JOINS_PREVIOUS:
            if not samples or samples[-1][0] is None:
                raise ValueError(f"CTC target of clip {i} joins the previous clip, which has no target")
            samples[-1][1] += int(tokens)
        else:
            samples.append([target, int(tokens)])
    tokens_per_clip = [tokens for _, tokens in samples]
    targets = [target for target, _ in samples]
    if any(t is None for t in targets):
        keep = [i for i, t in enumerate(targets) if t is not None]
        pieces = audio_tokens.split(list(tokens_per_clip))
        audio_tokens = torch.cat([pieces[i] for i in keep])
        tokens_per_clip, targets = [tokens_per_clip[i] for i in keep], [targets[i] for i in keep]
    blank = adapter.ctc_head.out_features - 1
    log_probs = torch.log_softmax(adapter.ctc_head(audio_tokens).float(), dim=-1)
    padded = nn.utils.rnn.pad_sequence(list(log_probs.split(list(tokens_per_clip))))  # [T, clips, vocab + 1]
    flat = torch.tensor([t for target in targets for t in target], dtype=torch.long, device=audio_tokens.device)
    return nn.functional.ctc_loss(
        padded, flat, torch.tensor(list(tokens_per_clip), dtype=torch.long),
        torch.tensor([len(t) for t in targets], dtype=torch.long), blank=blank, reduction="none", zero_infinity=True)
