"""W&B's own environment variables under the config's logger section
(orchestrator/plan/wandb_settings.py): the config wins where both are set, the
environment where the config leaves a value unset, else the defaults; each line says
where its value came from. tests/train/test_training.py runs a job with them."""

import pytest

from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import to_object
from orchestrator.plan.validate import validate
from orchestrator.plan.wandb_settings import wandb_settings

ENV = {"WANDB_MODE": "online", "WANDB_PROJECT": "env-project", "WANDB_ENTITY": "env-team"}


def test_the_environment_fills_what_the_config_leaves_unset():
    settings = wandb_settings({"backend": "wandb"}, ENV)
    assert (settings.mode, settings.project, settings.entity) == ("online", "env-project", "env-team")
    assert "W&B project: env-project ($WANDB_PROJECT; logger.project unset)" in settings.lines


def test_the_config_wins_and_says_over_what():
    settings = wandb_settings({"mode": "offline", "project": "mine", "entity": None}, ENV)
    assert (settings.mode, settings.project, settings.entity) == ("offline", "mine", "env-team")
    assert "W&B mode: offline (logger.mode, over $WANDB_MODE=online)" in settings.lines


def test_neither_gives_the_defaults():
    settings = wandb_settings({}, {})
    assert (settings.mode, settings.project, settings.entity) == ("offline", "audiollm", None)
    assert "W&B entity: wandb default (neither logger.entity nor $WANDB_ENTITY)" in settings.lines


@pytest.mark.parametrize("value, mode", [("dryrun", "offline"), ("run", "online"), ("DISABLED", "disabled"),
                                         ("sometimes", "offline")])
def test_wandb_spellings_of_its_mode_and_an_unknown_one(value, mode):
    settings = wandb_settings({}, {"WANDB_MODE": value})
    assert settings.mode == mode
    if value == "sometimes":
        assert "$WANDB_MODE=sometimes is not one of" in settings.lines[0]


def test_the_default_logger_group_leaves_all_three_to_the_environment():
    cfg = to_object(compose([]))
    assert cfg.logger.backend == "wandb" and (cfg.logger.mode, cfg.logger.project, cfg.logger.entity) == (None,) * 3
    assert not [f for f in validate(cfg, "plan") if f.rule == "logger"]
    offline = to_object(compose(["logger=wandb_offline"]))
    assert wandb_settings({"mode": offline.logger.mode}, ENV).mode == "offline"


def test_wandb_dir_is_where_the_files_go_and_the_line_says_so():
    settings = wandb_settings({}, {"WANDB_DIR": "/scratch/me"}, "/runs/r1")
    assert settings.dir == "/scratch/me"
    assert "W&B files: /scratch/me/wandb ($WANDB_DIR, instead of the run directory)" in settings.lines
    unset = wandb_settings({}, {}, "/runs/r1")
    assert unset.dir == "/runs/r1" and "W&B files: /runs/r1/wandb ($WANDB_DIR unset)" in unset.lines
