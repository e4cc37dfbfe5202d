"""Conversion of full-size gemma-2-2b + whisper-large-v3 shapes: time, peak memory, --verify.

Nothing can be downloaded here, so the models are built from the published configs
(conf/model/gemma2_2b_whisper_large_v3.yaml holds the same shapes) with random bf16
weights and saved with save_pretrained; then `audiollm convert hf-to-megatron` runs
as its own process (peak RSS of that process), and `--verify` loads the converted
checkpoint as a job does and compares its logits with HF's (bf16 on both sides).

Run: .venv/bin/python benchmarks/convert_full_size.py WORK_DIR [--verify-tp 1] [--seq-len 128]
Needs ~12 GB of disk in WORK_DIR and ~14 GB of memory for --verify.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

GEMMA2_2B = dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                 sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                 max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                 hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1, bos_token_id=2)
WHISPER_LARGE_V3 = dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                        decoder_layers=32, decoder_attention_heads=20, decoder_ffn_dim=5120, num_mel_bins=128,
                        vocab_size=51866, max_source_positions=1500, max_target_positions=448)


def make_models(root: Path) -> None:
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, WhisperConfig, WhisperModel

    torch.manual_seed(0)
    if not (root / "gemma2").is_dir():
        model = Gemma2ForCausalLM._from_config(Gemma2Config(**GEMMA2_2B), torch_dtype=torch.bfloat16)
        model.save_pretrained(root / "gemma2", safe_serialization=True)
        del model
    if not (root / "whisper").is_dir():
        model = WhisperModel._from_config(WhisperConfig(**WHISPER_LARGE_V3), torch_dtype=torch.bfloat16)
        model.save_pretrained(root / "whisper", safe_serialization=True)


def _child_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--verify-tp", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    root = args.work_dir
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    make_models(root)
    made = time.perf_counter() - start
    cli = [sys.executable, "-m", "orchestrator.cli", "convert", "hf-to-megatron", "--hf", str(root / "gemma2"),
           "--whisper", str(root / "whisper"), "--out", str(root / "converted")]
    start = time.perf_counter()
    subprocess.run(cli, check=True)
    convert_s = time.perf_counter() - start
    convert_peak = _child_peak_gib()
    sizes = {name: sum(p.stat().st_size for p in (root / name).rglob("*") if p.is_file()) / 1024**3
             for name in ("gemma2", "whisper", "converted")}
    from orchestrator.convert.verify import verify

    start = time.perf_counter()
    result = verify(root / "gemma2", root / "converted", tp=args.verify_tp, seq_len=args.seq_len, dtype="bfloat16")
    verify_s = time.perf_counter() - start
    rows = [("random HF models made (bf16)", f"{made:.0f} s"),
            ("HF gemma-2-2b / whisper-large-v3 on disk", f"{sizes['gemma2']:.2f} / {sizes['whisper']:.2f} GiB"),
            ("converted checkpoint on disk", f"{sizes['converted']:.2f} GiB"),
            ("hf-to-megatron wall time", f"{convert_s:.0f} s"),
            ("hf-to-megatron peak RSS", f"{convert_peak:.2f} GiB"),
            (f"--verify (bf16, tp={args.verify_tp}, batch 2 x {args.seq_len} tokens) wall time", f"{verify_s:.0f} s"),
            ("--verify max |logit diff|", f"{result['max_abs_logit_diff']:.4g}"),
            ("--verify loss HF / megatron", f"{result['loss_hf']:.5f} / {result['loss_megatron']:.5f}"),
            ("peak RSS of any child (verify workers included)", f"{_child_peak_gib():.2f} GiB")]
    width = max(len(r[0]) for r in rows)
    print(f"| {'what':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for what, value in rows:
        print(f"| {what:<{width}} | {value} |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
