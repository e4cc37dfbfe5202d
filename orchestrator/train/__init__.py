"""Job side: the training runtime that runs on every rank (entry.main(run_dir))."""
