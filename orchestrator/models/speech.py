"""Speech side of the AudioLLM: the HF Whisper encoder, run layer by layer (the adapters
that read its states: orchestrator/models/adapters.py).

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

from orchestrator.plan.model_params import encoder_frame_count


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
                mel_lengths: Optional[Sequence[int]] = None, every_layer: bool = True,
                pool: int = 1) -> List[torch.Tensor]:
    """features [b, mel, frames <= window] -> the N layer outputs of HF's hidden_states
    (entries 1..N), each [b, frames/2, d], in the encoder's dtype (fp32); only the last
    without `every_layer`, its frames averaged `pool` at a time before the final
    LayerNorm (encoder_states). Without `mel_lengths`: HF's forward over the whole
    window. With them: the masked forward over the longest clip (see the module docstring)."""
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
        return encoder_states(encoder, features, mel_lengths, every_layer, pool)


def encoder_states(encoder: nn.Module, features: torch.Tensor, mel_lengths: Optional[Sequence[int]] = None,
                   every_layer: bool = True, pool: int = 1) -> List[torch.Tensor]:
    """HF WhisperEncoder's forward (no layerdrop: the config has none; no head mask) on a
    window of any even length; with `mel_lengths`, a key mask keeps each clip's attention
    inside its own frames. Returns what HF's hidden_states[1:] holds: the outputs of
    layers 1..N-1, then layer N's output after the final LayerNorm; without `every_layer`
    that last one alone (no earlier output is kept). `pool` > 1 (Qwen2-Audio's encoder):
    layer N's frames averaged `pool` at a time (AvgPool1d, a partial group dropped) before
    the final LayerNorm."""
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
        if every_layer:
            states.append(hidden)
    if pool > 1:
        hidden = nn.functional.avg_pool1d(hidden.transpose(1, 2), pool, pool).transpose(1, 2)
    return [*states[:-1], encoder.layer_norm(hidden)]
