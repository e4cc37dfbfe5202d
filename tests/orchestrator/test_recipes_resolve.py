"""Every recipe resolves to a Plan whose Megatron argv matches its golden file.

Golden files: see tests/golden.py (AUDIOLLM_REGENERATE_GOLDEN=1 regenerates).
"""

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli import main
from orchestrator.plan import paths
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve
from tests.golden import check_golden

GOLDEN = Path(__file__).with_name("golden")


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_recipe_argv_matches_golden_file(recipe):
    argv = resolve(compose([f"+recipe={recipe}"])).argv
    golden = GOLDEN / f"{recipe}.argv"
    text = " ".join(argv).replace(" --", "\n--") + "\n"  # one flag (and its value) per line
    check_golden(golden, text)


def _plan_json(*overrides: str, exit_code: int = 0) -> dict:
    """`audiollm plan ... --json` in this process (tests/test_submit_side_light.py and the
    human summary below run it as a command of its own)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["plan", *overrides, "--json"]) == exit_code
    return json.loads(out.getvalue())


def _contains_run(argv: list[str], run: list[str]) -> bool:
    return any(argv[i:i + len(run)] == run for i in range(len(argv) - len(run) + 1))


def test_plan_json_of_the_four_node_recipe():
    plan = _plan_json("+recipe=gemma2_whisper_tp4pp2")
    assert (plan["world_size"], plan["tp"], plan["pp"], plan["cp"], plan["dp"]) == (32, 4, 2, 1, 4)
    expected = ("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --context-parallel-size 1 "
                "--use-distributed-optimizer --sequence-parallel --recompute-granularity full --recompute-method "
                "uniform --recompute-num-layers 1").split()
    assert _contains_run(plan["argv"], expected), plan["argv"]
    for run in (["--num-layers", "42"], ["--hidden-size", "3584"], ["--ffn-hidden-size", "14336"],
                ["--num-attention-heads", "16"], ["--num-query-groups", "8"], ["--kv-channels", "256"],
                ["--window-size", "(4095,0)"], ["--window-attn-skip-freq", "2"], ["--apply-layernorm-1p"],
                ["--normalization", "RMSNorm"], ["--bf16"]):
        assert _contains_run(plan["argv"], run), run
    assert "--untie-embeddings-and-output-weights" not in plan["argv"]
    assert plan["num_microbatches"] == 16 and plan["padded_vocab_size"] == 256000
    assert plan["transformer_fields"]["attn_logit_softcapping"] == 50.0
    assert plan["transformer_fields"]["final_logit_softcapping"] == 30.0
    assert isinstance(plan["memory_per_gpu_gib"], float) and plan["fits"] is True


def test_vocab_is_padded_to_a_multiple_of_128_times_tp():
    plan = _plan_json("model.decoder.vocab_size=1000", "parallel.tp=2", "launcher.gpus_per_node=2")
    assert plan["padded_vocab_size"] == 1024
    plan = _plan_json("+recipe=gemma2_whisper_tp4pp2", "model.decoder.vocab_size=1000")
    assert plan["padded_vocab_size"] == 1024
    plan = _plan_json("+recipe=gemma2_whisper_tp4pp2", "model.decoder.vocab_size=1100")
    assert plan["padded_vocab_size"] == 1536


def test_full_finetuning_at_tp1_is_flagged_as_not_fitting():
    plan = _plan_json("+recipe=gemma2_whisper_tp1", "lora=none", exit_code=2)  # refused (test_unfit_memory.py)
    assert plan["fits"] is False and plan["memory_per_gpu_gib"] > 79.1
    assert [e.split("]")[0] for e in plan["errors"]] == ["error: [memory"]
    assert _plan_json("+recipe=gemma2_whisper_tp1")["fits"] is True


def test_human_summary_shows_topology_layout_memory_and_argv():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "plan", "+recipe=gemma2_whisper_tp4pp2"],
                          capture_output=True, text=True, timeout=60, check=True)
    out = proc.stdout
    assert "TP 4 x PP 2 x CP 1 x DP 4" in out
    assert "TP groups  [0, 1, 2, 3], [4, 5, 6, 7]" in out
    assert "memory/GPU" in out and "fits" in out
    assert "--tensor-model-parallel-size 4" in out


def test_context_parallel_recipe_plans_its_memory_next_to_cp1():
    """gemma2_whisper_8k_cp2: CP=2 x TP=4 on 8 GPUs; the plan names Megatron-LM's CP flags
    and gives the memory per GPU at CP=2 and at CP=1 on the same GPUs (DP 2): the same
    weights, gradients and optimizer shard (megatron shards the optimizer over DP x CP),
    half the decoder activations but for the gathered keys and values and the loss's chunk."""
    from orchestrator.plan.report import render

    plan = resolve(compose(["+recipe=gemma2_whisper_8k_cp2"]))
    assert (plan.dims.tp, plan.dims.cp, plan.dims.dp, plan.dims.world_size) == (4, 2, 1, 8)
    assert _contains_run(plan.argv, ["--context-parallel-size", "2", "--cp-comm-type", "all_gather"])
    assert _contains_run(plan.argv, ["--seq-length", "8192"])
    cp2, cp1 = plan.memory, plan.memory_at_cp1
    assert cp1 is not None and cp2["fits"]
    for part in ("weights_gib", "grads_gib", "optimizer_gib"):
        assert cp2[part] == pytest.approx(cp1[part]), part
    # The softcapped loss's fp32 chunk is the same at both (one chunk of at most
    # LOSS_CHUNK_ELEMENTS logits, whatever the sequence); the rest halves.
    from orchestrator.plan.kernels import LOSS_CHUNK_ELEMENTS, LOSS_CHUNK_FP32_COPIES

    chunk = LOSS_CHUNK_FP32_COPIES * LOSS_CHUNK_ELEMENTS * 4 / 2**30
    assert 0.4 * (cp1["activations_gib"] - chunk) < cp2["activations_gib"] - chunk < 0.6 * (cp1["activations_gib"] - chunk)
    assert not [w for w in plan.warnings if "distributed_optimizer" in w]  # sharded over DP x CP = 2
    text = render(plan)
    assert f"at CP=1       {cp1['total_gib']:.1f} GiB" in text and "(same GPUs, DP 2)" in text
    assert resolve(compose(["+recipe=gemma2_whisper_8k_cp2", "parallel.cp=1", "parallel.sp=true"])).memory_at_cp1 is None


def test_context_parallel_memory_counts_the_gathered_keys_and_values():
    """Per layer, CP=2 saves half the tokens' activations (with the reference attention: its
    fp32 scores are [local queries x whole row], half of CP=1's) but the whole row's K and V."""
    from orchestrator.plan.estimate import decoder_layer_activation_bytes
    from orchestrator.plan.resolve import to_object
    from orchestrator.plan.schema import ParallelConfig

    model = to_object(compose(["+recipe=gemma2_whisper_8k_cp2"])).model
    seq = 8192
    kv_bytes = 2 * model.decoder.num_query_groups * model.decoder.kv_channels * seq * 2  # bf16 K and V of the row
    for attention in ("flex", "reference"):
        at = {cp: decoder_layer_activation_bytes(model, ParallelConfig(tp=1, cp=cp), seq, 1, 2, attention) for cp in (1, 2)}
        assert at[2] == pytest.approx((at[1] - kv_bytes) / 2 + kv_bytes), attention


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_every_recipe_plans_on_a_fresh_checkout_listing_the_missing_weights_after_the_plan(recipe, tmp_path,
                                                                                           monkeypatch, capsys):
    """Without converted weights (a fresh checkout: no pretrained/ directory, no
    $AUDIOLLM_INIT_CHECKPOINT), `audiollm plan` still shows the topology, the memory and
    the argv, then lists the missing checkpoint as an error and exits 2."""
    monkeypatch.delenv("AUDIOLLM_INIT_CHECKPOINT", raising=False)
    monkeypatch.delenv("AUDIOLLM_FINETUNE_FROM", raising=False)
    monkeypatch.chdir(tmp_path)
    returncode = main(["plan", f"+recipe={recipe}"])
    proc = SimpleNamespace(returncode=returncode, **dict(zip(("stdout", "stderr"), capsys.readouterr())))
    plan = resolve(compose([f"+recipe={recipe}"]), keep_errors=True)
    assert "topology      world" in proc.stdout and f"TP {plan.dims.tp} x PP {plan.dims.pp} x CP {plan.dims.cp}" in proc.stdout
    assert "memory/GPU" in proc.stdout and f"--tensor-model-parallel-size {plan.dims.tp}" in proc.stdout
    init = compose([f"+recipe={recipe}"]).model.init_checkpoint
    if init is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = proc.stderr.split("configuration error(s): the plan above is what would run once they are fixed")
    assert len(errors) == 2, proc.stderr
    assert re.search(r"error: \[init_checkpoint\] model.init_checkpoint=(\S+): \1 does not exist; write it from HF "
                     r"weights with `audiollm convert hf-to-megatron", errors[1]), proc.stderr


def test_a_plan_builds_its_parameter_inventory_once(monkeypatch):
    from orchestrator.plan import model_params

    built = []
    original = model_params.decoder_params
    monkeypatch.setattr(model_params, "decoder_params", lambda *a, **k: built.append(1) or original(*a, **k))
    monkeypatch.setattr(model_params, "_INVENTORIES", {})
    resolve(compose(["+recipe=gemma2_whisper_tp4pp2", "lora.rank=8"]))
    assert built == [1]
