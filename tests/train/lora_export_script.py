"""The project's own logits of a trained LoRA run (adapters unmerged, checkpoint read at
TP=1 as `audiollm eval` reads it) vs HF Gemma2's logits of its `megatron-to-hf` export
(LoRA merged), on the same random tokens, fp32; with PEFT_EXPORT_DIR (an export with
`--lora peft`) also PEFT's logits of its un-merged base + peft_lora/ adapter.

Run: python tests/train/lora_export_script.py RUN_DIR EXPORT_DIR PRETRAINED_HF_DIR [PEFT_EXPORT_DIR]
Prints `RESULT {"max_abs_logit_diff", "lora_effect", "lora_modules"[, "peft_vs_merged", "peft_base_vs_base"]}`.
"""

import json
import sys

import torch


def main() -> None:
    from transformers import Gemma2ForCausalLM

    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import checkpoint as ckpt
    from orchestrator.train.entry import make_trainer
    from orchestrator.eval.evaluate import single_process_env, single_rank_plan
    from orchestrator.plan.resolved import Plan

    run_dir, export, pretrained = sys.argv[1:4]
    single_process_env()
    trainer = make_trainer(run_dir, plan=single_rank_plan(Plan.load(run_dir)), training=False)
    ckpt.load_model_weights(ckpt.latest_checkpoint(run_dir), trainer.chunks)
    model = trainer.chunks[0].eval()
    lora_modules = sum(1 for m in model.modules() if getattr(m, "lora_enabled", False))
    vocab = model.language_model.real_vocab_size
    tokens = torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(7))
    tokens[tokens == model.audio_token_id] = 0  # text only: the decoder is what the merge changed
    positions = torch.arange(tokens.shape[1])[None].expand(2, -1)
    with torch.no_grad():
        ours = model(tokens, positions, None)[..., :vocab]
        merged = Gemma2ForCausalLM.from_pretrained(export, attn_implementation="eager").eval()(tokens).logits
        base = Gemma2ForCausalLM.from_pretrained(pretrained, attn_implementation="eager").eval()(tokens).logits
    result = {"max_abs_logit_diff": (ours - merged).abs().max().item(),
              "lora_effect": (merged - base).abs().max().item(), "lora_modules": lora_modules}
    if len(sys.argv) > 4:
        from peft import PeftModel

        with torch.no_grad():
            unmerged = Gemma2ForCausalLM.from_pretrained(sys.argv[4], attn_implementation="eager").eval()
            result["peft_base_vs_base"] = (unmerged(tokens).logits - base).abs().max().item()
            peft = PeftModel.from_pretrained(unmerged, f"{sys.argv[4]}/peft_lora").eval()
            result["peft_vs_merged"] = (peft(tokens).logits - merged).abs().max().item()
    print("RESULT " + json.dumps(result), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
