"""The AudioLLM: Whisper encoder -> adapter (of model.adapter.kind) -> audio fused into the
decoder's token embeddings.

Parameter names follow the project's contract: `encoder.*` (HF WhisperEncoder),
`adapter.*`, `language_model.*` (megatron GPTModel). The encoder and adapter exist on
the first pipeline stage only; later stages receive hidden states from megatron's
pipeline schedule through `set_input_tensor`.

Forward on the first stage, in this order (HF Gemma2 scales every input embedding, so
audio embeddings must be scaled too):
  token embeddings -> scatter audio embeddings at placeholder ids -> x sqrt(hidden)
  -> (sequence-parallel split) -> decoder
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from megatron.core.transformer.module import MegatronModule

from orchestrator.models.fusion import fuse_audio, fuse_audio_frames
from orchestrator.models.decoder_config import DecoderTransformerConfig
from orchestrator.models.decoder_model import DecoderModel
from orchestrator.models.adapters import build_adapter, ctc_losses
from orchestrator.models.speech import build_whisper_encoder, run_encoder


class AudioLLM(MegatronModule):
    def __init__(self, language_model: DecoderModel, encoder: Optional[torch.nn.Module],
                 adapter: Optional[torch.nn.Module], audio_token_id: int, encoder_pad_value: float = 0.0,
                 spec_augment: Optional[torch.nn.Module] = None, encoder_mask_padding: bool = False):
        super().__init__(config=language_model.config)
        self.language_model = language_model
        if (encoder is None) != (adapter is None):
            raise ValueError("encoder and adapter are built together (first pipeline stage) or not at all")
        if encoder is not None and not language_model.pre_process:
            raise ValueError("the encoder and adapter belong on the first pipeline stage (pre_process=True)")
        self.encoder = encoder
        self.adapter = adapter
        self.audio_token_id = audio_token_id
        self.encoder_pad_value = encoder_pad_value
        self.encoder_mask_padding = encoder_mask_padding
        # Masks the log-mel input in training mode only (a no-op in eval mode); no parameters.
        self.spec_augment = spec_augment

    # megatron's schedules and finalize_model_grads look these up on the model chunk
    @property
    def model_type(self):
        return self.language_model.model_type

    @property
    def pre_process(self) -> bool:
        return self.language_model.pre_process

    @property
    def post_process(self) -> bool:
        return self.language_model.post_process

    @property
    def share_embeddings_and_output_weights(self) -> bool:
        return self.language_model.share_embeddings_and_output_weights

    def shared_embedding_or_output_weight(self):
        return self.language_model.shared_embedding_or_output_weight()

    def set_input_tensor(self, input_tensor) -> None:
        self.language_model.set_input_tensor(input_tensor)

    def audio_embeddings(self, audio_features: torch.Tensor, audio_lengths: Sequence[int],
                         audio_seeds: Optional[Sequence[int]] = None) -> torch.Tensor:
        """[clips, mel, frames] features + true mel lengths -> [audio tokens, hidden], clips in order.
        `audio_seeds` (training): one per clip, seeding that clip's SpecAugment masks and
        adapter dropout, so that they depend on the clip only, not on which clips are
        encoded with it (context-parallel ranks encode different subsets)."""
        generators = None
        if audio_seeds is not None and self.training:
            generators = [torch.Generator().manual_seed(int(seed)) for seed in audio_seeds]
        lengths = [int(n) for n in audio_lengths]
        if self.spec_augment is not None and self.training:
            audio_features = self.spec_augment(audio_features, lengths, generators=generators)
        states = run_encoder(self.encoder, audio_features, self.encoder_pad_value,
                             lengths if self.encoder_mask_padding else None, self.adapter.layer_mix, self.adapter.pool)
        return self.adapter(states, lengths, generators=generators)

    def embed(self, input_ids: torch.Tensor, audio_features: Optional[torch.Tensor] = None,
              audio_lengths: Optional[Sequence[int]] = None, audio_clip_rows: Optional[Sequence[int]] = None,
              audio_frame_index: Optional[torch.Tensor] = None, audio_seeds: Optional[Sequence[int]] = None):
        """First stage: (decoder input [s(/tp), b, h], audio embeddings [audio tokens, h] or
        None, audio tokens per clip). `audio_frame_index` (context parallel): the rows of
        the clips' adapter output that `input_ids`' placeholders hold, in row-major order;
        without it the placeholders hold all of them, clip by clip (`audio_clip_rows`)."""
        lm = self.language_model
        embeddings = lm.embed_tokens(input_ids)
        audio, per_clip = None, []
        if audio_features is not None:
            if audio_lengths is None:
                raise ValueError("audio_features given without audio_lengths (true mel frames per clip)")
            lengths = [int(n) for n in audio_lengths]
            audio = self.audio_embeddings(audio_features, lengths, audio_seeds)
            per_clip = [self.adapter_tokens(n) for n in lengths]
            # The placeholders are not counted here (that reads the ids: a host sync on a
            # GPU); the data path checks the host copy (check_audio_placeholders).
            if audio_frame_index is None:
                embeddings = fuse_audio(embeddings, input_ids, audio, self.audio_token_id)
            else:
                embeddings = fuse_audio_frames(embeddings, input_ids, audio, self.audio_token_id, audio_frame_index)
        return lm.scale_embeddings(embeddings), audio, per_clip

    def adapter_tokens(self, mel_frames: int) -> int:
        from orchestrator.plan.model_params import audio_token_count

        return audio_token_count(mel_frames, self.adapter.frames_per_token)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None, labels=None,
                audio_features: Optional[torch.Tensor] = None, audio_lengths: Optional[Sequence[int]] = None,
                audio_clip_rows: Optional[Sequence[int]] = None, packed_seq_params=None,
                ctc_targets: Optional[Sequence[Sequence[int]]] = None,
                audio_frame_index: Optional[torch.Tensor] = None, audio_seeds: Optional[Sequence[int]] = None,
                **kwargs):
        """The language model's output (per-token loss with `labels`). With `ctc_targets`
        (token ids of each clip's transcript; first stage, adapter with a CTC head) the
        pair (that output, CTC loss per clip [clips])."""
        decoder_input = ctc = None
        if self.pre_process:
            decoder_input, audio, per_clip = self.embed(input_ids, audio_features, audio_lengths, audio_clip_rows,
                                                        audio_frame_index, audio_seeds)
            if ctc_targets is not None:
                ctc = ctc_losses(self.adapter, audio, per_clip, ctc_targets)
        elif ctc_targets is not None:
            raise ValueError("ctc_targets need the first pipeline stage (the adapter lives there)")
        output = self.language_model(input_ids, position_ids, attention_mask, decoder_input=decoder_input,
                                     labels=labels, packed_seq_params=packed_seq_params, **kwargs)
        return output if ctc_targets is None else (output, ctc)


def build_audiollm(model_cfg, config: DecoderTransformerConfig, pre_process: bool = True, post_process: bool = True,
                   audio_token_id: int = 0, vp_stage=None, encoder_pad_value: float = 0.0, core_attention=None,
                   encoder_lora: bool = False, on_gpu: Optional[bool] = None, attention: Optional[str] = None,
                   random_init: bool = True, padded_vocab_size: Optional[int] = None) -> AudioLLM:
    """Build this rank's AudioLLM chunk from the `model` config section and the decoder's
    megatron `config` (the job's one TransformerConfig, orchestrator/train/megatron_config.py;
    outside a job decoder_config.decoder_transformer_config): its sizes, dtype and init methods. Call after
    `init_distributed` (megatron's parallel state must exist). Every parameter
    that can train is in the config's params_dtype: megatron's bf16 optimizer keeps their fp32 master
    weights, and its checkpoints hold only parameters of the compute dtype (a trained fp32
    adapter beside a bf16 decoder failed the first save on a GPU). The adapter's layer mix
    sums in fp32; only a frozen encoder can stay in fp32 (model.encoder.precision=fp32).
    The attention kernel is `model.attention` on this machine (orchestrator.plan.kernels: auto
    is flex on CUDA); `core_attention` (a class) replaces it for the tests' known-mistake
    controls only. `encoder_lora`: LoRA will adapt the encoder (lora.encoder), which then
    trains. `on_gpu`: built for a GPU (this machine's
    answer unless given; the full-size probe builds for a GPU on CPU); `attention`: the
    kernel decided for it (orchestrator.runtime.machine.decide; model.attention on
    `on_gpu` unless given). `random_init` False: a checkpoint will overwrite every weight
    of the Whisper encoder, which is then not drawn (the decoder's draws are skipped by
    the config's init methods); True on a GPU: the decoder's are drawn there
    (orchestrator.models.device_draws). `padded_vocab_size`: the Plan's (a job's); None:
    megatron's padding of the decoder's vocabulary at the config's TP."""
    from orchestrator.models.device_draws import draw_on_device
    from orchestrator.plan.kernels import attention_kernel, encoder_precision

    dec = model_cfg.decoder
    params_dtype = config.params_dtype
    has_cuda = torch.cuda.is_available()
    on_gpu = has_cuda if on_gpu is None else on_gpu
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu and has_cuda else torch.device("cpu")
    draws_on_gpu = random_init and device.type == "cuda"
    if draws_on_gpu:  # megatron's host draws, made on the GPU (on this chunk's copy: the job's config stays as planned)
        config = copy.copy(config)
        draw_on_device(config, device)
    language_model = DecoderModel(config, dec.vocab_size, dec.max_position_embeddings, pre_process=pre_process,
                                 post_process=post_process, backend=model_cfg.backend, rope_theta=dec.rope_theta,
                                 vp_stage=vp_stage, tie_embeddings=dec.tie_embeddings,
                                 attention=attention or attention_kernel(getattr(model_cfg, "attention", "auto"), on_gpu),
                                 core_attention=core_attention, padded_vocab_size=padded_vocab_size)
    if draws_on_gpu:  # the staging blocks (up to a full fp32 embedding) back, not split by training's tensors
        torch.cuda.empty_cache()
    if dec.freeze:
        language_model.requires_grad_(False)
    encoder = adapter = None
    if pre_process:
        trainable = not model_cfg.encoder.freeze or encoder_lora
        precision = encoder_precision(getattr(model_cfg.encoder, "precision", "auto"), on_gpu)
        if trainable and precision == "fp32" and params_dtype != torch.float32:
            raise ValueError(f"a trained encoder in fp32 beside a {params_dtype} decoder: megatron's "
                             f"{params_dtype} optimizer holds and checkpoints only {params_dtype} parameters; set "
                             f"model.encoder.precision=auto (or freeze the encoder)")
        encoder = build_whisper_encoder(model_cfg.encoder, precision, random_init=random_init, device=device)
        ctc_vocab = dec.vocab_size if float(getattr(model_cfg.adapter, "ctc_weight", 0.0)) > 0 else 0
        adapter = build_adapter(model_cfg, dec.hidden_size, ctc_vocab).to(params_dtype)
        if model_cfg.adapter.freeze:
            adapter.requires_grad_(False)
        adapter.to(device)
    from orchestrator.models.spec_augment import build_spec_augment

    spec_augment = build_spec_augment(getattr(model_cfg, "spec_augment", None)) if pre_process else None
    return AudioLLM(language_model, encoder, adapter, audio_token_id, encoder_pad_value, spec_augment,
                    encoder_mask_padding=bool(getattr(model_cfg.encoder, "mask_padding", False)))
