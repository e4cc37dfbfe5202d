"""The adapters between the speech encoder and the decoder: one class per kind of
orchestrator/plan/adapter_kinds.py (layer_mix: AudioAdapter; voxtral: StackProjector;
qwen2_audio: PoolProjector), and the auxiliary CTC loss over their output.

Each maps the encoder states it reads (`layer_mix`: every layer's output, else the last
one; `pool`: frames the encoder averages before its final LayerNorm,
orchestrator/models/speech.py encoder_states) and each clip's true mel length to the
clips' audio tokens [sum of tokens, hidden], flattened in clip order, `frames_per_token`
encoder frames each; any of them may carry the CTC head (`ctc_head`)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from orchestrator.models.speech import to_device
from orchestrator.plan.model_params import audio_token_count


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
    """layer_mix: softmax-weighted sum of the encoder layer outputs -> LayerNorm -> stack
    `frame_stack` consecutive frames -> Linear(kd, kd) -> SiLU -> Dropout -> Linear(kd, hidden)."""

    layer_mix, pool = True, 1

    def __init__(self, num_states: int, d_model: int, hidden_size: int, frame_stack: int = 5, dropout: float = 0.0,
                 ctc_vocab_size: int = 0):
        super().__init__()
        self.frame_stack = self.frames_per_token = frame_stack
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


class StackProjector(nn.Module):
    """voxtral (HF VoxtralMultiModalProjector): the encoder's last output (after its final
    LayerNorm) -> `frame_stack` frames stacked -> Linear(k*d, hidden, no bias) -> GELU ->
    Linear(hidden, hidden, no bias)."""

    layer_mix, pool = False, 1

    def __init__(self, d_model: int, hidden_size: int, frame_stack: int = 4, ctc_vocab_size: int = 0):
        super().__init__()
        self.frames_per_token = frame_stack
        self.linear_1 = nn.Linear(frame_stack * d_model, hidden_size, bias=False)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(hidden_size, hidden_size, bias=False)
        self.ctc_head = nn.Linear(hidden_size, ctc_vocab_size + 1) if ctc_vocab_size else None

    def forward(self, states: Sequence[torch.Tensor], mel_lengths: Sequence[int],
                generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
        stacked = clip_groups(states[-1], mel_lengths, self.frames_per_token)
        return self.linear_2(self.act(self.linear_1(stacked.to(self.linear_1.weight.dtype))))


class PoolProjector(nn.Module):
    """qwen2_audio (HF Qwen2AudioMultiModalProjector): the encoder's output already averaged
    over pairs of frames and normed (speech.encoder_states, pool=2) -> Linear(d, hidden)."""

    layer_mix, pool = False, 2

    def __init__(self, d_model: int, hidden_size: int, ctc_vocab_size: int = 0):
        super().__init__()
        self.frames_per_token = self.pool
        self.linear = nn.Linear(d_model, hidden_size, bias=True)
        self.ctc_head = nn.Linear(hidden_size, ctc_vocab_size + 1) if ctc_vocab_size else None

    def forward(self, states: Sequence[torch.Tensor], mel_lengths: Sequence[int],
                generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
        # The pooled states hold one row per token already: groups of one.
        pooled = clip_groups(states[-1], mel_lengths, 1, per_token=self.frames_per_token)
        return self.linear(pooled.to(self.linear.weight.dtype))


def clip_groups(frames: torch.Tensor, mel_lengths: Sequence[int], group: int,
                per_token: Optional[int] = None) -> torch.Tensor:
    """Each clip's audio tokens from encoder-rate `frames` [clips, frames, d]: the first
    audio_token_count(mel, per_token) groups of `group` frames, each group concatenated
    into one row -> [sum of tokens, group * d], clips in order."""
    if frames.shape[0] != len(mel_lengths):
        raise ValueError(f"{frames.shape[0]} audio samples but {len(mel_lengths)} audio lengths")
    rows = []
    for i, mel_len in enumerate(mel_lengths):
        tokens = audio_token_count(int(mel_len), per_token or group)
        if tokens * group > frames.shape[1]:
            raise ValueError(f"audio sample {i}: length {int(mel_len)} mel frames exceeds the encoder window")
        rows.append(frames[i, :tokens * group].reshape(tokens, -1))
    return torch.cat(rows, dim=0)


def build_adapter(model_cfg, hidden_size: int, ctc_vocab_size: int = 0) -> nn.Module:
    """The adapter of `model.adapter.kind`, with the CTC head over `ctc_vocab_size` tokens
    (0: none)."""
    from orchestrator.plan.adapter_kinds import dropout, frame_stack, kind_name

    adapter, encoder = model_cfg.adapter, model_cfg.encoder
    kind = kind_name(adapter)
    if kind == "layer_mix":
        return AudioAdapter(encoder.num_layers, encoder.d_model, hidden_size, frame_stack(adapter), dropout(adapter),
                            ctc_vocab_size)
    if kind == "voxtral":
        return StackProjector(encoder.d_model, hidden_size, frame_stack(adapter), ctc_vocab_size)
    return PoolProjector(encoder.d_model, hidden_size, ctc_vocab_size)


# A clip's CTC target that says: this clip continues the sample of the clip before it (a
# long recording cut into windows, data.long_audio=chunk), whose transcript is aligned
# over the windows' audio tokens one after another.
JOINS_PREVIOUS = "joins the previous clip"


def ctc_losses(adapter: nn.Module, audio_tokens: torch.Tensor, tokens_per_clip: Sequence[int],
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
