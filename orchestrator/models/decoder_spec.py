"""Module specs of the decoder (every family): linears and norms by backend, core attention by kernel.

Backends (`model.backend`):
local: megatron's plain tensor-parallel linears + the project's `ZeroCenteredRMSNorm`
       (pure PyTorch, compiled into one kernel on CUDA; CPU and GPU).
te:    TransformerEngine linears + TransformerEngine's fused RMSNorm with
       `zero_centered_gamma` (megatron's `TENorm` reads it from the config's
       normalization / layernorm_zero_centered_gamma, which the plan's megatron fields
       set: orchestrator/plan/megatron_fields.py): the same (1 + w) scale, computed in
       fp32 inside one kernel. GPU only.

Attention kernels (`model.attention`, resolved by orchestrator.plan.kernels.attention_kernel):
reference: `SoftcapDotProductAttention` (plain PyTorch; the numerical reference);
flex:      `FlexSoftcapAttention` (torch's flex_attention). TransformerEngine's own
           attention is not used: released versions lack the logit softcap.
"""

from __future__ import annotations

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from orchestrator.models.attention import FlexSoftcapAttention, SoftcapDotProductAttention
from orchestrator.models.decoder_layer import DecoderLayerSubmodules, DecoderTransformerLayer
from orchestrator.models.norms import RMSNorm, ZeroCenteredRMSNorm
from orchestrator.plan.decoder_families import FAMILIES

BACKENDS = ("local", "te")
ATTENTION_CLASSES = {"reference": SoftcapDotProductAttention, "flex": FlexSoftcapAttention}


def _modules(backend: str):
    """(column linear, row linear, norm) classes of a backend."""
    if backend == "local":
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        return ColumnParallelLinear, RowParallelLinear, ZeroCenteredRMSNorm
    if backend == "te":
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("CUDA is not available")
            import transformer_engine  # noqa: F401  (megatron's wrappers import without it and fail later)
            from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TENorm, TERowParallelLinear
        except Exception as err:  # TE raises more than ImportError when CUDA libraries are missing
            raise ImportError(
                "model.backend='te' needs TransformerEngine on a CUDA machine "
                "(pip install 'audiollm[gpu]'); use model.backend='local' on CPU"
            ) from err
        return TEColumnParallelLinear, TERowParallelLinear, TENorm
    raise ValueError(f"model.backend={backend!r} is not one of {BACKENDS}")


def decoder_layer_spec(backend: str = "local", attention: str = "reference", core_attention=None,
                      family: str = "gemma2") -> ModuleSpec:
    """One layer of the decoder `family` (orchestrator/plan/decoder_families.py): Gemma2's
    sandwich-normed layer, or with the post-norms left out (IdentityOp) and Llama's plain
    RMSNorm, a pre-norm Llama layer (Qwen's: with QKV biases, set by the config's
    add_qkv_bias, or with QK-norm). `core_attention` (a class) replaces the `attention`
    kernel's: the tests' known-mistake controls use it; no configuration can."""
    column, row, norm = _modules(backend)
    traits = FAMILIES[family]
    if norm is ZeroCenteredRMSNorm and not traits.zero_centered_norm:
        norm = RMSNorm  # TENorm reads which norm from the config (layernorm_zero_centered_gamma)
    post_norm = norm if traits.sandwich_norms else IdentityOp
    # QK-norm (Qwen3): megatron's attention normalises each head's queries and keys after
    # the QKV split and before RoPE, as HF does; megatron's finalize_model_grads sums these
    # norms' gradients over TP (each rank holds other heads) when the config's qk_layernorm is set.
    head_norm = norm if traits.qk_norm else None
    if attention not in ATTENTION_CLASSES:
        raise ValueError(f"attention={attention!r} is not one of {tuple(ATTENTION_CLASSES)}")
    return ModuleSpec(
        module=DecoderTransformerLayer,
        submodules=DecoderLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=column, core_attention=core_attention or ATTENTION_CLASSES[attention], linear_proj=row,
                    q_layernorm=head_norm, k_layernorm=head_norm,
                ),
            ),
            post_attention_layernorm=post_norm,
            pre_mlp_layernorm=norm,
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=column, linear_fc2=row)),
            post_mlp_layernorm=post_norm,
        ),
    )


def decoder_block_spec(config, backend: str = "local", vp_stage=None, pp_rank=None, attention: str = "reference",
                      core_attention=None) -> TransformerBlockSubmodules:
    """The layers of this pipeline stage plus the final zero-centred RMSNorm."""
    layer = decoder_layer_spec(backend, attention, core_attention, getattr(config, "decoder_family", "gemma2"))
    count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer] * count, layer_norm=layer.submodules.input_layernorm)
