"""Numerical check of a conversion: a HF decoder of a family (alone, the decoder of an
AudioLLM model directory, or the language model of a multimodal model or of a released
speech LLM, Voxtral and Qwen2-Audio, run as its own class on text) vs the converted
megatron checkpoint on
the same random tokens, run on tp*pp local processes (torchrun; gloo on CPU) that load
the checkpoint the way a training job does (orchestrator.train.init_weights), at the
layout asked for.

`verify(hf_dir, ckpt_dir, tp, pp)` launches the workers and returns
{max_abs_logit_diff, loss_diff, loss_hf, loss_megatron, tp, pp, seq_len, batch, dtype}.
Worker entry (what verify launches):
    torchrun --nproc_per_node=TP*PP -m orchestrator.convert.verify --hf H --megatron C --tp T --pp P --result R.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

from orchestrator.runtime.ports import free_port

BATCH = 2


def verify(hf_dir: Path, ckpt_dir: Path, tp: int = 1, pp: int = 1, seq_len: Optional[int] = None,
           dtype: str = "float32", timeout: int = 3600) -> dict:
    nproc = tp * pp
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "verify.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "orchestrator.convert.verify",
               "--hf", str(hf_dir), "--megatron", str(ckpt_dir), "--result", str(result_path),
               "--tp", str(tp), "--pp", str(pp), "--dtype", dtype]
        if seq_len:
            cmd += ["--seq-len", str(seq_len)]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not result_path.is_file():
            raise RuntimeError(f"verification workers failed (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}")
        return json.loads(result_path.read_text())


def hf_decoder_section(hf_dir: Path):
    """The model.decoder section of what --verify compares in `hf_dir`: a HF decoder, the
    decoder of an AudioLLM model directory, or a multimodal model's language model.
    Raises ValueError (what the decoder families cannot represent) or FileNotFoundError."""
    from orchestrator.convert.audiollm_dir import MODEL_TYPE
    from orchestrator.convert.decoder_mapping import decoder_config_from_hf, hf_decoder_config
    from orchestrator.convert.hf_io import MULTIMODAL_DECODERS, read_hf_config
    from orchestrator.plan.released_models import released

    config_dict = read_hf_config(hf_dir)
    whole = config_dict.get("model_type") == MODEL_TYPE  # an AudioLLM model directory: its decoder is compared
    # a multimodal model (Gemma 3 from 4b up) or a released speech LLM: its language model is compared
    text_key = ("text_config" if whole or released(config_dict.get("model_type")) else
                MULTIMODAL_DECODERS.get(config_dict.get("model_type"), (None,))[0])
    return decoder_config_from_hf(hf_decoder_config(config_dict[text_key] if text_key else config_dict))


def _worker(args) -> None:
    from megatron.core import parallel_state as ps

    from orchestrator.convert.audiollm_dir import MODEL_TYPE
    from orchestrator.convert.hf_io import read_hf_config
    from orchestrator.convert.megatron_forward import pipeline_forward
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.plan.released_models import released
    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.train.init_weights import load_init_checkpoint

    tp, pp = args.tp, args.pp
    dtype = getattr(torch, args.dtype)
    # Exact fp32 matmuls: an fp32 comparison with HF must not run on TF32.
    device = init_distributed(ParallelDims(tp=tp, pp=pp), seed=0, allow_tf32=False)
    model_type = read_hf_config(args.hf).get("model_type")
    whole, speech_llm = model_type == MODEL_TYPE, released(model_type)
    dec = hf_decoder_section(args.hf)
    config = decoder_transformer_config(dec, ParallelDims(tp=tp, pp=pp), dtype)
    model = DecoderModel(config, dec.vocab_size, dec.max_position_embeddings, pre_process=ps.is_pipeline_first_stage(),
                        post_process=ps.is_pipeline_last_stage(), rope_theta=dec.rope_theta,
                        tie_embeddings=dec.tie_embeddings).eval()
    # The base model is compared: LoRA factors it holds (an imported PEFT adapter) are left out.
    load_init_checkpoint(args.megatron, [model], prefix="language_model.", lora=True)
    seq = args.seq_len or min(2 * (dec.sliding_window or 64), dec.max_position_embeddings)
    tokens = torch.randint(0, dec.vocab_size, (BATCH, seq), generator=torch.Generator().manual_seed(1234)).to(device)
    positions = torch.arange(seq, device=device)[None].expand(BATCH, -1)
    labels = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    logits = pipeline_forward(model, lambda m: m(tokens, positions, None), seq, BATCH)
    token_loss = pipeline_forward(model, lambda m: m(tokens, positions, None, labels=labels), seq, BATCH,
                                  gather_vocab=False)
    if logits is not None and ps.get_tensor_model_parallel_rank() == 0:
        import transformers
        from transformers import AutoModelForCausalLM

        if speech_llm:  # the released class, on text alone: its language model and output layer
            hf = getattr(transformers, speech_llm.hf_class).from_pretrained(args.hf, torch_dtype=dtype)
        elif whole:
            hf = AutoModelForCausalLM.from_pretrained(args.hf, torch_dtype=dtype, trust_remote_code=True).language_model
        else:  # the decoder's own class (Gemma2ForCausalLM, ..., or the multimodal one); eager: Gemma2's softcap
            hf = AutoModelForCausalLM.from_pretrained(args.hf, torch_dtype=dtype, attn_implementation="eager")
        hf = hf.to(device).eval()
        with torch.no_grad():
            ref = hf(tokens, labels=tokens)
        loss = token_loss[:, :-1].float().mean().item()
        result = {"max_abs_logit_diff": (logits[..., : dec.vocab_size].float() - ref.logits.float()).abs().max().item(),
                  "loss_diff": abs(loss - ref.loss.item()), "loss_hf": ref.loss.item(), "loss_megatron": loss,
                  "tp": tp, "pp": pp, "seq_len": seq, "batch": BATCH, "dtype": args.dtype}
        Path(args.result).write_text(json.dumps(result))
    shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.convert.verify")
    parser.add_argument("--hf", required=True, type=Path)
    parser.add_argument("--megatron", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    _worker(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
