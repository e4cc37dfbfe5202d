"""Greedy decoding speed with the KV cache and without it (CPU, fp32, one process).

    PYTHONPATH=. python benchmarks/decoding.py [--models tiny_audiollm,gemma2_2b_whisper_large_v3]
        [--new 32,128] [--prompt 320] [--batch 4] [--uncached-steps 0]

Each model section (conf/model/<name>.yaml, random weights) is built by the job's own
`build_audiollm` and decodes `--batch` prompts of `--prompt` tokens (320: a 30-s clip's
300 audio tokens plus a short text turn) for each `--new` count, through
orchestrator.models.generate.greedy_generate with use_cache true and false. The prompts
are text ids: the audio embeddings are fused once at the prefill on both paths, and the
encoder that makes them runs once per call on both, so it is left out of what is timed.
No row stops early (no stop id can occur), so every row decodes exactly N tokens.

Without the cache every new token re-runs the decoder over the whole sequence, so a run
at the gemma2-2b shape takes long on a CPU: `--uncached-steps K` decodes only the first K
tokens without the cache and reports its tokens/s over those (the later, longer steps
are slower still, so the ratio it prints is a lower bound). Prints one table.
"""

from __future__ import annotations

import argparse
import time


def _build(model_name: str):
    from orchestrator.plan.compose import compose
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.plan.resolve import resolve, to_object
    from orchestrator.train.megatron_config import transformer_config

    cfg = to_object(compose([f"model={model_name}", "model.backend=local", "model.init_checkpoint=null",
                             "model.allow_frozen_random=true", "launcher.accelerator=cpu"]))
    return build_audiollm(cfg.model, transformer_config(resolve(cfg), on_gpu=False),
                          audio_token_id=cfg.model.decoder.vocab_size - 1,
                          on_gpu=False).eval(), cfg.model.decoder.vocab_size


def _timed(model, prompts, new_tokens: int, use_cache: bool) -> float:
    from orchestrator.models.generate import greedy_generate

    start = time.perf_counter()
    out = greedy_generate(model, prompts, None, None, stop_ids=[-1], max_new_tokens=new_tokens, use_cache=use_cache)
    seconds = time.perf_counter() - start
    assert all(len(row) == new_tokens for row in out), "a row stopped early"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny_audiollm,gemma2_2b_whisper_large_v3")
    parser.add_argument("--new", default="32,128", help="new tokens per row, comma-separated")
    parser.add_argument("--prompt", type=int, default=320, help="prompt tokens per row")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--uncached-steps", type=int, default=0,
                        help="decode only this many tokens without the cache (0: as many as with it)")
    args = parser.parse_args()

    import torch

    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.eval.evaluate import single_process_env

    single_process_env()
    init_distributed(ParallelDims(), seed=0)
    rows = []
    for name in args.models.split(","):
        started = time.perf_counter()
        model, vocab = _build(name)
        built = time.perf_counter() - started
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(1, vocab - 1, (args.batch, args.prompt), generator=gen).tolist()
        _timed(model, prompts, 2, True)  # first call: one-time costs out of the figures
        for new in (int(n) for n in args.new.split(",")):
            cached = _timed(model, prompts, new, True)
            steps = min(new, args.uncached_steps) if args.uncached_steps else new
            uncached = _timed(model, prompts, steps, False)
            rate_cached, rate_uncached = args.batch * new / cached, args.batch * steps / uncached
            rows.append((name, new, steps, rate_cached, rate_uncached, rate_cached / rate_uncached, built))
        del model
    print(f"\nbatch {args.batch} x prompt {args.prompt} tokens, fp32, {torch.get_num_threads()} threads\n")
    print("| model | new tokens | uncached tokens timed | tokens/s cached | tokens/s uncached | speed-up | build s |")
    print("|---|---|---|---|---|---|---|")
    for name, new, steps, rc, ru, ratio, built in rows:
        print(f"| {name} | {new} | {steps} | {rc:.2f} | {ru:.2f} | {ratio:.1f}x | {built:.0f} |")
    shutdown()


if __name__ == "__main__":
    main()
