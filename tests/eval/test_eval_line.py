"""How the training loop shows generation metrics: the console's evaluation line and
the loss-curve PNG (orchestrator/train/metrics.py)."""

import json

import pytest

import matplotlib.image

from orchestrator.train.metrics import eval_line, plot_loss_curve

WER_ONLY = {"val_loss": 1.23456, "wer/digits_heldout_accent": 0.084, "wer/digits_us": 0.05, "wer/all": 0.067,
            "wer/utterances": 400.0}
MIXED = {**WER_ONLY, "exact/numerals_heldout_accent": 0.93, "exact/all": 0.93, "exact/utterances": 200.0,
         "bleu/captions": 23.44, "bleu/all": 23.44, "bleu/utterances": 100.0}


def test_a_wer_only_run_prints_the_line_it_always_printed():
    assert eval_line(7, WER_ONLY) == ("eval at step 7: val_loss 1.2346 | WER 6.7% over 400 utterances "
                                      "(digits_heldout_accent 8.4%, digits_us 5.0%)")


def test_every_metric_present_is_printed_with_its_datasets():
    assert eval_line(7, MIXED) == (
        "eval at step 7: val_loss 1.2346 | WER 6.7% over 400 utterances (digits_heldout_accent 8.4%, digits_us 5.0%)"
        " | exact 93.0% over 200 utterances (numerals_heldout_accent 93.0%)"
        " | BLEU 23.4 over 100 utterances (captions 23.4)")
    assert eval_line(7, {"loss": 1.0}) is None


def test_the_loss_curve_has_a_panel_per_metric(tmp_path):
    def width(run_dir, rows):
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, **r}) + "\n"
                                                       for s, r in enumerate(rows, 1)))
        return matplotlib.image.imread(plot_loss_curve(run_dir)).shape[1]

    plain = width(tmp_path / "plain", [{}, {}])
    wer = width(tmp_path / "wer", [WER_ONLY, WER_ONLY])
    mixed = width(tmp_path / "mixed", [WER_ONLY, MIXED])
    assert plain < wer < mixed


def test_the_loss_curve_smooths_by_an_exponential_moving_average():
    from orchestrator.train.metrics import _smoothed

    assert _smoothed([3.0, 3.0, 3.0], span=5) == [3.0, 3.0, 3.0]
    alpha = 2 / (3 + 1)
    assert _smoothed([0.0, 1.0, 1.0], span=3) == pytest.approx([0.0, alpha, alpha + (1 - alpha) * alpha])
    assert _smoothed([4.0, 0.0], span=1) == [4.0, 0.0]  # span 1: the raw values
