"""Host cost of a training micro-batch, measured on a CPU: the operators the host dispatches.

Run: .venv/bin/python benchmarks/host_cost.py [--json FILE]
     .venv/bin/torchrun --standalone --nproc-per-node=2 benchmarks/host_cost.py --tp 2 [--sp]

On a GPU without TransformerEngine the step is bound by the host (docs/gpu-machines.md:
about 12,000 kernel launches and 27,000 operators per micro-batch of gemma2-2b +
whisper-large-v3): each operator the host dispatches costs microseconds of Python and
dispatcher time, whatever its size. That count does not depend on a GPU, so a CPU
measures it: the default recipe's tiny model, one packed micro-batch's forward and
backward under torch's profiler, counting the top-level `aten::` operators (those not
called by another operator: what the host dispatches itself; inside a compiled graph only
the calls it makes out to aten, e.g. the matrix products, count, and its fused kernels
do not). Built through the job's own functions from the config keys (model.compile);
warm-up micro-batches first (the compilation), then one counted.

Per decoder and per encoder layer from models of two depths each, then the count at
gemma2-2b + whisper-large-v3 depth (26 decoder, 32 encoder layers): the layers' counts do
not depend on their width. tests/models/test_compile.py bounds these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.runtime.ports import free_port  # noqa: E402  (after the path)

DEPTH_2B = {"decoder": 26, "encoder": 32}  # gemma-2-2b, whisper-large-v3
# (decoder layers, encoder layers) of the models measured: the tiny model's own, and one
# deeper in each part.
DEPTHS = ((4, 2), (6, 2), (4, 4))


def count_operators(compiled: str, decoder_layers: int, encoder_layers: int, layout: tuple = ()) -> int:
    """Top-level aten operators of one micro-batch's forward and backward (on this rank of
    `layout`'s overrides: parallel.tp, parallel.sp)."""
    from omegaconf import OmegaConf
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.models.compile import compile_layers
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve, to_object
    from orchestrator.train.megatron_config import transformer_config
    from orchestrator.probe.role import AUDIO_TOKEN_ID, synthetic_microbatch
    from orchestrator.train.audiollm_provider import model_inputs, trimmed_width
    from orchestrator.train.loop import freeze_model_parts

    composed = compose(["+recipe=tiny_cpu", f"model.compile={compiled}", f"model.decoder.num_layers={decoder_layers}",
                        f"model.encoder.num_layers={encoder_layers}", "data.seq_length=128",
                        "optim.micro_batch_size=2", "model.spec_augment.enabled=false", *layout])
    cfg = to_object(composed)
    model = build_audiollm(cfg.model, transformer_config(resolve(cfg), on_gpu=False),
                           audio_token_id=AUDIO_TOKEN_ID, on_gpu=False).train()
    freeze_model_parts([model], OmegaConf.to_container(composed.model, resolve=True))
    compile_layers(model, cfg.model.compile)
    batch = synthetic_microbatch(cfg)
    inputs = model_inputs(batch, trimmed_width(batch, cfg.parallel), "cpu")

    def micro_batch():
        model(**inputs).sum().backward()
        model.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: compilation, first-call caches
        micro_batch()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        micro_batch()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def measure(compiled: str, layout: tuple = ()) -> dict:
    (base, deeper_decoder, deeper_encoder) = [count_operators(compiled, d, e, layout) for d, e in DEPTHS]
    per_decoder = (deeper_decoder - base) / (DEPTHS[1][0] - DEPTHS[0][0])
    per_encoder = (deeper_encoder - base) / (DEPTHS[2][1] - DEPTHS[0][1])
    rest = base - DEPTHS[0][0] * per_decoder - DEPTHS[0][1] * per_encoder
    return {"compile": compiled, "tiny_total": base, "per_decoder_layer": per_decoder,
            "per_encoder_layer": per_encoder, "rest": rest,
            "at_2b_depth": rest + DEPTH_2B["decoder"] * per_decoder + DEPTH_2B["encoder"] * per_encoder}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (under torchrun with as many ranks)")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism (with --tp > 1)")
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:  # one process of its own; torchrun sets these
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.runtime.distributed import init_distributed, shutdown

    init_distributed(ParallelDims(tp=args.tp), seed=0)
    layout = (f"parallel.tp={args.tp}", f"parallel.sp={str(args.sp).lower()}", f"launcher.gpus_per_node={args.tp}")
    rows = [measure(choice, layout) for choice in ("none", "layers")]
    if int(os.environ["RANK"]) != 0:
        shutdown()
        return 0
    print(f"rank 0 of TP {args.tp}" + (", sequence parallel" if args.sp else ""))
    print("| model.compile | operators per micro-batch (tiny) | per decoder layer | per encoder layer | rest "
          "| at gemma2-2b + whisper-large-v3 depth |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['compile']} | {r['tiny_total']:,} | {r['per_decoder_layer']:,.0f} | {r['per_encoder_layer']:,.0f} "
              f"| {r['rest']:,.0f} | {r['at_2b_depth']:,.0f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
