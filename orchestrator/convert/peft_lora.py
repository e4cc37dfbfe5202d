"""The decoder's LoRA factors <-> a PEFT LoRA adapter of the decoder's HF causal LM (each
family's: the same module names in all).

    adapter_config.json        peft_type LORA, r, lora_alpha, target_modules (HF names)
    adapter_model.safetensors  base_model.model.model.layers.<i>.<module>.lora_{A,B}.weight
                               (a released speech LLM's class: base_model.model.language_model.
                               model.layers..., its target_modules a pattern of the decoder's alone)

`PeftModel.from_pretrained(Gemma2ForCausalLM, DIR)` (or the family's class, or
VoxtralForConditionalGeneration / Qwen2AudioForConditionalGeneration) loads it (the format serving stacks
that take PEFT adapters read; only PEFT itself is tested here). The project's LoRA sits on megatron's fused linears
(orchestrator/train/lora.py), one rank and alpha for all, and PEFT's on HF's separate
ones, so (per layer; the row layouts are those of orchestrator/convert/decoder_mapping):

  megatron (A [r, in], B [out, r])        PEFT
  self_attention.linear_qkv               self_attn.q_proj, k_proj, v_proj: each A; its rows of B
  self_attention.linear_proj              self_attn.o_proj
  mlp.linear_fc1 ([gate; up])             mlp.gate_proj, up_proj: each A; its half of B
  mlp.linear_fc2                          mlp.down_proj

Out, every part gets the fused A and its rows of B: the same update B A, exactly.
In, an adapter made by this project (the parts of a fused linear share one A) comes back
at its rank. An adapter made elsewhere has its own A per part, or adapts only some parts
(q_proj and v_proj is common): the fused factors then stack the parts' A and place each
part's B in its rows and its own columns (zeros elsewhere), which is the same update at
rank r x parts; every linear is zero-padded to the largest such rank R, and alpha becomes
alpha x R / r so that alpha / rank, the scaling, is unchanged. The model computes what the
adapter computes. Fine-tuning on trains it as one fused LoRA of that rank: the padding
(a zero row of A with the zero column of B it meets) gets zero gradients and stays zero,
but B's zero blocks between parts may grow, which separate per-part adapters cannot;
an adapter exported again is a PEFT adapter of rank R. Adapters with per-module ranks or alphas
(rank_pattern, alpha_pattern), DoRA, rsLoRA or biases are refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from orchestrator.convert.decoder_mapping import DecoderShape

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
# PEFT names a module by its path in the model it wraps: the decoder's layers are model.layers
# in a causal LM, language_model.model.layers in a released speech LLM's class (transformers 4).
DECODER_LAYERS = "model.layers."
RELEASED_DECODER_LAYERS = "language_model.model.layers."
_MEGATRON = re.compile(r"^decoder\.layers\.(\d+)\.(self_attention\.linear_qkv|self_attention\.linear_proj|"
                       r"mlp\.linear_fc1|mlp\.linear_fc2)\.lora_([ab])\.weight$")
# megatron linear -> its HF parts, in the order of their rows in the fused weight
PARTS = {"self_attention.linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attention.linear_proj": ("self_attn.o_proj",),
         "mlp.linear_fc1": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.linear_fc2": ("mlp.down_proj",)}


def _row_blocks(linear: str, rows: torch.Tensor, shape: DecoderShape) -> List[torch.Tensor]:
    """The fused linear's rows [out, ...] split into its HF parts' rows, in PARTS order."""
    if linear == "self_attention.linear_qkv":
        g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
        q, k, v = torch.split(rows.reshape(g, (rep + 2) * d, -1), [rep * d, d, d], dim=1)
        return [t.reshape(-1, rows.shape[-1]) for t in (q, k, v)]
    if linear == "mlp.linear_fc1":
        return list(torch.chunk(rows, 2, dim=0))
    return [rows]


def _fused_rows(linear: str, blocks: List[torch.Tensor], shape: DecoderShape) -> torch.Tensor:
    """Inverse of _row_blocks."""
    if linear == "self_attention.linear_qkv":
        g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
        q, k, v = (b.reshape(g, n, -1) for b, n in zip(blocks, (rep * d, d, d)))
        return torch.cat([q, k, v], dim=1).reshape(-1, blocks[0].shape[-1])
    return torch.cat(blocks, dim=0)


def _part_out_sizes(linear: str, shape: DecoderShape) -> List[int]:
    if linear == "self_attention.linear_qkv":
        return [shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim,
                shape.num_kv_heads * shape.head_dim]
    if linear == "mlp.linear_fc1":
        return [shape.ffn_hidden_size, shape.ffn_hidden_size]
    return [shape.hidden_size]


def megatron_lora_to_peft(state: Dict[str, torch.Tensor], shape: DecoderShape, rank: int, alpha: float,
                          dropout: float = 0.0, layers: str = DECODER_LAYERS) -> Tuple[Dict[str, torch.Tensor], dict]:
    """(PEFT tensors, adapter_config) of the decoder's LoRA factors in `state` (full TP=1
    tensors, names without `language_model.`), for a model whose decoder layers are at
    `layers` (DECODER_LAYERS or RELEASED_DECODER_LAYERS). Raises if there are none."""
    factors: Dict[Tuple[int, str], Dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        match = _MEGATRON.match(name)
        if match:
            factors.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    if not factors:
        raise ValueError("the checkpoint has no LoRA factors on the decoder's linears: nothing to write as PEFT")
    out: Dict[str, torch.Tensor] = {}
    targets = set()
    for (layer, linear), ab in sorted(factors.items()):
        for part, b_rows in zip(PARTS[linear], _row_blocks(linear, ab["b"], shape)):
            module = part.rsplit(".", 1)[-1]
            targets.add(module)
            out[f"base_model.model.{layers}{layer}.{part}.lora_A.weight"] = ab["a"].clone()  # no shared storage
            out[f"base_model.model.{layers}{layer}.{part}.lora_B.weight"] = b_rows.contiguous()
    # Beside an audio tower (Whisper's attention has q_proj, k_proj, v_proj too) the targets are
    # the decoder's modules alone: a pattern PEFT matches against each module's whole path.
    targets = sorted(targets) if layers == DECODER_LAYERS else \
        rf"{re.escape(layers)}\d+\.(self_attn|mlp)\.({'|'.join(sorted(targets))})"
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(rank), "lora_alpha": float(alpha),
              "lora_dropout": float(dropout), "target_modules": targets, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "inference_mode": True,
              "base_model_name_or_path": None, "modules_to_save": None}
    return out, config


def write_peft_adapter(out_dir: Path, tensors: Dict[str, torch.Tensor], config: dict) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / PEFT_WEIGHTS), metadata={"format": "pt"})
    (out_dir / PEFT_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def read_peft_adapter(adapter_dir: Path) -> Tuple[Dict[str, torch.Tensor], dict]:
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    for name in (PEFT_CONFIG, PEFT_WEIGHTS):
        if not (adapter_dir / name).is_file():
            raise FileNotFoundError(f"{adapter_dir / name} not found: --peft must be a PEFT LoRA adapter directory "
                                    f"({PEFT_CONFIG} + {PEFT_WEIGHTS}, as PeftModel.save_pretrained writes)")
    config = json.loads((adapter_dir / PEFT_CONFIG).read_text())
    return load_file(str(adapter_dir / PEFT_WEIGHTS)), config


def _check_peft_config(config: dict) -> Tuple[int, float]:
    problems = []
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, not 'LORA'")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            problems.append(f"{key} gives modules their own rank or alpha ({config[key]}); the project has one of each")
    for key in ("use_dora", "use_rslora"):
        if config.get(key):
            problems.append(f"{key} is set (not plain LoRA)")
    if config.get("bias", "none") != "none":
        problems.append(f"bias={config['bias']!r} trains biases (Gemma2 has none)")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save={config['modules_to_save']} (whole modules, not LoRA)")
    if problems:
        raise ValueError("the PEFT adapter cannot become the project's LoRA: " + "; ".join(problems))
    return int(config["r"]), float(config["lora_alpha"])


def peft_to_megatron_lora(tensors: Dict[str, torch.Tensor], config: dict, shape: DecoderShape
                          ) -> Tuple[Dict[str, torch.Tensor], int, float]:
    """(megatron LoRA factors at TP=1, names without `language_model.`; rank; alpha) of a
    PEFT adapter (see the module docstring for ranks and alpha)."""
    rank, alpha = _check_peft_config(config)
    part_of = {part: (linear, i) for linear, parts in PARTS.items() for i, part in enumerate(parts)}
    found: Dict[Tuple[int, str], Dict[int, Dict[str, torch.Tensor]]] = {}
    pattern = re.compile(r"^base_model\.model\.(?:language_model\.)?model\.layers\.(\d+)\.(self_attn\.\w+|mlp\.\w+)"
                         r"\.lora_([AB])(?:\.default)?\.weight$")
    unknown = []
    for name, tensor in tensors.items():
        match = pattern.match(name)
        if not match or match.group(2) not in part_of or int(match.group(1)) >= shape.num_layers:
            unknown.append(name)
            continue
        linear, index = part_of[match.group(2)]
        found.setdefault((int(match.group(1)), linear), {}).setdefault(index, {})[match.group(3)] = tensor
    if unknown:
        raise ValueError(f"the PEFT adapter holds tensors that are no LoRA factor of this Gemma2's layers: "
                         f"{sorted(unknown)[:8]}")
    if not found:
        raise ValueError("the PEFT adapter holds no LoRA factors")
    fused: Dict[Tuple[int, str], Tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, linear), parts in sorted(found.items()):
        sizes = _part_out_sizes(linear, shape)
        for i, ab in parts.items():
            if set(ab) != {"A", "B"} or ab["A"].shape[0] != rank or ab["B"].shape != (sizes[i], rank):
                raise ValueError(f"layer {layer} {PARTS[linear][i]}: LoRA factors {sorted(ab)} of shapes "
                                 f"{[tuple(t.shape) for t in ab.values()]} do not fit r={rank} and out={sizes[i]}")
        shared = len(parts) == len(sizes) and all(torch.equal(parts[i]["A"], parts[0]["A"]) for i in parts)
        if shared:  # the project's own export: one A, B rows in place
            fused[(layer, linear)] = (parts[0]["A"], _fused_rows(linear, [parts[i]["B"] for i in range(len(sizes))],
                                                                 shape))
            continue
        a = torch.cat([parts[i]["A"] for i in sorted(parts)], dim=0)  # [r x parts, in]
        blocks, column = [], 0
        for i, size in enumerate(sizes):
            block = a.new_zeros((size, a.shape[0]))
            if i in parts:
                block[:, column:column + rank] = parts[i]["B"]
                column += rank
            blocks.append(block)
        fused[(layer, linear)] = (a, _fused_rows(linear, blocks, shape))
    top = max(a.shape[0] for a, _ in fused.values())
    out: Dict[str, torch.Tensor] = {}
    for (layer, linear), (a, b) in fused.items():
        pad = top - a.shape[0]
        base = f"decoder.layers.{layer}.{linear}"
        out[base + ".lora_a.weight"] = torch.cat([a, a.new_zeros((pad, a.shape[1]))]).contiguous()
        out[base + ".lora_b.weight"] = torch.cat([b, b.new_zeros((b.shape[0], pad))], dim=1).contiguous()
    return out, top, alpha * top / rank


def lora_targets(tensors: Dict[str, torch.Tensor]) -> List[str]:
    """The megatron linears (lora.targets names) that carry factors in `tensors`."""
    return sorted({m.group(2).rsplit(".", 1)[-1] for m in map(_MEGATRON.match, tensors) if m})
