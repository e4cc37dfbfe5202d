"""`model` group: the AudioLLM = Whisper-style speech encoder -> adapter -> Gemma2 decoder."""

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class DecoderConfig:
    """The decoder: a Gemma2, Llama, Qwen2, Qwen3 or Gemma 3 (orchestrator/plan/
    decoder_families.py). HF config names are given where ours differ."""

    # gemma2 | llama | qwen2 | qwen3 | gemma3: what the layer computes (norms, activation,
    # embedding scale, windows, QKV biases, QK-norm, RoPE per layer type)
    family: str = "gemma2"
    hidden_size: int = MISSING
    num_layers: int = MISSING  # HF num_hidden_layers
    num_attention_heads: int = MISSING
    num_query_groups: int = MISSING  # HF num_key_value_heads (grouped-query attention)
    kv_channels: int = MISSING  # HF head_dim; Gemma2 uses 256, not hidden/heads
    ffn_hidden_size: int = MISSING  # HF intermediate_size (GeGLU, tanh GELU)
    vocab_size: int = MISSING  # before padding; padded to a multiple of 128*TP
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6  # RMSNorm: x*rsqrt(mean(x^2)+eps) times (1+w) (gemma2) or w (the others)
    # Sliding-window attention (HF layer_types): on layers whose 0-based index is even
    # (gemma2), on all but every sixth (gemma3); the window includes the current token:
    # 4096 means Megatron window_size=(4095, 0). Gemma only (null for the others).
    sliding_window: Optional[int] = 4096
    query_pre_attn_scalar: Optional[float] = 256.0  # queries scaled by query_pre_attn_scalar**-0.5
    attn_logit_softcap: Optional[float] = 50.0  # cap*tanh(score/cap) before the mask
    final_logit_softcap: Optional[float] = 30.0  # cap*tanh(logit/cap) before the loss
    # RoPE scaling, or null for none. llama: Llama 3's frequency scaling (HF rope_type
    # "llama3" with low/high frequency factors 1 and 4 over 8192 original positions, as every
    # Llama 3.x has), 8 for 3.1, 32 for 3.2. gemma3: linear (positions divided by the
    # factor) on the global layers, 8 for 4b and larger.
    rope_scaling_factor: Optional[float] = None
    # RoPE base of the sliding-window layers (HF rope_local_base_freq; 10000 for every
    # Gemma 3). gemma3 only.
    rope_local_theta: Optional[float] = None
    tie_embeddings: bool = True
    freeze: bool = False  # freeze every base decoder weight (LoRA adapters stay trainable)
    # Std of the random initial weights (megatron init_method_std); matters only without
    # a checkpoint. A tiny decoder trained from scratch learns faster with a larger one.
    init_method_std: float = 0.02


@dataclass
class EncoderConfig:
    """Whisper encoder (HF `WhisperEncoder`)."""

    d_model: int = MISSING
    num_layers: int = MISSING  # HF encoder_layers
    num_heads: int = MISSING  # HF encoder_attention_heads
    ffn_dim: int = MISSING  # HF encoder_ffn_dim
    num_mel_bins: int = 128  # whisper-large-v3: 128; the data side computes this many bins
    # Positions after the stride-2 conv: 1500 for 30-s windows (3000 mel frames).
    # A small encoder can use a shorter window sized to its clips.
    max_source_positions: int = 1500
    # false: Whisper's own forward, every clip padded to the whole window and attending
    # to its padding (what pretrained Whisper weights expect). true: the encoder runs on
    # the batch's longest clip and each clip attends only to its own frames (cheaper;
    # for encoders trained on short clips). See orchestrator/models/speech.py.
    mask_padding: bool = False
    # Std of the normal init of the encoder's linear and conv weights (HF WhisperConfig
    # init_std). Only matters without pretrained weights: at HF's 0.02 a small encoder's
    # conv stack passes on ~1/40 of the scale of the position embeddings it is added
    # to, so training from scratch first has to grow the acoustic signal.
    init_std: float = 0.02
    freeze: bool = True
    # auto: bf16 weights with PyTorch's SDPA attention on a GPU (launcher.accelerator=gpu),
    # frozen or trained (megatron's bf16 optimizer keeps a trained encoder's fp32 master
    # weights), fp32 with HF's eager attention on a CPU (the reference); fp32 | bf16 force
    # one: validation refuses fp32 for an encoder that trains on a GPU (unfrozen, or LoRA
    # on it) and bf16 on a CPU. orchestrator/plan/kernels.py encoder_precision.
    precision: str = "auto"


@dataclass
class AdapterConfig:
    """Encoder states -> audio tokens in the decoder's width. `kind` chooses what it computes
    (orchestrator/plan/adapter_kinds.py): layer_mix, the project's own (a learned mix of
    every encoder layer's output -> LayerNorm -> concat `frame_stack` frames ->
    Linear(k*d, k*d) -> SiLU -> Dropout -> Linear(k*d, decoder hidden)); voxtral (the last
    output, `frame_stack` frames stacked -> Linear -> GELU -> Linear, no biases); qwen2_audio
    (the last layer's output averaged over pairs of frames -> the encoder's final LayerNorm
    -> Linear with bias). A key the kind does not read must stay null."""

    kind: str = "layer_mix"  # layer_mix | voxtral | qwen2_audio
    # Encoder frames concatenated into one audio token. null: the kind's own (layer_mix 5:
    # 1500 encoder frames -> 300 tokens per 30 s; voxtral 4). layer_mix and voxtral only.
    frame_stack: Optional[int] = None
    dropout: Optional[float] = None  # after the activation; null: 0.1. layer_mix only.
    freeze: bool = False
    # Auxiliary CTC loss on the adapter output (a linear head `adapter.ctc_head` over the
    # vocabulary + a blank), added to the training loss with this weight; 0: no head.
    # Joint CTC training teaches a from-scratch encoder a monotonic audio-text alignment
    # much sooner than the decoder's attention alone. Needs pp = 1: the logged training
    # loss includes weight x CTC per trained token, the validation loss does not; the
    # head scores generation only with train.eval_generation_ctc_weight > 0.
    ctc_weight: float = 0.0


@dataclass
class SpecAugmentConfig:
    """Time and frequency masks on the encoder's log-mel input, in training mode only
    (orchestrator.models.spec_augment). Off by default; on for models trained from scratch."""

    enabled: bool = False
    freq_masks: int = 2  # bands of mel bins per clip
    freq_width: int = 15  # widest band (mel bins)
    time_masks: int = 2  # spans of frames per clip
    time_width: int = 40  # widest span (mel frames, 10 ms each) ...
    time_ratio: float = 0.1  # ... and at most this share of the clip's valid frames


@dataclass
class ModelConfig:
    name: str = MISSING
    # Linears and norms. local: megatron-core's own tensor-parallel linears and the project's
    # RMSNorm (CPU and GPU). te: TransformerEngine's (GPU only, the `gpu` extra).
    backend: str = "local"
    # Core attention, independent of the backend (orchestrator/plan/kernels.py): auto (flex on a
    # GPU, reference on a CPU), reference (plain PyTorch, fp32 s x s scores; the parity
    # reference) or flex (torch's flex_attention, compiled; GPU training only).
    attention: str = "auto"
    # none: eager. layers: every decoder and encoder layer compiled whole with torch.compile
    # (fullgraph, static shapes; orchestrator/models/compile.py), and at TP 1 the softcapped loss: a
    # few fused kernels a layer instead of dozens of launches, for GPU steps bound by the host
    # (benchmarks/host_cost.py: operators per gemma2-2b micro-batch 12,068 -> 2,470; an H200:
    # 1.43x tokens/s). Local backend (any TP, CP, SP, PP), no selective recompute. auto:
    # layers on a GPU where the layout allows it, none on CPUs and elsewhere (the job says which).
    compile: str = "auto"
    # FP8 GEMMs of TransformerEngine's linears (megatron's `fp8`, Megatron-LM's --fp8-format):
    # null (off), hybrid (E4M3 forward, E5M2 gradients) or e4m3. TE backend on GPUs only;
    # master weights, gradients and the optimizer stay as without it.
    fp8: Optional[str] = None
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    # Pretrained weights, loaded by every rank at the job's own TP/PP before LoRA and the
    # freezes (step 0, fresh optimizer): a converted checkpoint (`audiollm convert
    # hf-to-megatron`), a training checkpoint (RUN/checkpoints/step_N) or a run directory
    # (its latest step, fixed when planned). None: random initialisation, which
    # validation refuses for frozen modules. See orchestrator/train/init_weights.py.
    init_checkpoint: Optional[str] = None
    # true: frozen modules may keep their random initial weights (no init_checkpoint), which
    # validation otherwise refuses: for measuring a LoRA or frozen-encoder recipe's speed and
    # memory at full size where no pretrained weights are at hand (benchmarks/gpu_acceptance.py's
    # 9B row); its losses mean nothing, and plan and train say so.
    allow_frozen_random: bool = False
