"""One translation, one builder: the job's TransformerConfig is the Plan's
`transformer_fields` at `plan.dims`, and what builds a model without a run (`convert
--verify`, the GPU acceptance's HF rows, the tests' reference models) gets the same config
for the same decoder and layout; nothing else constructs the config class or re-derives the
family's megatron fields."""

import ast
import dataclasses
import functools
from pathlib import Path

import pytest
import torch

from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve, to_object
from orchestrator.train import megatron_config as mcfg

REPO = Path(__file__).resolve().parents[2]

# What only the job's training sets (its loss normalisation), not the model.
TRAINING_ONLY = {"calculate_per_token_loss"}


def _comparable(value):
    """Config values as comparable data: megatron's init methods are partials, which
    compare by identity."""
    if isinstance(value, functools.partial):
        return (value.func, value.args, tuple(sorted(value.keywords.items())))
    return value


def _fields(config) -> dict:
    return {f.name: _comparable(getattr(config, f.name)) for f in dataclasses.fields(config)}


@pytest.mark.parametrize("recipe", ["tiny_cpu", "tiny_cpu_llama", "tiny_cpu_qwen2", "tiny_cpu_qwen3",
                                    "tiny_cpu_gemma3", "llama3_whisper_tp2"])
def test_a_model_built_without_a_run_has_the_jobs_config(recipe):
    """convert --verify and the tests' reference models (decoder_transformer_config) build
    the config a CPU job of the recipe builds at its layout, field for field."""
    from orchestrator.models.decoder_config import decoder_transformer_config

    # Recompute is the run's, not the model's; on a CPU with the local backend, as those build.
    overrides = ["parallel.recompute.granularity=null", "parallel.recompute.method=null",
                 "parallel.recompute.num_layers=null", "model.backend=local", "launcher.accelerator=cpu"]
    cfg = compose([f"+recipe={recipe}", *overrides])
    plan = resolve(cfg, keep_errors=True)  # a full-size recipe's missing weights do not matter here
    job = _fields(mcfg.transformer_config(plan, on_gpu=False))
    outside = _fields(decoder_transformer_config(to_object(cfg).model.decoder, plan.dims, torch.float32))
    assert plan.dims.tp == (2 if recipe == "llama3_whisper_tp2" else 1)
    differ = {name for name in job if job[name] != outside[name]}
    assert differ == TRAINING_ONLY, {name: (job[name], outside[name]) for name in differ}


def test_the_job_reads_the_plans_fields_as_they_are():
    """A field changed in plan.json changes the job's config (the job translates nothing
    again), and the sizes come from dims."""
    plan = resolve(compose(["+recipe=tiny_cpu_gemma3"]))
    plan.transformer_fields["rope_local_theta"] = 12345.0
    plan.transformer_fields["sliding_window"] = 7
    config = mcfg.transformer_config(plan, on_gpu=False)
    assert (config.rope_local_theta, config.sliding_window) == (12345.0, 7)
    assert config.tensor_model_parallel_size == plan.dims.tp and config.calculate_per_token_loss


def test_the_config_class_is_constructed_and_the_family_translated_in_one_place_each():
    """Outside orchestrator/models/decoder_config.py nothing constructs
    DecoderTransformerConfig; outside orchestrator/plan/megatron_fields.py nothing calls
    decoder_fields (the benchmarks, the GPU acceptance, convert and the tests included)."""
    owners = {"DecoderTransformerConfig": REPO / "orchestrator/models/decoder_config.py",
              "decoder_fields": REPO / "orchestrator/plan/megatron_fields.py"}
    found = []
    for path in sorted([*REPO.glob("orchestrator/**/*.py"), *REPO.glob("benchmarks/*.py"),
                        *REPO.glob("tests/**/*.py"), *REPO.glob("launchers/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in owners and path != owners[name]:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} calls {name}")
    assert found == []


def test_a_plan_json_without_fields_names_what_to_do(tmp_path):
    import json

    from orchestrator.plan.resolved import Plan, PlanError

    data = resolve(compose(["+recipe=tiny_cpu"])).to_dict()
    del data["transformer_fields"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"lacks keys \['transformer_fields'\]: it was written by an older audiollm"):
        Plan.load(tmp_path)
