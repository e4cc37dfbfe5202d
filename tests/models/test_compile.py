"""model.compile=layers (orchestrator/models/compile.py) on CPU, from one process launch
of tests/models/compile_script.py: every recipe's decoder layers compile with no graph
break, with either attention kernel; compiled equals eager within fp32 rounding; and
validation refuses the layouts whose layers hold collectives."""

import json
import re
from pathlib import Path

import pytest

from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import to_object
from orchestrator.plan.validate import ERROR, validate
from tests.distributed_run import torchrun
from tests.models.compile_script import RECIPES

# fp32 results of the same arithmetic in another order (inductor fuses and reorders the
# reductions: norms over 64 hidden values, attention over up to 96 keys, the loss over a
# 250-token vocabulary): each reduction of n terms may differ by up to about n x eps
# (eps = 1.19e-7) relative to its largest term, and a layer's output carries its
# inputs' differences on. 2e-5 of a tensor's largest value is 168 eps: a few hundred-term
# reductions deep; a wrong fusion (a dropped softcap, a norm offset) is orders larger.
FP32_REORDER = 2e-5


@pytest.fixture(scope="module")
def results():
    output = torchrun(Path(__file__).with_name("compile_script.py"), 1, timeout=600)
    found = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", output, re.M)]
    return {r["case"]: r for r in found}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("attention", ["reference", "flex"])
def test_every_recipes_decoder_layer_compiles_whole(results, recipe, attention):
    """fullgraph=True: a graph break would have raised. One graph per window variant
    (windowed and global layers), shared by all layers of the variant: the model's four
    layers compiled twice, not four times."""
    result = results[f"{recipe}/{attention}"]
    assert result["layers"] == 4
    assert result["graphs"] == 2 and all(ops > 20 for ops in result["ops"]), result
    if attention == "reference":  # trained through the compiled layers
        assert result["trained"] > 0 and result["grads"] == result["trained"]
    assert result["lora"] == (recipe == "gemma2_whisper_tp1")


def test_compiled_layers_equal_eager_within_fp32_rounding(results):
    result = results["parity"]
    assert result["layers"] == 4 and result["grads"] > 70
    assert result["loss_rel"] <= FP32_REORDER
    worst = max(result["grad_rel"].items(), key=lambda item: item[1])
    assert worst[1] <= FP32_REORDER, worst


@pytest.mark.parametrize("layout, words", [
    (["parallel.tp=2"], "parallel.tp=2"),
    (["launcher.gpus_per_node=2", "parallel.cp=2", "data.seq_length=1024"], "parallel.cp=2"),
    (["parallel.recompute.granularity=selective"], "selective"),
])
def test_layouts_the_compiled_layer_cannot_take_are_refused(layout, words):
    cfg = to_object(compose(["+recipe=tiny_cpu", "model.compile=layers", "launcher.gpus_per_node=2", *layout]))
    errors = [str(f) for f in validate(cfg, "plan") if f.severity == ERROR and f.rule == "compile"]
    assert len(errors) == 1 and words in errors[0] and "model.compile=none" in errors[0], errors


def test_the_default_recipe_compiles_its_layers_when_asked():
    cfg = to_object(compose(["+recipe=tiny_cpu", "model.compile=layers"]))
    assert not [f for f in validate(cfg, "plan") if f.severity == ERROR]
    assert to_object(compose(["+recipe=tiny_cpu"])).model.compile == "none"
