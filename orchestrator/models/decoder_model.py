"""The decoder of every family (orchestrator/plan/decoder_families.py: Gemma2, Llama,
Qwen2, Qwen3, Gemma 3) as a megatron-core GPTModel.

What GPTModel gives unchanged: vocab-parallel embedding tied to the output layer,
RoPE (including per-document positions for packed `thd` sequences), the transformer
block, pipeline stages, vocab-parallel cross entropy. What this subclass adds:

- Gemma's embedding scale sqrt(hidden) (1 for the other families), rounded to the compute dtype as HF does, applied
  by `scale_embeddings` so a caller can first scatter audio features into the token
  embeddings (`embed_tokens` -> fuse -> `scale_embeddings` -> forward(decoder_input=));
- Gemma2's final logit softcap cap*tanh(logit/cap) before the loss, and -inf-like logits on
  vocabulary padding rows (so the loss equals the unpadded model's);
- the family's layers (see decoder_spec), read from the project's config fields megatron
  lacks (orchestrator/models/decoder_config.py); Gemma 3's two RoPE bases.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel

from orchestrator.models.decoder_config import DecoderTransformerConfig
from orchestrator.models.decoder_spec import decoder_block_spec
from orchestrator.plan.decoder_families import FAMILIES
from orchestrator.plan.kernels import LOSS_CHUNK_ELEMENTS
from orchestrator.plan.megatron_args import padded_vocab_size as _padded


def _rounded(value: float, dtype: torch.dtype) -> float:
    """`value` rounded to `dtype`, as a Python float (exact: every bf16/fp16/fp32 value is one)."""
    return float(torch.tensor(value, dtype=dtype))


class _LogitsGradAsOneMatrix(torch.autograd.Function):
    """Identity on the output layer's logits [s, b, v]; its backward hands the output
    layer the gradient laid out as one [s*b, v] matrix.

    megatron's `_postprocess` returns the logits as `transpose(0, 1).contiguous()`, so
    their gradient reaches the output layer as a transposed view (strides [v, s*v, 1]).
    torch's matmul (2.11) multiplies such a [s, b, v] tensor by the [v, h] weight as a
    batched matmul over s copies of the broadcast weight, with b rows each: measured on
    an H200 at gemma2-2b (vocabulary 256000, s 2048, b 1), 470 ms a micro-batch, 77% of
    the step. Laid out as [s*b, v] it is one matrix product (a copy only where b > 1)."""

    @staticmethod
    def forward(ctx, logits):
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx, grad):
        s, b, v = grad.shape
        return grad.reshape(s * b, v).view(s, b, v)


def _logits_grad_as_one_matrix(module, args, output):
    logits, bias = output
    return _LogitsGradAsOneMatrix.apply(logits), bias


def softcapped_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, cap: Optional[float],
                             real_vocab_size: int) -> torch.Tensor:
    """Per-token loss [b, s] of the whole vocabulary's logits [b, s, v] (one TP rank holds
    it all): the final softcap, the vocabulary's padding rows out, then the cross entropy,
    in fp32 -- the arithmetic of `cap_logits` and megatron's vocab-parallel cross entropy
    at TP = 1 (a label outside [0, v) picks no logit there either), written as one
    function so that `model.compile=layers` compiles it into a few fused passes over the
    logits, forward and backward, where eager runs a dozen fp32 element-wise passes
    (each a read and write of 2 GiB at gemma2-2b's 256000-token vocabulary and 2048
    tokens: ~150 ms of an H200's 581 ms step, docs/gpu-machines.md)."""
    z = logits.float()
    if cap is not None:
        z = torch.tanh(z / cap) * cap
    v = z.shape[-1]
    if real_vocab_size < v:
        z = z.masked_fill(torch.arange(v, device=z.device) >= real_vocab_size, torch.finfo(z.dtype).min)
    picked = z.gather(-1, labels.clamp(0, v - 1).unsqueeze(-1)).squeeze(-1)
    return torch.logsumexp(z, dim=-1) - torch.where((labels >= 0) & (labels < v), picked, 0.0)


class LocalGlobalRotaryEmbedding(torch.nn.Module):
    """Gemma 3's two RoPEs as GPTModel's one `rotary_pos_emb`: the global layers' table
    (base rope_theta, linear scaling) and the sliding layers' (base rope_local_theta)
    side by side on the last dimension, [s, 1, 1, 2 * dim], each made by megatron's
    RotaryEmbedding (its context-parallel chunks and packed sequences included). Each
    layer takes its half (DecoderTransformerLayer). One tensor, so that it travels through
    megatron's block and activation recomputation as the single table does."""

    def __init__(self, global_rope, local_rope):
        super().__init__()
        self.global_rope, self.local_rope = global_rope, local_rope

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None):
        return torch.cat([rope(max_seq_len, offset, packed_seq, cp_group)
                          for rope in (self.global_rope, self.local_rope)], dim=-1)

    def get_rotary_seq_len(self, *args, **kwargs) -> int:
        return self.global_rope.get_rotary_seq_len(*args, **kwargs)


class DecoderModel(GPTModel):
    def __init__(self, config: DecoderTransformerConfig, vocab_size: int, max_sequence_length: int,
                 pre_process: bool = True, post_process: bool = True, backend: str = "local",
                 rope_theta: float = 10000.0, vp_stage=None, attention: str = "reference", core_attention=None,
                 tie_embeddings: bool = True, padded_vocab_size: Optional[int] = None):
        """`vocab_size`: the tokenizer's; `padded_vocab_size`: the embedding's rows, a job's
        Plan's (None: megatron's padding at the config's TP, for a model built without one)."""
        tp = config.tensor_model_parallel_size
        padded = padded_vocab_size or _padded(vocab_size, tp)
        if padded < vocab_size or padded % tp:
            raise ValueError(f"padded vocabulary {padded} must hold the vocabulary ({vocab_size}) and split over "
                             f"TP {tp}")
        pp_rank = parallel_state.get_pipeline_model_parallel_rank() if config.pipeline_model_parallel_size > 1 else 0
        scaling = FAMILIES[config.decoder_family].rope_scaling
        super().__init__(
            config=config,
            transformer_layer_spec=decoder_block_spec(config, backend, vp_stage=vp_stage, pp_rank=pp_rank,
                                                     attention=attention, core_attention=core_attention),
            vocab_size=padded,
            max_sequence_length=max_sequence_length,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,
            share_embeddings_and_output_weights=tie_embeddings,  # Gemma2 ties them; Llama 3 8B does not
            position_embedding_type="rope",
            rotary_base=rope_theta,
            # Llama 3's frequency scaling: megatron's has its low/high frequency factors (1, 4)
            # and original length (8192) fixed, as every Llama 3.x has them.
            rope_scaling=config.rope_scaling_factor is not None and scaling == "llama3",
            rope_scaling_factor=config.rope_scaling_factor or 8.0,
            # Gemma 3's linear scaling: positions divided by the factor
            seq_len_interpolation_factor=config.rope_scaling_factor if scaling == "linear" else None,
            # Our embedding code scatters after fusion and scaling (see scale_embeddings).
            scatter_embedding_sequence_parallel=False,
            vp_stage=vp_stage,
        )
        self.real_vocab_size = vocab_size
        if config.rope_local_theta is not None:
            self.rotary_pos_emb = LocalGlobalRotaryEmbedding(self.rotary_pos_emb, RotaryEmbedding(
                kv_channels=config.kv_channels, rotary_percent=1.0, rotary_base=config.rope_local_theta,
                use_cpu_initialization=config.use_cpu_initialization, cp_group=self.pg_collection.cp))
        # sqrt(hidden) rounded to the embeddings' dtype (HF Gemma2), as a Python number made
        # once: no tensor made and copied to the device per call (a host sync on GPUs);
        # 1 for a family without the scale (its multiply changes no value).
        scaled = FAMILIES[config.decoder_family].scaled_embeddings
        self.embedding_scale = _rounded(config.hidden_size**0.5, config.params_dtype) if scaled else 1.0
        # Logits per chunk of the loss (softcapped_loss): 2^27 fp32 values = 512 MiB.
        self.loss_chunk_elements = LOSS_CHUNK_ELEMENTS
        # The compiled softcapped_cross_entropy (model.compile=layers, TP = 1): set by
        # orchestrator.models.compile; None runs the loss eagerly in chunks.
        self.compiled_loss = None
        if post_process:
            self.output_layer.register_forward_hook(_logits_grad_as_one_matrix)

    def rotary_inv_freqs(self) -> tuple:
        """(frequencies of every layer's RoPE, of the sliding layers' own or None) as
        decoding rotates with them (orchestrator.models.kv_cache): the positions' linear
        scaling folded into the frequencies."""
        rope = self.rotary_pos_emb
        local = None
        if isinstance(rope, LocalGlobalRotaryEmbedding):
            rope, local = rope.global_rope, rope.local_rope.inv_freq
        factor = rope.seq_len_interpolation_factor
        return (rope.inv_freq / factor if factor else rope.inv_freq), local

    # -- input side (first pipeline stage) ---------------------------------------
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Unscaled token embeddings [b, s, h] (full sequence on every TP rank)."""
        return self.embedding.word_embeddings(input_ids)

    def scale_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """[b, s, h] embeddings -> decoder input [s(/tp), b, h]: times sqrt(hidden)
        rounded to the embedding dtype (as HF Gemma2), then the sequence-parallel split.
        Laid out as every layer's output is: at micro-batch 1, `contiguous()` would keep the
        transposed stride of the size-1 batch dimension, and the first compiled layer, whose
        graph is specialised to its input's strides, would compile a graph of its own."""
        hidden = (embeddings * self.embedding_scale).transpose(0, 1).clone(memory_format=torch.contiguous_format)
        if self.config.sequence_parallel:
            hidden = tensor_parallel.scatter_to_sequence_parallel_region(hidden)
        return hidden

    def forward(self, input_ids, position_ids, attention_mask, decoder_input=None, labels=None, **kwargs):
        if decoder_input is None and self.pre_process:
            decoder_input = self.scale_embeddings(self.embed_tokens(input_ids))
        return super().forward(input_ids, position_ids, attention_mask, decoder_input=decoder_input,
                               labels=labels, **kwargs)

    # -- output side (last pipeline stage) ---------------------------------------
    def _postprocess(self, *args, **kwargs):
        if len(args) > 3:
            args = list(args)
            labels = args[3]
            args[3] = None
        else:
            labels = kwargs.pop("labels", None)
            kwargs["labels"] = None
        out = super()._postprocess(*args, **kwargs)
        if not self.post_process:
            return out
        if labels is None:
            return self.cap_logits(out)  # [b, s, v(/tp)]
        return self.softcapped_loss(out, labels)

    def softcapped_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token loss [b, s] of the output layer's logits [b, s, v(/tp)] (compute dtype)
        through the final softcap, in sequence chunks of at most `loss_chunk_elements`
        logits. The softcap and the cross entropy work in fp32 (several fp32 copies of
        their input: at gemma2-2b's 256000-token vocabulary and 2048 tokens, 2 GiB each);
        chunked, each chunk's fp32 work is recomputed in the backward from the saved
        compute-dtype logits (torch.utils.checkpoint), so one chunk's fp32 copies are
        alive at a time. Tokens are independent here: chunking changes no value. Compiled
        (`compiled_loss`), the whole micro-batch in one call: its fused kernels keep no fp32
        copy of the logits (tests/models/test_compile.py)."""
        if self.compiled_loss is not None:
            return self.compiled_loss(logits, labels, self.config.final_logit_softcapping, self.real_vocab_size)
        b, s, v = logits.shape
        chunk = max(1, self.loss_chunk_elements // max(1, b * v))
        if chunk >= s:
            return self._token_loss(logits, labels)
        from torch.utils.checkpoint import checkpoint

        pieces = [checkpoint(self._token_loss, logits[:, i:i + chunk], labels[:, i:i + chunk], use_reentrant=False)
                  for i in range(0, s, chunk)]
        return torch.cat(pieces, dim=1)

    def _token_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # megatron's cross entropy works in place on the logits it is given: they must be a
        # tensor of their own. Without a softcap or vocabulary padding cap_logits returns the
        # model's logits themselves, and at micro-batch size 1 the transpose of [1, s, v] is
        # contiguous already: `.contiguous()` would hand over a view of them, whose in-place
        # change autograd refuses. (Capped or padded, they are a new tensor already.)
        capped = self.cap_logits(logits)
        flipped = capped.transpose(0, 1)
        own = flipped.clone(memory_format=torch.contiguous_format) if capped is logits else flipped.contiguous()
        return self.compute_language_model_loss(labels, own)

    def cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.config.final_logit_softcapping
        if cap is not None:
            # In fp32: near the cap a bf16 logit has steps of 0.125, and the loss reads the
            # logits in fp32 anyway (the output stays fp32, as megatron's cross entropy wants).
            logits = torch.tanh(logits.float() / cap) * cap
        padded = self.vocab_size
        if padded == self.real_vocab_size:
            return logits
        width = logits.shape[-1]
        start = 0 if width == padded else parallel_state.get_tensor_model_parallel_rank() * width
        ids = torch.arange(start, start + width, device=logits.device)
        return logits.masked_fill(ids >= self.real_vocab_size, torch.finfo(logits.dtype).min)
