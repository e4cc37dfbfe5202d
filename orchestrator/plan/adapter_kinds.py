"""The adapter kinds `model.adapter.kind` may name: what each computes between the speech
encoder and the decoder, the `model.adapter` keys it reads, and how many audio tokens it
makes of a clip. No torch: the plan (sequence lengths, parameters, FLOPs, memory,
validation), the data path and the model all ask here.

- layer_mix (the project's own): a softmax-weighted mix of every encoder layer's output
  (the last after the encoder's final LayerNorm) -> LayerNorm -> `frame_stack` frames
  stacked -> Linear(k*d, k*d) -> SiLU -> Dropout -> Linear(k*d, hidden).
- voxtral (VoxtralForConditionalGeneration): the encoder's last output (after its final
  LayerNorm) -> `frame_stack` frames stacked (HF: reshape to the encoder's
  intermediate_size, 4 x 1280) -> Linear(k*d, hidden, no bias) -> GELU -> Linear(hidden,
  hidden, no bias). Its processor pads every clip to whole 30-s windows, so a clip is
  always a whole window's tokens (data.audio_tokens=window).
- qwen2_audio (Qwen2AudioForConditionalGeneration): the encoder's last layer's output
  averaged over pairs of frames (AvgPool1d(2), a trailing odd frame dropped) -> the
  encoder's final LayerNorm -> Linear(d, hidden, bias). Its processor counts a clip's own
  frames: ((mel - 1) // 2 + 1 - 2) // 2 + 1 tokens, which is encoder frames // 2.

Every kind may carry the auxiliary CTC head (model.adapter.ctc_weight) on its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AdapterKind:
    # model.adapter keys this kind reads beside kind, freeze and ctc_weight, with the value
    # each takes where the config leaves it null; a key of another kind must stay null.
    reads: dict = field(default_factory=dict)
    layer_mix: bool = False  # reads every encoder layer's output (else only the last)
    pool: int = 1  # encoder frames averaged into one before the encoder's final LayerNorm
    audio_tokens: str = ""  # the data.audio_tokens the released model's processor counts ("": either)
    # model.encoder.mask_padding the released model computes with (None: either): Qwen2-Audio
    # masks each clip's padded frames out of its encoder's attention, as mask_padding does.
    mask_padding: bool | None = None


ADAPTER_KINDS: dict[str, AdapterKind] = {
    "layer_mix": AdapterKind(reads={"frame_stack": 5, "dropout": 0.1}, layer_mix=True),
    "voxtral": AdapterKind(reads={"frame_stack": 4}, audio_tokens="window"),
    "qwen2_audio": AdapterKind(pool=2, audio_tokens="clip", mask_padding=True),
}
# The keys some kind reads (and the others refuse).
KIND_KEYS = tuple(sorted({key for kind in ADAPTER_KINDS.values() for key in kind.reads}))


def _get(adapter, key: str):
    """A key of a `model.adapter` section: the schema's dataclass, a DictConfig or the plain
    dict of a plan.json."""
    return adapter.get(key) if isinstance(adapter, Mapping) else getattr(adapter, key, None)


def kind_name(adapter) -> str:
    # A run planned before adapter kinds existed has none: its adapter was the layer mix.
    return _get(adapter, "kind") or "layer_mix"


def adapter_kind(adapter) -> AdapterKind:
    """The kind of a `model.adapter` section (validation refuses an unknown one first)."""
    return ADAPTER_KINDS[kind_name(adapter)]


def setting(adapter, key: str):
    """`model.adapter.<key>` as the adapter's kind reads it: the value set, else the kind's
    default; None for a key the kind does not read."""
    kind = adapter_kind(adapter)
    if key not in kind.reads:
        return None
    value = _get(adapter, key)
    return kind.reads[key] if value is None else value


def frame_stack(adapter) -> int:
    """Encoder frames stacked into one audio token (1 for a kind that stacks none)."""
    return int(setting(adapter, "frame_stack") or 1)


def dropout(adapter) -> float:
    return float(setting(adapter, "dropout") or 0.0)


def frames_per_token(adapter) -> int:
    """Encoder frames per audio token: stacked, or pooled (qwen2_audio's 2)."""
    return frame_stack(adapter) * adapter_kind(adapter).pool


def linear_shapes(adapter, d_model: int, hidden_size: int) -> list[tuple[str, int, int, bool]]:
    """The adapter's linears in order: (name, out features, in features, bias); the names
    are the released classes' (multi_modal_projector.linear_1, ...)."""
    stacked, kind = frame_stack(adapter) * d_model, kind_name(adapter)
    if kind == "layer_mix":
        return [("linear_1", stacked, stacked, True), ("linear_2", hidden_size, stacked, True)]
    if kind == "voxtral":
        return [("linear_1", hidden_size, stacked, False), ("linear_2", hidden_size, hidden_size, False)]
    return [("linear", hidden_size, d_model, True)]


def activation(adapter) -> str | None:
    """Between the linears: layer_mix SiLU, voxtral GELU (erf, HF's "gelu"); none for one linear."""
    return {"layer_mix": "silu", "voxtral": "gelu"}.get(kind_name(adapter))
