"""megatron's pipeline schedule as the plan reasons about it: the order of forwards and
backwards on each stage, and the time a step takes through it.

`order` is megatron-core's pipeline_parallel/schedules.py order: 1F1B (warm-up forwards,
then one forward one backward, then the cool-down backwards), or with `vpp` model chunks
the interleaved schedule, in groups of `pp` micro-batches. A real multi-process step's
forwards and backwards are recorded and compared with it
(tests/orchestrator/test_communication_measured.py). The memory estimate counts the
micro-batches this order holds at once; the step-time estimate plays it with each
stage's own times (`makespan`).
"""

from __future__ import annotations


def order(pp: int, vpp: int | None, microbatches: int, stage: int) -> list[tuple[str, int, int]]:
    """("F" or "B", model chunk, micro-batch) in the order stage `stage` runs them."""
    chunks = vpp or 1
    total = microbatches * chunks
    if vpp:
        table = []  # (model chunk, micro-batch) of each virtual micro-batch, forward order
        for first in range(0, microbatches, pp):
            last = microbatches if first + pp >= microbatches else first + pp
            table += [(chunk, i) for chunk in range(chunks) for i in range(first, last)]
        warmup = (pp - stage - 1) * 2 + (chunks - 1) * pp
    else:
        table = [(0, i) for i in range(total)]
        warmup = pp - stage - 1
    warmup = min(warmup, total)
    out = [("F", *table[k]) for k in range(warmup)]
    for k in range(total - warmup):
        out.append(("F", *table[warmup + k]))
        chunk, i = table[k]
        out.append(("B", chunks - 1 - chunk, i))
    for k in range(total - warmup, total):
        chunk, i = table[k]
        out.append(("B", chunks - 1 - chunk, i))
    return out


def makespan(forward_s: list[list[float]], backward_s: list[list[float]], microbatches: int,
             vpp: int | None) -> tuple[float, list[float]]:
    """The step's time through the schedule, and each stage's busy time: every stage runs
    its `order` one event after another; a forward waits for the same micro-batch's
    forward on the model chunk before it (the previous stage, or the last stage's previous
    chunk), a backward for the backward after it. `forward_s[stage][chunk]` and
    `backward_s[stage][chunk]`: one micro-batch's times (the pipeline's sends included)."""
    pp, chunks = len(forward_s), vpp or 1
    done: dict = {}  # (kind, global chunk, micro-batch) -> end time
    pending = [order(pp, vpp, microbatches, stage) for stage in range(pp)]
    clock = [0.0] * pp
    busy = [0.0] * pp
    last_chunk = pp * chunks - 1
    while any(pending):
        progressed = False
        for stage in range(pp):
            while pending[stage]:
                kind, chunk, i = pending[stage][0]
                g = chunk * pp + stage  # megatron's chunk c on stage s holds layer block c*pp + s
                need = ("F", g - 1, i) if kind == "F" and g > 0 else ("B", g + 1, i) if kind == "B" and g < last_chunk else None
                if need is not None and need not in done:
                    break
                cost = (forward_s if kind == "F" else backward_s)[stage][chunk]
                start = max(clock[stage], done.get(need, 0.0))
                clock[stage] = done[(kind, g, i)] = start + cost
                busy[stage] += cost
                pending[stage].pop(0)
                progressed = True
        if not progressed:
            raise RuntimeError("the pipeline schedule deadlocks")  # a defect of `order`
    return max(clock), busy
