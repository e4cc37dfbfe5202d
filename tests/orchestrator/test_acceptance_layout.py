"""The layout the GPU acceptance's full-size job rows run (benchmarks/gpu_acceptance.py
`fitting_layout` over `job_overrides`): the plan's best runnable point of recompute
none/full x micro-batch 1/2/4, the largest micro-batch among equal estimates; planned
here as on the GPU machine, for each kind of GPU it may be."""

import pytest

from benchmarks.gpu_acceptance import LAYOUT_SWEEP, fitting_layout, job_overrides
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve
from orchestrator.plan.sweep_table import plan_rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from orchestrator.data.demo import write_corpus

    root = tmp_path_factory.mktemp("demo")
    write_corpus(root, num_samples=8, num_val_samples=2, progress=False)
    return root


@pytest.mark.parametrize("size, gpu_type", [("9b", "h200"), ("9b", "h100"), ("2b", "h100")])
def test_the_full_size_rows_take_the_fastest_layout_that_fits_with_the_largest_micro_batch(corpus, size, gpu_type,
                                                                                            tmp_path):
    overrides = job_overrides(size, corpus, False, gpu_type, str(tmp_path), 10, 14)
    chosen, said = fitting_layout(overrides)
    every = plan_rows([*overrides, *LAYOUT_SWEEP])
    rows = [row for row in every if row.runs]
    fastest = max(row.tokens_per_s_per_gpu for row in rows)
    equals = [row for row in rows if row.tokens_per_s_per_gpu >= 0.999 * fastest]
    largest = max(int(row.point["optim.micro_batch_size"]) for row in equals)
    # on one GPU recompute only costs time: the fastest points keep none
    assert chosen == ["parallel.recompute=none", f"optim.micro_batch_size={largest}", "optim.global_batch_size=8"]
    plan = resolve(compose([*overrides, *chosen])).to_dict()  # the job's own validation passes
    assert plan["fits"] and plan["model_extensions"]["compiled"] == "layers"
    assert f"of {plan['memory']['device_gib']:.1f} GiB" in said
    # the next micro-batch without recompute does not fit this GPU (or is past the sweep)
    bigger = [row for row in every if row.point == {"parallel.recompute": "none", "optim.micro_batch_size": str(2 * largest)}]
    assert all(row.fits is False for row in bigger) and (bigger or largest == 4)
