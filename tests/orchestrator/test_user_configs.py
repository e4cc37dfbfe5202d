"""The user's own recipes and config groups, outside the checkout: --config-dir,
$AUDIOLLM_CONFIG_PATH and the project file audiollm.yaml, their order, `audiollm recipes`,
the run directory's record of the recipe's file, and the refusal of a config group chosen
without a recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launchers.prepare import prepare_main
from launchers.train import train_main
from orchestrator.cli import main, plan_main
from orchestrator.plan import config_path
from orchestrator.plan.compose import ComposeError, compose, source

from tests.launchers.helpers import launches, losses
from tests.train.audiollm_runs import data_overrides, shared_corpus

REPO = Path(__file__).resolve().parents[2]
HEADER = "my run: the tiny model at my learning rate. Hardware: my laptop."


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch):
    """Only the folders a test gives: not the environment's search path, and the checkout
    (which carries no project file) as the working directory."""
    monkeypatch.delenv(config_path.ENV_VAR, raising=False)
    monkeypatch.chdir(REPO)


def _recipe(folder: Path, name: str = "my_run", lr: str = "7.0e-4", model: str | None = None) -> Path:
    """A copy of the shipped tiny_cpu recipe, as a user starts one: its own header and lr
    (and model); it still says `recipe: tiny_cpu`, as a copy does."""
    text = (REPO / "recipes" / "tiny_cpu.yaml").read_text()
    text = text.replace("# tiny_cpu — the default recipe. Hardware: one CPU machine (2 cores are enough).",
                        f"# {name} — {HEADER}")
    text = text.replace("  lr: 1.0e-3", f"  lr: {lr}")
    if model:
        text = text.replace("override /model: tiny_audiollm", f"override /model: {model}")
    path = folder / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _model(folder: Path, name: str, num_layers: int) -> Path:
    """A model entry: the shipped tiny model with another decoder depth."""
    entry = yaml.safe_load((REPO / "conf" / "model" / "tiny_audiollm.yaml").read_text())
    entry["name"] = name
    entry["decoder"]["num_layers"] = num_layers
    path = folder / "model" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(entry))
    return path


def _plan_json(capsys, *argv) -> dict:
    assert plan_main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_recipe_outside_the_checkout_plans_with_config_dir_and_uses_its_own_model(tmp_path, capsys):
    mine = tmp_path / "mine"
    _recipe(mine, model="my_model")
    _model(mine, "my_model", num_layers=3)
    plan = _plan_json(capsys, "--config-dir", str(mine), "+recipe=my_run", f"run.output_root={tmp_path}")
    config = plan["config"]
    assert config["recipe"] == "my_run"  # a recipe's name is its file's, not the `recipe:` its copy kept
    assert config["optim"]["lr"] == 7e-4 and config["model"]["name"] == "my_model"
    assert config["model"]["decoder"]["num_layers"] == 3
    # A shipped recipe with the user's group entry chosen on the command line.
    config = _plan_json(capsys, "+recipe=tiny_cpu", "model=my_model", "--config-dir", str(mine))["config"]
    assert (config["model"]["name"], config["optim"]["lr"]) == ("my_model", 1e-3)
    # Outside --config-dir the folder is not searched.
    with pytest.raises(ComposeError, match="Could not find 'recipe/my_run'(.|\n)*--config-dir"):
        compose(["+recipe=my_run"])


def test_a_user_entry_replaces_the_shipped_one_of_its_name(tmp_path):
    mine = tmp_path / "mine"
    _model(mine, "tiny_audiollm", num_layers=5)
    with config_path.command_line_dirs([mine]):
        assert compose(["+recipe=tiny_cpu"]).model.decoder.num_layers == 5
    assert compose(["+recipe=tiny_cpu"]).model.decoder.num_layers != 5


def test_a_user_recipe_starts_from_a_shipped_one(tmp_path):
    """docs/concepts.md's example: the shipped recipe's defaults (its model, data, launcher)
    and values, then the file's own."""
    recipe = tmp_path / "mine" / "recipes" / "tp1_rank8.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text("# @package _global_\n# tp1_rank8 — gemma2_whisper_tp1 with LoRA rank 8.\n"
                      "defaults:\n  - /recipe/gemma2_whisper_tp1\n  - _self_\nlora:\n  rank: 8\n")
    with config_path.command_line_dirs([recipe.parents[1]]):
        cfg = compose(["+recipe=tp1_rank8"])
    assert (cfg.recipe, cfg.lora.rank, cfg.model.name, cfg.launcher.kind) == (
        "tp1_rank8", 8, "gemma2_9b_whisper_large_v3", "slurm")


def test_the_environment_variable_and_the_project_file_add_folders(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    _recipe(first, "from_env")
    _recipe(second, "from_env_too")
    monkeypatch.setenv(config_path.ENV_VAR, os.pathsep.join([str(first), "", str(second)]))
    assert compose(["+recipe=from_env_too"]).recipe == "from_env_too"
    monkeypatch.delenv(config_path.ENV_VAR)
    project = tmp_path / "project"
    _recipe(project / "configs", "from_project", lr="2.0e-4")
    (project / "audiollm.yaml").write_text("config_path: [configs]\n")
    (project / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project / "src" / "deep")  # the nearest parent's project file counts
    assert compose(["+recipe=from_project"]).optim.lr == 2e-4
    where = source(["+recipe=from_project"])
    assert where["recipe_file"] == str(project / "configs" / "recipes" / "from_project.yaml")
    assert where["config_path"][0] == {"dir": str(project / "configs"), "from": str(project / "audiollm.yaml")}
    assert where["config_path"][-1]["from"] == "shipped"


def test_the_first_folder_wins_command_line_then_environment_then_project_file(tmp_path, monkeypatch, capsys):
    cli, env, project = tmp_path / "cli", tmp_path / "env", tmp_path / "project"
    for folder, lr in ((cli, "1.0e-5"), (env, "2.0e-5"), (project / "configs", "3.0e-5")):
        _recipe(folder, lr=lr)
    _recipe(env, "tiny_cpu", lr="4.0e-5")  # replaces the shipped default recipe
    (project / "audiollm.yaml").write_text("config_path: configs\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv(config_path.ENV_VAR, str(env))
    with config_path.command_line_dirs([cli]):
        assert compose(["+recipe=my_run"]).optim.lr == 1e-5
        assert compose([]).optim.lr == 4e-5
    assert main(["recipes", "--config-dir", str(cli), "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)["recipes"]}
    assert listed["my_run"]["file"] == str(cli / "recipes" / "my_run.yaml")
    assert listed["my_run"]["hides"] == [str(env / "recipes" / "my_run.yaml"),
                                         str(project / "configs" / "recipes" / "my_run.yaml")]
    assert listed["tiny_cpu"]["from"] == f"${config_path.ENV_VAR}"
    assert listed["tiny_cpu_finetune"]["from"] == "shipped"
    assert compose(["+recipe=my_run"]).optim.lr == 2e-5  # the command line's folder is gone
    monkeypatch.delenv(config_path.ENV_VAR)
    assert compose(["+recipe=my_run"]).optim.lr == 3e-5
    assert compose([]).optim.lr == 1e-3  # the shipped default again
    # An edited recipe is read again (the registration is cached by file, size and time).
    _recipe(project / "configs", lr="3.25e-5")
    assert compose(["+recipe=my_run"]).optim.lr == 3.25e-5


def test_recipes_lists_each_recipe_with_its_source_and_header(tmp_path, capsys):
    mine = tmp_path / "mine"
    path = _recipe(mine)
    _recipe(mine, "tiny_cpu")
    assert main(["recipes", "--config-dir", str(mine)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (row,) = [line for line in lines if line.startswith("my_run ")]
    assert str(path) in row and row.endswith(HEADER)
    (row,) = [line for line in lines if line.startswith("gemma2_whisper_tp4pp2 ")]
    assert "shipped" in row and row.endswith("gemma-2-9b + whisper-large-v3, full fine-tuning.")
    (index,) = [i for i, line in enumerate(lines) if line.startswith("tiny_cpu (default) ")]
    assert str(mine / "recipes" / "tiny_cpu.yaml") in lines[index]
    assert lines[index + 1].strip() == f"(replaces {REPO / 'recipes' / 'tiny_cpu.yaml'})"
    assert f"  {mine}  (--config-dir)" in lines


def test_a_config_folder_that_cannot_be_used_is_named(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing"
    assert plan_main(["--config-dir", str(missing), "+recipe=tiny_cpu"]) == 2
    assert f"config folder {missing} (from --config-dir) does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken" / "recipes" / "broken.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("optim: [1\n")
    assert plan_main(["--config-dir", str(broken.parents[1]), "+recipe=tiny_cpu"]) == 2
    assert f"recipe {broken} cannot be read" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(config_path.ENV_VAR, str(tmp_path / "empty"))
    assert main(["recipes"]) == 2
    assert "holds no recipes/*.yaml and no config group folder" in capsys.readouterr().err
    monkeypatch.delenv(config_path.ENV_VAR)
    (tmp_path / "audiollm.yaml").write_text("config_paths: [configs]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ComposeError, match=r"unknown key\(s\) config_paths"):
        compose([])


@pytest.mark.parametrize("command", [plan_main, train_main, prepare_main])
def test_a_group_chosen_without_a_recipe_is_refused_before_anything_runs(command, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["model=gemma2_9b_whisper_large_v3", "launcher=slurm", "optim.lr=1e-4", f"run.output_root={out}"]
    assert command(argv) == 2
    err = capsys.readouterr().err
    assert "model=gemma2_9b_whisper_large_v3 launcher=slurm choose config groups, but no recipe is named" in err
    assert "+recipe=NAME" in err and "`audiollm recipes`" in err and "gemma2_whisper_tp4pp2" in err
    assert "+recipe=tiny_cpu to change the default run on purpose" in err
    assert not out.exists()


def test_value_overrides_and_the_logger_need_no_recipe(tmp_path, capsys):
    config = _plan_json(capsys, "optim.lr=5e-4", "logger=none", f"run.output_root={tmp_path}")["config"]
    assert (config["recipe"], config["optim"]["lr"], config["logger"]["backend"]) == ("tiny_cpu", 5e-4, "none")
    config = _plan_json(capsys, "+recipe=tiny_cpu", "lora=decoder_r16", "model.allow_frozen_random=true",
                        f"run.output_root={tmp_path}")["config"]
    assert config["lora"]["rank"] == 16
    # A sweep over a group, and the user's own group entries, are group choices too.
    assert train_main(["-m", "lora=none,decoder_r16"]) == 2
    mine = tmp_path / "mine"
    _model(mine, "my_model", 3)
    assert plan_main(["--config-dir", str(mine), "model=my_model"]) == 2
    assert "model=my_model chooses a config group" in capsys.readouterr().err


def test_the_run_directory_records_the_recipe_file_and_the_search_path(tmp_path):
    """`audiollm prepare` writes it into config.yaml; `audiollm train` of a user recipe
    (two steps of the real trainer, one process) into config.yaml and launch.json."""
    mine = tmp_path / "mine"
    path = _recipe(mine)
    common = ["--config-dir", str(mine), "+recipe=my_run", f"run.output_root={tmp_path}",
              *data_overrides(shared_corpus())]
    assert prepare_main([*common, "run.name=prepared"]) == 0
    text = (tmp_path / "tiny_cpu" / "prepared" / "config.yaml").read_text()
    assert text.startswith(f"# recipe my_run: {path}\n# config path, the first file of a name winning:\n"
                           f"#   {mine} (--config-dir)\n#   {REPO / 'conf'} (shipped)\n")
    assert yaml.safe_load(text)["recipe"] == "my_run"


@pytest.mark.multiprocess
def test_a_user_recipe_trains_and_its_run_directory_records_it(tmp_path):
    mine = tmp_path / "mine"
    path = _recipe(mine)
    assert train_main(["--config-dir", str(mine), "+recipe=my_run", "train.iters=2", "train.eval_interval=0",
                       "train.eval_generation=false", "train.eval_iters=1", "optim.lr_warmup_iters=0", "logger=none",
                       f"run.output_root={tmp_path}", "run.name=trained", *data_overrides(shared_corpus())]) == 0
    run_dir = tmp_path / "tiny_cpu" / "trained"
    assert sorted(losses(run_dir)) == [1, 2]
    assert json.loads((run_dir / "plan.json").read_text())["config"]["optim"]["lr"] == 7e-4
    (launch,) = launches(run_dir)
    assert launch["source"]["recipe"] == "my_run" and launch["source"]["recipe_file"] == str(path)
    assert launch["source"]["config_path"][0] == {"dir": str(mine), "from": "--config-dir"}
    assert f"# recipe my_run: {path}" in (run_dir / "config.yaml").read_text()


def test_audiollm_plan_with_a_config_dir_as_a_user_types_it(tmp_path):
    mine = tmp_path / "mine"
    _recipe(mine)
    argv = ["plan", "--config-dir", str(mine), "+recipe=my_run", f"run.output_root={tmp_path / 'out'}"]
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "my_run" in proc.stdout and "megatron argv" in proc.stdout
    assert "--lr 0.0007" in proc.stdout


def test_a_copied_recipe_that_kept_a_shipped_experiment_is_warned(tmp_path, capsys):
    """A copy of tiny_cpu still says run.experiment=tiny_cpu: its runs would go under
    outputs/tiny_cpu/ and into tiny_cpu's W&B group. The plan says so; its own name does not."""
    mine = tmp_path / "mine"
    _recipe(mine)
    plan = _plan_json(capsys, "--config-dir", str(mine), "+recipe=my_run")
    (warning,) = [w for w in plan["warnings"] if "[experiment]" in w]
    assert "recipe my_run" in warning and "run.experiment=tiny_cpu, the experiment of the shipped recipe(s) " \
        "tiny_cpu" in warning and "set run.experiment to its own (e.g. my_run)" in warning, warning
    plan = _plan_json(capsys, "--config-dir", str(mine), "+recipe=my_run", "run.experiment=my_run")
    assert not [w for w in plan["warnings"] if "[experiment]" in w]
    assert not [w for w in _plan_json(capsys, "+recipe=tiny_cpu")["warnings"] if "[experiment]" in w]
