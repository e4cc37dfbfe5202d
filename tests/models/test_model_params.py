"""The analytic parameter inventory (pure Python) on composed configs, with LoRA."""

import subprocess
import sys

from orchestrator.plan.compose import compose
from orchestrator.plan.model_params import audio_token_count, parameter_inventory
from tests.distributed_run import REPO


def test_model_params_does_not_import_torch():
    code = "import sys, orchestrator.plan.model_params; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_gemma2_9b_whisper_large_v3_counts_match_the_published_models():
    cfg = compose(["+recipe=gemma2_whisper_tp4pp2"])
    inv = parameter_inventory(cfg.model, cfg.lora, tp=cfg.parallel.tp)
    count = {c: sum(p.numel for p in inv if p.component == c) for c in ("encoder", "adapter", "decoder", "embedding")}
    assert count["decoder"] + count["embedding"] == 9_241_705_984  # HF gemma-2-9b (vocab 256000 needs no padding at tp=4)
    assert count["encoder"] == 636_968_960  # HF whisper-large-v3 encoder incl. the 1500x1280 position table
    assert count["adapter"] == 32 + 2 * 1280 + 6400 * 6400 + 6400 + 3584 * 6400 + 3584
    assert len({p.name for p in inv}) == len(inv)
    qkv = next(p for p in inv if p.name == "language_model.decoder.layers.0.self_attention.linear_qkv.weight")
    assert qkv.shape == ((16 + 2 * 8) * 256, 3584) and qkv.tp_split_dim == 0
    proj = next(p for p in inv if p.name.endswith("layers.0.self_attention.linear_proj.weight"))
    assert proj.tp_split_dim == 1
    assert not next(p for p in inv if p.name == "encoder.embed_positions.weight").trainable
    assert audio_token_count(2 * cfg.model.encoder.max_source_positions, cfg.model.adapter.frame_stack) == 300


def test_llama_3_1_8b_whisper_large_v3_counts_match_the_published_model():
    cfg = compose(["+recipe=gemma2_whisper_tp1", "model=llama3_1_8b_whisper_large_v3", "lora=none"])
    inv = parameter_inventory(cfg.model, cfg.lora, tp=cfg.parallel.tp)
    count = {c: sum(p.numel for p in inv if p.component == c) for c in ("decoder", "embedding")}
    # HF Llama-3.1-8B: embedding and output layer of 128256 x 4096 (no padding at tp=1), two
    # norms and no biases per layer
    assert count["decoder"] + count["embedding"] == 8_030_261_248
    assert "language_model.output_layer.weight" in {p.name for p in inv}


def test_qwen2_5_7b_and_qwen3_8b_counts_match_the_published_models():
    counts = {}
    for model in ("qwen2_5_7b_whisper_large_v3", "qwen3_8b_whisper_large_v3"):
        cfg = compose(["+recipe=gemma2_whisper_tp1", f"model={model}", "lora=none"])
        inv = parameter_inventory(cfg.model, cfg.lora, tp=cfg.parallel.tp)
        counts[model] = {p.name: p for p in inv if p.component in ("decoder", "embedding")}
    qwen2, qwen3 = counts.values()
    # HF Qwen2.5-7B: q/k/v biases, untied 152064 x 3584 output layer
    assert sum(p.numel for p in qwen2.values()) == 7_615_616_512
    assert qwen2["language_model.decoder.layers.0.self_attention.linear_qkv.bias"].shape == ((28 + 2 * 4) * 128,)
    # HF Qwen3-8B: QK-norms of head_dim 128, no biases, untied 151936 x 4096 output layer
    assert sum(p.numel for p in qwen3.values()) == 8_190_735_360
    assert qwen3["language_model.decoder.layers.0.self_attention.q_layernorm.weight"].shape == (128,)
    assert not any(name.endswith(".bias") for name in qwen3)


def test_gemma3_4b_counts_match_the_published_language_model():
    cfg = compose(["+recipe=gemma2_whisper_tp1", "model=gemma3_4b_whisper_large_v3", "lora=none"])
    inv = {p.name: p for p in parameter_inventory(cfg.model, cfg.lora, tp=cfg.parallel.tp)
           if p.component in ("decoder", "embedding")}
    # HF gemma-3-4b's language model: sandwich norms and QK-norms of head_dim 256, tied
    # 262208 x 2560 embeddings (padded to 262272 rows at tp=1: 64 x 2560 more)
    assert sum(p.numel for p in inv.values()) == 3_880_263_168 + 64 * 2560
    assert inv["language_model.decoder.layers.0.self_attention.k_layernorm.weight"].shape == (256,)
    assert "language_model.decoder.layers.0.post_mlp_layernorm.weight" in inv
    assert "language_model.output_layer.weight" not in inv


def test_lora_names_follow_the_contract():
    cfg = compose(["+recipe=tiny_cpu", "lora=decoder_r16"])
    inv = {p.name: p for p in parameter_inventory(cfg.model, cfg.lora)}
    base = "language_model.decoder.layers.1.mlp.linear_fc1"
    assert inv[base + ".weight"].shape == (2 * 384, 128)
    assert inv[base + ".lora_a.weight"].shape == (16, 128) and inv[base + ".lora_a.weight"].tp_split_dim is None
    assert inv[base + ".lora_b.weight"].shape == (768, 16) and inv[base + ".lora_b.weight"].tp_split_dim == 0
    fc2_a = inv["language_model.decoder.layers.1.mlp.linear_fc2.lora_a.weight"]
    assert fc2_a.shape == (16, 384) and fc2_a.tp_split_dim == 1
    lora = [n for n in inv if ".lora_" in n]
    assert len(lora) == 4 * 4 * 2 and all(n.startswith("language_model.") for n in lora)


def test_lora_on_encoder_and_adapter():
    cfg = compose(["+recipe=tiny_cpu", "lora=decoder_r16", "lora.encoder=true", "lora.adapter=true"])
    names = {p.name for p in parameter_inventory(cfg.model, cfg.lora)}
    assert "encoder.layers.0.self_attn.q_proj.lora_a.weight" in names
    assert "adapter.linear_2.lora_b.weight" in names
