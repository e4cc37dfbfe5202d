"""Checks before submission that need more than the plan: the demo corpus is there (or
is written first), local datasets open from this machine, and the SLURM cluster could
ever start the job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from launchers.runs import EXIT_INVALID, EXIT_OK, PreparedRun, print_errors


class DemoCorpusError(RuntimeError):
    """Writing the demo corpus failed (its own message is already on stderr)."""


def ensure_demo_corpus(runs: Sequence[PreparedRun]) -> None:
    """data.demo_corpus: write the espeak-ng demo corpus into that directory first unless
    it holds one already (manifest.json, written last). A subprocess, so that this side
    never imports torch."""
    wanted = {}
    for run in runs:
        data = run.container["data"]
        if data.get("demo_corpus"):
            wanted[str(data["demo_corpus"])] = (int(data["demo_corpus_samples"]), data.get("demo_corpus_accent"))
    for root, (samples, accent) in wanted.items():
        manifest = Path(root) / "manifest.json"
        if manifest.is_file():
            _check_demo_corpus(root, json.loads(manifest.read_text()), samples, accent)
            continue
        print(f"data.demo_corpus={root} holds no corpus yet: synthesizing {samples} training utterances "
              f"with espeak-ng first", flush=True)
        proc = subprocess.run([sys.executable, "-m", "orchestrator.data.cli", "demo", root,
                               "--num-samples", str(samples), "--no-progress",
                               *(["--accent", str(accent)] if accent else [])])
        if proc.returncode != 0:
            raise DemoCorpusError(f"writing the demo corpus into {root} failed (exit {proc.returncode}); fix what "
                                  f"it printed above, or point data.demo_corpus (or $AUDIOLLM_DEMO_DATA) elsewhere")


def _check_demo_corpus(root: str, manifest: dict, samples: int, accent: Optional[str]) -> None:
    """The corpus already in data.demo_corpus is the one the config asks for: its format,
    number of training utterances and accent (a silent reuse would train on another corpus)."""
    from orchestrator.data.demo import CORPUS_FORMAT, CORPUS_FORMAT_CHANGE

    again = (f"delete {root} to have it written again, or point data.demo_corpus (or $AUDIOLLM_DEMO_DATA) "
             f"elsewhere")
    found = manifest.get("format", 1)
    if found != CORPUS_FORMAT:
        raise DemoCorpusError(f"data.demo_corpus={root} holds a demo corpus of format {found}; this version writes and "
                              f"reads format {CORPUS_FORMAT} ({CORPUS_FORMAT_CHANGE}): {again}")
    if manifest.get("num_samples") != samples:
        raise DemoCorpusError(f"data.demo_corpus={root} holds a demo corpus of {manifest.get('num_samples')} training "
                              f"utterances, but data.demo_corpus_samples={samples}: set "
                              f"data.demo_corpus_samples={manifest.get('num_samples')} to train on it, or {again}")
    if (manifest.get("accent") or None) != (accent or None):
        found_accent = manifest.get("accent") or "null"
        raise DemoCorpusError(f"data.demo_corpus={root} holds the demo corpus of accent {found_accent}, but "
                              f"data.demo_corpus_accent={accent or 'null'}: {again}")


NEVER_STARTS = "not submitted: this cluster could never start the job (it would pend forever)"


def cluster_problems(launcher: dict) -> list[str]:
    """Why the launcher's cluster could never start the job (its kind's `cluster_check`);
    [] if it could or nothing was checked."""
    from launchers.kinds import launcher_for

    check = launcher_for(launcher["kind"]).cluster_check(launcher)
    if check.skipped:
        print(f"cluster check skipped: {check.skipped}", file=sys.stderr)
    return check.problems or []


def dry_run_or_refusal(launcher: dict, dry_run_text: str) -> Optional[int]:
    """The cluster check's verdict before a submission: with launcher.dry_run, print
    `dry_run_text` and what the cluster could never start, and return 0; a job the
    cluster could never start is refused (returns 2, naming why); None: go on and submit."""
    problems = cluster_problems(launcher)
    if launcher["dry_run"]:
        print(dry_run_text, end="")
        if problems:
            print_errors(problems, header="this cluster could never start the job")
        return EXIT_OK
    if problems:
        print_errors(problems, header=NEVER_STARTS)
        return EXIT_INVALID
    return None
