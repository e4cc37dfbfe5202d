"""The decoder layer on megatron-core, with the sandwich norms of the Gemma families
around attention and MLP (the other families' layers leave them out: IdentityOp).

    h = x + post_attention_layernorm(attn(input_layernorm(x)))
    y = h + post_mlp_layernorm(mlp(pre_mlp_layernorm(h)))

megatron's TransformerLayer has no slot for the post-norms, so this layer adds them
as submodules (names per the project's parameter contract) and has its own short
forward. Everything else (attention, MLP, norms before them) is built by megatron
from the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules
from megatron.core.utils import make_viewless_tensor


@dataclass
class DecoderLayerSubmodules(TransformerLayerSubmodules):
    post_attention_layernorm: Union[ModuleSpec, type] = IdentityOp
    post_mlp_layernorm: Union[ModuleSpec, type] = IdentityOp


class DecoderTransformerLayer(TransformerLayer):
    def __init__(self, config, submodules: DecoderLayerSubmodules, layer_number: int = 1,
                 hidden_dropout=None, pg_collection=None, vp_stage=None):
        super().__init__(config=config, submodules=submodules, layer_number=layer_number,
                         hidden_dropout=hidden_dropout, pg_collection=pg_collection, vp_stage=vp_stage)
        norm_args = dict(config=self.config, hidden_size=self.config.hidden_size, eps=self.config.layernorm_epsilon)
        self.post_attention_layernorm = build_module(submodules.post_attention_layernorm, **norm_args)
        self.post_mlp_layernorm = build_module(submodules.post_mlp_layernorm, **norm_args)

    def forward(self, hidden_states, attention_mask=None, context=None, context_mask=None,
                rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, rotary_pos_cos_sin=None,
                attention_bias=None, inference_context=None, packed_seq_params=None,
                sequence_len_offset=None, padding_mask=None, **unused):
        if inference_context is not None:
            raise NotImplementedError("the Gemma2 layer has no KV-cache inference path")
        core_attention = self.self_attention.core_attention
        if rotary_pos_emb is not None and getattr(self.config, "rope_local_theta", None) is not None:
            # Gemma 3: [global | local] tables (LocalGlobalRotaryEmbedding); this layer's half
            half = rotary_pos_emb.shape[-1] // 2
            rotary_pos_emb = rotary_pos_emb[..., half:] if core_attention.local_rope else rotary_pos_emb[..., :half]
        sandwich = self.sandwich
        if self.compiled_sandwich is not None and core_attention.kv_cache is None:
            # What cannot be traced happens here, eagerly (the flex block mask's lookup);
            # decoding through the KV cache stays eager altogether.
            attention_mask = core_attention.prepare_mask(attention_mask, packed_seq_params, hidden_states.shape[0],
                                                         hidden_states.device)
            sandwich = self.compiled_sandwich
        hidden_states = sandwich(hidden_states, attention_mask, rotary_pos_emb, rotary_pos_cos, rotary_pos_sin,
                                 attention_bias, packed_seq_params, sequence_len_offset)
        output = make_viewless_tensor(inp=hidden_states, requires_grad=hidden_states.requires_grad, keep_graph=True)
        return output, context

    # Set by orchestrator.models.compile.compile_layers (model.compile=layers): `sandwich`
    # under torch.compile. An instance attribute, not a submodule: state dicts are unchanged.
    compiled_sandwich = None

    def sandwich(self, hidden_states, attention_mask, rotary_pos_emb, rotary_pos_cos, rotary_pos_sin,
                 attention_bias, packed_seq_params, sequence_len_offset):
        """The layer's arithmetic: sandwich-normed attention and MLP with their residuals."""
        residual = hidden_states
        attn_out, attn_bias = self.self_attention(
            self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            rotary_pos_emb=rotary_pos_emb,
            rotary_pos_cos=rotary_pos_cos,
            rotary_pos_sin=rotary_pos_sin,
            attention_bias=attention_bias,
            packed_seq_params=packed_seq_params,
            sequence_len_offset=sequence_len_offset,
        )
        if attn_bias is not None:
            attn_out = attn_out + attn_bias
        hidden_states = residual + self._dropout(self.post_attention_layernorm(attn_out))

        residual = hidden_states
        mlp_out, mlp_bias = self.mlp(self.pre_mlp_layernorm(hidden_states))
        if mlp_bias is not None:
            mlp_out = mlp_out + mlp_bias
        return residual + self._dropout(self.post_mlp_layernorm(mlp_out))

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden_dropout > 0 and self.training:
            return torch.nn.functional.dropout(x, p=self.hidden_dropout)
        return x
