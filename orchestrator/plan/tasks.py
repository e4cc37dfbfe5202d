"""What each dataset asks of the model: its prompt, its columns, its validation metric.

A dataset entry of `data.train` / `data.validation` is one of two formats:

  single        one audio clip (column `audio_field`) and one answer (`text_field`),
                behind a template with <SpeechHere> once. The template is, first found:
                the entry's `prompt_template`; its `task` preset's instruction rendered as
                a user turn by the tokenizer's chat template; `data.prompt_template`.
                `{instruction}` in the template takes the sample's `instruction_field`
                text, so one dataset can hold many prompts.
  conversation  `turns_field` holds a JSON list of turns {role, text, audio, train}:
                role user | assistant | system; audio: the names of the sample's
                columns that hold the turn's audio segments, one encoded clip each
                (MDS has no safe list-of-bytes type: a dataset whose samples have up
                to N segments writes N audio columns); train: false keeps an assistant
                turn out of the loss. The tokenizer's chat template renders the turns;
                the loss covers the assistant turns.

No torch and no tokenizer here: the submit side checks entries with `entry_problems`
before anything is queued, and the job side resolves the same `DatasetFormat`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

SPEECH_MARKER = "<SpeechHere>"
INSTRUCTION_SLOT = "{instruction}"
METRICS = ("wer", "exact", "bleu")
# How references and hypotheses are normalised before WER and exact match (BLEU scores the
# raw strings): the names a validation dataset's `normaliser` and `audiollm eval
# --normaliser` take. What each does: orchestrator/scoring/normalisers.py (the job side:
# the Whisper ones import transformers). "audiollm" is the default: the demo corpus
# spells numbers as words, and its figures were measured with it.
NORMALISERS = ("audiollm", "whisper_english", "whisper_basic")
DEFAULT_NORMALISER = "audiollm"
NORMALISED_METRICS = ("wer", "exact")
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class TaskPreset:
    instruction: str  # the user turn; <SpeechHere> once, {instruction} for a per-sample instruction
    metric: str
    transcription: bool  # the answer is the clip's transcript (joint CTC applies)


PRESETS = {
    "transcribe": TaskPreset(f"Transcribe: {SPEECH_MARKER}", "wer", True),
    "translate": TaskPreset(f"Translate into English: {SPEECH_MARKER}", "bleu", False),
    "answer": TaskPreset(f"{SPEECH_MARKER}\nAnswer the question.", "exact", False),
    "caption": TaskPreset(f"Describe the audio: {SPEECH_MARKER}", "bleu", False),
    "instruct": TaskPreset(f"{SPEECH_MARKER}\n{INSTRUCTION_SLOT}", "bleu", False),
}


@dataclass(frozen=True)
class DatasetFormat:
    name: str
    conversation: bool
    # single: a full template (entry's or data.prompt_template), or None when `instruction`
    # is to be rendered by the chat template (a task preset).
    template: Optional[str]
    instruction: Optional[str]
    instruction_field: Optional[str]
    audio_field: str
    text_field: str
    turns_field: Optional[str]
    metric: str
    ctc: bool
    normaliser: Optional[str] = None  # NORMALISERS; None where the metric (bleu) normalises nothing

    def required_columns(self) -> List[Tuple[str, str]]:
        """(column, the config key that names it) every sample must have."""
        where = f"data[{self.name}]"
        if self.conversation:  # its audio columns are named by each sample's turns
            cols = [(self.turns_field, f"{where}.turns_field")]
        else:
            cols = [(self.audio_field, f"{where}.audio_field"), (self.text_field, f"{where}.text_field")]
        if self.instruction_field:
            cols.append((self.instruction_field, f"{where}.instruction_field"))
        return cols


def _get(entry: Any, key: str):
    return getattr(entry, key, None) if not isinstance(entry, dict) else entry.get(key)


def dataset_format(entry: Any, data_cfg: Any, name: Optional[str] = None) -> DatasetFormat:
    """The resolved format of one dataset entry (call `entry_problems` first: this
    assumes a valid entry). `name`: the dataset's name after glob expansion."""
    name = name or str(_get(entry, "name"))
    task = _get(entry, "task")
    preset = PRESETS.get(task) if task else None
    conversation = bool(_get(entry, "turns_field"))
    template = _get(entry, "prompt_template")
    instruction = None
    if template is None and preset is None:
        template = data_cfg.prompt_template
    elif template is None:
        instruction = preset.instruction
    metric = entry_metric(entry)
    ctc = _get(entry, "ctc")
    if ctc is None:  # the answer is the clip's transcript: the default template, or a transcription preset
        ctc = not conversation and (preset.transcription if preset else _get(entry, "prompt_template") is None)
    return DatasetFormat(
        name=name, conversation=conversation, template=None if conversation else template,
        instruction=None if conversation else instruction, instruction_field=_get(entry, "instruction_field"),
        audio_field=_get(entry, "audio_field") or data_cfg.audio_field,
        text_field=_get(entry, "text_field") or data_cfg.text_field, turns_field=_get(entry, "turns_field"),
        metric=metric, ctc=bool(ctc),
        normaliser=(_get(entry, "normaliser") or DEFAULT_NORMALISER) if metric in NORMALISED_METRICS else None)


def entry_metric(entry: Any) -> str:
    """The metric a (valid) entry is scored by: its own, its task preset's, else wer."""
    task = _get(entry, "task")
    return _get(entry, "metric") or (PRESETS[task].metric if task in PRESETS else "wer")


def entry_problems(entry: Any, data_cfg: Any, split: str) -> List[str]:
    """Everything wrong with one `data.<split>` entry, each message naming the dataset."""
    name = str(_get(entry, "name"))
    where = f"data.{split}[{name}]"
    out: List[str] = []
    task, template = _get(entry, "task"), _get(entry, "prompt_template")
    turns, instruction_field = _get(entry, "turns_field"), _get(entry, "instruction_field")
    if task is not None and task not in PRESETS:
        out.append(f"{where}.task={task!r} is not a task preset; use one of {', '.join(PRESETS)} "
                   f"(or give the dataset its own prompt_template)")
    if turns:
        for key in ("task", "prompt_template", "instruction_field", "audio_field", "text_field"):
            if _get(entry, key) is not None:
                out.append(f"{where}: {key} and turns_field together; a conversation dataset's prompts, answers "
                           f"and audio columns are in its turns (rendered by the tokenizer's chat template): "
                           f"remove {key}")
        if _get(entry, "ctc"):
            out.append(f"{where}.ctc=true on a conversation dataset; joint CTC needs one clip whose transcript is "
                       f"the answer: set ctc=false or leave it unset")
    else:
        if template is not None:
            source, text = f"{where}.prompt_template", template
        elif task in PRESETS:
            source, text = f"task preset {task!r} ({where}.task)", PRESETS[task].instruction
        else:
            source, text = f"data.prompt_template (the default of {where})", data_cfg.prompt_template
        count = text.count(SPEECH_MARKER)
        if count != 1:
            out.append(f"{source} must contain {SPEECH_MARKER} exactly once (found {count}): {text!r}")
        if instruction_field and INSTRUCTION_SLOT not in text:
            out.append(f"{where}.instruction_field={instruction_field!r} but {source} has no {INSTRUCTION_SLOT} "
                       f"for it: {text!r}")
        if not instruction_field and INSTRUCTION_SLOT in text:
            out.append(f"{source} has {INSTRUCTION_SLOT} but {where}.instruction_field is not set: name the "
                       f"column with each sample's instruction")
    metric = _get(entry, "metric")
    if metric is not None:
        if split == "train":
            out.append(f"{where}.metric={metric!r}: a metric scores validation datasets only; move it to the "
                       f"data.validation entry")
        elif metric not in METRICS:
            out.append(f"{where}.metric={metric!r}; use one of {', '.join(METRICS)}")
    out += normaliser_problems(_get(entry, "normaliser"), entry_metric(entry), where, split)
    return out


def normaliser_problems(normaliser: Optional[str], metric: str, where: str, split: str = "validation") -> List[str]:
    """What is wrong with a dataset's `normaliser` (None: unset, the default's)."""
    if normaliser is None:
        return []
    if split == "train":
        return [f"{where}.normaliser={normaliser!r}: a normaliser scores validation datasets only; move it to the "
                f"data.validation entry"]
    if normaliser not in NORMALISERS:
        return [f"{where}.normaliser={normaliser!r}; use one of {', '.join(NORMALISERS)}"]
    if metric not in NORMALISED_METRICS:
        return [f"{where}.normaliser={normaliser!r} with metric {metric!r}: {metric} scores the raw strings; a "
                f"normaliser applies to {' and '.join(NORMALISED_METRICS)} only: remove it"]
    return []


def conversation_problems(turns: Any, columns: Any) -> List[str]:
    """What is wrong with one sample's turns, given the sample's column names (each
    message names the turn and segment)."""
    if not isinstance(turns, list) or not turns:
        return [f"turns must be a non-empty JSON list of {{role, text, audio}}, got {type(turns).__name__}"]
    out: List[str] = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict):
            out.append(f"turn {k} is a {type(turn).__name__}, not an object {{role, text, audio}}")
            continue
        role, text, audio = turn.get("role"), turn.get("text", ""), turn.get("audio") or []
        if role not in ROLES:
            out.append(f"turn {k}: role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(text, str):
            out.append(f"turn {k}: text is a {type(text).__name__}, not a string")
            continue
        if not isinstance(audio, list) or any(not isinstance(c, str) for c in audio):
            out.append(f"turn {k}: audio must be a list of column names, got {audio!r}")
            continue
        missing = [c for c in audio if c not in columns]
        if missing:
            out.append(f"turn {k}: audio segment column {missing[0]!r} is not in the sample (its columns: "
                       f"{sorted(columns)})")
        if role == "assistant" and audio:
            out.append(f"turn {k}: an assistant turn with audio segments {audio}; audio goes in user turns")
        markers = text.count(SPEECH_MARKER)
        if markers and markers != len(audio):
            out.append(f"turn {k}: {markers} {SPEECH_MARKER} markers but {len(audio)} audio segments {audio}; "
                       f"give one marker per segment, or none to put the segments before the text")
    if not any(isinstance(t, dict) and t.get("role") == "assistant" for t in turns):
        out.append("no assistant turn: nothing to train or score")
    return out
