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
