"""A layout its own plan says does not fit a GPU is refused before anything is queued:
`audiollm plan` exits 2 and `audiollm train` (its dry run too) submits nothing, each naming
every term of the estimate, what lowers it and the override; launcher.allow_unfit_memory=true
plans and submits it anyway. `plan -m` keeps calling such a point "no fit" (its memory
column), not a broken rule."""

import json

from launchers.train import train
from orchestrator.cli import main
from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import resolve

# The 8k-token CP2 recipe at micro batch 4 without recompute (docs/memory.md): its
# activations alone are most of an H100.
LAYOUT = ["+recipe=gemma2_whisper_8k_cp2", "parallel.recompute.granularity=null", "parallel.recompute.method=null",
          "parallel.recompute.num_layers=null", "model.init_checkpoint=null", "model.allow_frozen_random=true"]
UNFIT = [*LAYOUT, "optim.micro_batch_size=4"]


def test_plan_and_train_refuse_a_layout_that_does_not_fit_naming_its_terms(capsys, tmp_path):
    memory = resolve(compose(UNFIT), keep_errors=True).memory
    assert not memory["fits"] and memory["total_gib"] > memory["device_gib"]
    assert main(["plan", *UNFIT]) == 2
    out, err = capsys.readouterr()
    assert "DOES NOT FIT" in out
    for said in ("error: [memory]", f"{memory['total_gib']:.1f} GiB per GPU", f"{memory['device_gib']:.1f} GiB of "
                 f"launcher.gpu_type=h100", f"activations {memory['activations_gib']:.1f}", "largest: activations",
                 "optim.micro_batch_size=4", "parallel.recompute.granularity=null", "launcher.allow_unfit_memory=true"):
        assert said in err, said
    out_root = f"run.output_root={tmp_path}"
    assert train([*UNFIT, "launcher.dry_run=true", out_root]) == 2
    assert "error: [memory]" in capsys.readouterr().err
    # Said explicitly, it plans and its dry run prints what would be submitted.
    assert main(["plan", *UNFIT, "launcher.allow_unfit_memory=true"]) == 0
    capsys.readouterr()
    assert train([*UNFIT, "launcher.allow_unfit_memory=true", "launcher.dry_run=true", out_root]) == 0
    assert "# sbatch script" in capsys.readouterr().out


def test_a_sweep_point_that_does_not_fit_is_no_fit_not_a_broken_rule(capsys):
    assert main(["plan", "-m", *LAYOUT, "optim.micro_batch_size=1,4", "--json"]) == 0
    points = {p["point"]["optim.micro_batch_size"]: p for p in json.loads(capsys.readouterr().out)["points"]}
    assert points["1"]["runs"] and points["1"]["fits"]
    assert not points["4"]["fits"] and not points["4"]["runs"] and points["4"]["errors"] == []
