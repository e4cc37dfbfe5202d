"""One training step of the job under test (torchrun), with every torch.distributed
collective and point-to-point send wrapped to sum its payload by process group.
Usage: comm_count_script.py RUN_DIR. Each rank writes RUN_DIR/comm-rank{R}.json:
{"stage", "bytes": {kind: {collective: bytes}}, "widths": [micro-batch token widths],
"schedule": [[F or B, model chunk, micro-batch], ...] in the order the rank ran them,
"trainable_tensors", "model_chunks"}. Collectives on a group of one rank move nothing and
are not counted; those on groups other than megatron's TP, CP, DP, PP and embedding
groups count as "other".

megatron binds some collectives to module-level names at import (`dist_all_gather_func`):
where it was imported before this script ran (the tests' ranks fork from a process that
imported it, tests/zygote.py), those names are rebound to the wrappers too."""

import inspect
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

COUNTING = {"on": False}
COUNTS: dict = {}
_INSIDE = {"depth": 0}
_GROUP_KINDS: list = []  # (ProcessGroup, kind), filled once megatron's groups exist


def _kind(group) -> str:
    for candidate, kind in _GROUP_KINDS:
        if group is candidate:
            return kind
    return "other"


def _record(kind: str, collective: str, nbytes: int, group=None) -> None:
    # A group of one rank moves nothing (megatron still calls the collective at DP = 1).
    if COUNTING["on"] and (group is None or dist.get_world_size(group) > 1):
        entry = COUNTS.setdefault(kind, {})
        entry[collective] = entry.get(collective, 0) + nbytes


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _wrap(name: str, collective: str, payload) -> None:
    original = getattr(dist, name)
    signature = inspect.signature(original)

    def wrapped(*args, **kwargs):
        # The job's CPU layer (a TorchFunctionMode) re-dispatches isend to the public
        # function, i.e. this wrapper: count the outermost call only.
        if _INSIDE["depth"]:
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs)
        group = bound.arguments.get("group")
        _record(_kind(group), collective, payload(bound.arguments), group)
        _INSIDE["depth"] += 1
        try:
            return original(*args, **kwargs)
        finally:
            _INSIDE["depth"] -= 1

    setattr(dist, name, wrapped)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(("megatron.", "orchestrator.")):
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, wrapped)


_wrap("all_reduce", "all_reduce", lambda a: _nbytes(a["tensor"]))
_wrap("all_gather_into_tensor", "all_gather", lambda a: _nbytes(a["output_tensor"]))
_wrap("reduce_scatter_tensor", "reduce_scatter", lambda a: _nbytes(a["input"]))
_wrap("all_gather", "all_gather", lambda a: sum(_nbytes(t) for t in a["tensor_list"]))
_wrap("broadcast", "broadcast", lambda a: _nbytes(a["tensor"]))
_wrap("send", "send", lambda a: _nbytes(a["tensor"]))
_wrap("isend", "send", lambda a: _nbytes(a["tensor"]))
# P2POp accepts only distributed_c10d's own isend/irecv, and batch_isend_irecv calls
# each op's function: the wrapped isend stands there too, so batched sends count once.
c10d.isend = dist.isend


def _record_schedule(trainer) -> list:
    """megatron's forwards and backwards on this rank, in order: [kind, model chunk,
    micro-batch]. The schedules call `forward_step` and `backward_step` through their
    module's globals; a backward is matched to its forward by the output it consumes."""
    from megatron.core.pipeline_parallel import schedules

    events, counts, outputs = [], {}, {}
    forward, backward = schedules.forward_step, schedules.backward_step

    def forward_step(*args, **kwargs):
        model = kwargs["model"] if "model" in kwargs else args[2]
        chunk = next(i for i, c in enumerate(trainer.chunks) if c is model)
        microbatch = counts[chunk] = counts.get(chunk, -1) + 1
        result = forward(*args, **kwargs)
        outputs[id(result[0])] = (chunk, microbatch)
        events.append(["F", chunk, microbatch])
        return result

    def backward_step(input_tensor, output_tensor, *args, **kwargs):
        events.append(["B", *outputs[id(output_tensor)]])
        return backward(input_tensor, output_tensor, *args, **kwargs)

    schedules.forward_step, schedules.backward_step = forward_step, backward_step
    return events


def main() -> int:
    run_dir = Path(sys.argv[1])
    from megatron.core import parallel_state as ps

    from orchestrator.runtime.distributed import shutdown
    from orchestrator.train import entry
    from orchestrator.train.audiollm_provider import trimmed_width
    from orchestrator.plan.resolved import Plan

    entry.setup_logging(int(os.environ["RANK"]))
    plan = Plan.load(run_dir)
    trainer = entry.make_trainer(run_dir, None, plan=plan)
    _GROUP_KINDS.extend([
        (ps.get_tensor_model_parallel_group(), "tp"),
        (ps.get_context_parallel_group(), "cp"),
        (ps.get_data_parallel_group(with_context_parallel=True), "dp"),
        (ps.get_data_parallel_group(), "dp"),
        (ps.get_pipeline_model_parallel_group(), "pp"),
        (ps.get_embedding_group(), "pp"),
    ])
    widths = []
    source = trainer.components.train_source
    next_microbatch = source.next_microbatch

    parallel = SimpleNamespace(**{k: plan.section("parallel")[k] for k in ("tp", "pp", "cp")})

    def recorded():
        batch = next_microbatch()
        widths.append(trimmed_width(batch.get("cp_unsplit", batch), parallel))  # as the model runs it
        return batch

    source.next_microbatch = recorded
    events = _record_schedule(trainer)
    dist.barrier()
    COUNTING["on"] = True
    trainer.train_step()
    COUNTING["on"] = False
    dist.barrier()
    rank = dist.get_rank()
    (run_dir / f"comm-rank{rank}.json").write_text(json.dumps({
        "stage": ps.get_pipeline_model_parallel_rank(), "bytes": COUNTS, "widths": widths, "schedule": events,
        # what bounds megatron's padding of its gradient buffers (one buffer per chunk and dtype)
        "trainable_tensors": sum(p.requires_grad for c in trainer.unwrapped for p in c.parameters()),
        "model_chunks": len(trainer.chunks)}))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
