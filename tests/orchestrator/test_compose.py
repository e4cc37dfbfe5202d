import re

import pytest
from omegaconf import OmegaConf

from orchestrator.plan import compose as compose_module
from orchestrator.plan import paths
from orchestrator.plan.compose import ComposeError, compose


def test_no_recipe_means_the_default_tiny_cpu_recipe():
    cfg = compose([])
    assert cfg.recipe == "tiny_cpu"
    assert cfg.model.name == "tiny_audiollm"
    assert cfg.launcher.accelerator == "cpu"


def test_recipe_without_plus_is_accepted():
    assert compose(["recipe=gemma2_whisper_tp4pp2"]).parallel.tp == 4


@pytest.mark.parametrize("recipe", paths.recipe_names())
def test_every_recipe_composes_into_the_typed_schema(recipe):
    cfg = compose([f"+recipe={recipe}"])
    assert cfg.recipe == recipe
    OmegaConf.to_object(cfg)  # every MISSING field is filled


@pytest.mark.parametrize(
    "override, key_path",
    [
        ("parallel.tpp=2", "parallel.tpp"),
        ("model.decoder.hiden_size=3", "model.decoder.hiden_size"),
        ("launcher.gpu_per_node=8", "launcher.gpu_per_node"),
        ("optim.global_batch=8", "optim.global_batch"),
    ],
)
def test_unknown_key_on_the_command_line_fails_with_its_path(override, key_path):
    with pytest.raises(ComposeError) as info:
        compose([override])
    assert key_path in str(info.value)


@pytest.mark.parametrize("override, key_path, closest", [
    ("+parallel.tpp=2", "parallel.tpp", "parallel.tp"),  # the form Hydra's own error suggests
    ("++parallel.tpp=2", "parallel.tpp", "parallel.tp"),
    ("+optim.lr_warmup=5", "optim.lr_warmup", "optim.lr_warmup_iters"),
    ("+model.decoder.hiden_size=3", "model.decoder.hiden_size", "model.decoder.hidden_size"),
    ("parallel.tpp=2", "parallel.tpp", "parallel.tp"),
])
def test_a_key_the_schema_lacks_is_refused_even_when_added_with_plus(override, key_path, closest):
    """Hydra lets + and ++ add a key to a structured config, where it was kept in config.yaml
    and read by nothing (+parallel.tpp=2 trained at TP 1): refused, naming the closest key,
    and the error no longer suggests adding it with +."""
    with pytest.raises(ComposeError) as info:
        compose(["+recipe=tiny_cpu", override])
    text = str(info.value)
    assert f"[unknown_key] {key_path} is not a setting" in text and f"did you mean {closest}?" in text, text
    assert "To append to your config" not in text, text


def test_a_dataset_entry_key_the_schema_lacks_is_refused_naming_the_list_and_the_closest_key():
    with pytest.raises(ComposeError) as info:
        compose(["data.train=[{name: a, path: /data/a, weigth: 2}]"])
    assert "weigth (in data.train) is not a setting" in str(info.value) and "did you mean weight?" in str(info.value)


def test_the_open_dicts_take_any_key():
    cfg = compose(["+launcher.additional_sbatch.mail-type=END", "launcher.additional_sbatch.comment=x"])
    assert dict(cfg.launcher.additional_sbatch) == {"mail-type": "END", "comment": "x"}


@pytest.mark.parametrize(
    "override, key_path",
    [("parallel.tp=four", "parallel.tp"), ("parallel.sp=maybe", "parallel.sp"), ("optim.lr=fast", "optim.lr")],
)
def test_wrong_type_on_the_command_line_fails_with_its_path(override, key_path):
    with pytest.raises(ComposeError) as info:
        compose([override])
    assert key_path in str(info.value)
    assert override.split("=")[1] in str(info.value)


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(ComposeError) as info:
        compose(["+recipe=no_such_recipe"])
    assert "no_such_recipe" in str(info.value)
    for name in paths.recipe_names():
        assert name in str(info.value)


@pytest.mark.parametrize(
    "body, key_path",
    [
        ("parallel:\n  tensor_parallel: 2\n", "parallel.tensor_parallel"),
        ("optim:\n  micro_batch_size: one\n", "optim.micro_batch_size"),
    ],
)
def test_typo_or_wrong_type_in_a_recipe_file_fails_with_its_path(tmp_path, monkeypatch, body, key_path):
    (tmp_path / "broken.yaml").write_text("# @package _global_\nrecipe: broken\n" + body)
    monkeypatch.setattr(paths, "recipes_dir", lambda: tmp_path)
    with pytest.raises(ComposeError) as info:
        compose(["+recipe=broken"])
    assert key_path in str(info.value)
    monkeypatch.undo()
    compose_module.compose([])  # the real recipes register again


@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_dataset_entry_without_a_path_is_a_config_error_through_the_cli(command, tmp_path):
    """Not omegaconf's MissingMandatoryValue traceback: one line naming the entry, exit 2,
    nothing written (run.output_root stays empty)."""
    import subprocess
    import sys

    from tests.distributed_run import REPO

    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", command,
                           "data.train=[{name:a,path:/data/a},{name:b}]", f"run.output_root={tmp_path / 'out'}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "data.train[1] (name 'b') has no path" in out and "Traceback" not in out, out
    assert not (tmp_path / "out").exists()


def test_sbatch_options_are_set_as_a_user_writes_them():
    """launcher.additional_sbatch is a dict of the user's keys: `key={k: v}` and `key.k=v`
    add them (Hydra's struct mode refused both; only `+key.k=v` worked)."""
    whole = compose(["launcher=slurm", "launcher.additional_sbatch={mail-type:END,mail-user:me@example.org}"])
    assert dict(whole.launcher.additional_sbatch) == {"mail-type": "END", "mail-user": "me@example.org"}
    one = compose(["launcher=slurm", "launcher.additional_sbatch.begin=now+600", "+launcher.additional_sbatch.x=1"])
    assert dict(one.launcher.additional_sbatch) == {"begin": "now+600", "x": "1"}


@pytest.mark.parametrize("old, new", [("train.eval_wer=true", "train.eval_generation"),
                                      ("train.eval_wer_batches=2", "train.eval_generation_batches")])
def test_a_renamed_key_is_refused_with_its_new_name(old, new):
    with pytest.raises(ComposeError, match=rf"{re.escape(old.split('=')[0])} is now {re.escape(new)} \(it scores WER, "
                                           rf"exact match or BLEU"):
        compose([old])
