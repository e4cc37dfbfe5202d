"""The job's logging setup (orchestrator/train/entry.py setup_logging)."""


def test_the_jobs_logging_keeps_a_host_applications_handlers():
    import logging

    from orchestrator.train.entry import setup_logging

    root = logging.getLogger()
    saved = list(root.handlers), root.level
    host = logging.NullHandler()
    root.addHandler(host)
    try:
        setup_logging(0)
        setup_logging(0)  # twice: ours replaced, not doubled
        ours = [h for h in root.handlers if getattr(h, "_audiollm", False)]
        assert host in root.handlers and len(ours) == 1
    finally:
        root.handlers, _ = saved
        root.setLevel(saved[1])


def test_checkpoint_scores_go_to_the_training_runs_wandb_run_on_their_own_axis(tmp_path, monkeypatch):
    """`audiollm eval RUN --all`'s rows, into the W&B run whose id the training stored
    (offline here): eval/step as the x axis of every eval/ series."""
    import wandb

    from orchestrator.train.metrics import log_evaluations_to_wandb

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    monkeypatch.setenv("WANDB_SERVICE", "")  # the service W&B starts here is not left to later tests
    (tmp_path / "wandb_id").write_text("trainingrun0001\n")
    rows = [{"step": 6, "checkpoint": "step_000006", "val_loss": 2.5, "wer/all": 0.6},
            {"step": 12, "checkpoint": "step_000012", "val_loss": 2.0, "wer/all": 0.4}]
    said = log_evaluations_to_wandb(tmp_path, {"backend": "wandb", "mode": "offline"}, {"name": "r"}, rows)
    assert said == "W&B: 2 checkpoints' scores logged to run trainingrun0001 (offline)"
    # run.finish() may return before W&B's service has written the records (it did under a
    # loaded CI machine); its teardown, which a command's exit runs, waits for them
    wandb.teardown()
    (run,) = (tmp_path / "wandb").glob("offline-run-*-trainingrun0001")
    records = (run / "run-trainingrun0001.wandb").read_bytes()
    assert b"eval/wer/all" in records and b"eval/step" in records
    assert log_evaluations_to_wandb(tmp_path, {"backend": "none"}, {}, rows) is None


def test_a_run_starts_its_own_wandb_service_not_one_it_inherited(tmp_path, monkeypatch):
    """A job started from a process that used W&B itself (a notebook, a test runner)
    inherits $WANDB_SERVICE: connecting to that service would tie the run's id to a
    process that outlives a rank killed hard (the restart is told the id is in use).
    Here the inherited service is gone: the run still logs, to a service of its own."""
    from orchestrator.train.metrics import MetricsWriter

    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/nonexistent/wandb-service.sock")
    writer = MetricsWriter(tmp_path, {"backend": "wandb", "mode": "offline"}, {"name": "r"}, "ownservice0001", 0)
    assert writer.wandb is not None, "W&B did not start"
    writer.log(1, {"loss": 2.0})
    writer.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*-ownservice0001"))


def test_a_run_writes_its_wandb_files_where_wandb_dir_says(tmp_path, monkeypatch):
    """$WANDB_DIR, as W&B's users set it (a scratch file system), is honoured and said."""
    from orchestrator.train.metrics import MetricsWriter

    monkeypatch.setenv("WANDB_SERVICE", "")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = MetricsWriter(run_dir, {"backend": "wandb", "mode": "offline"}, {"name": "r"}, "wandbdir000001", 0)
    writer.log(1, {"loss": 2.0})
    writer.finish()
    assert list((tmp_path / "scratch" / "wandb").glob("offline-run-*-wandbdir000001"))
    assert not (run_dir / "wandb").exists()
