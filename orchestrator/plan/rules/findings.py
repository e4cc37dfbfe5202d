"""What a validation rule yields: a Finding (error or warning, a stable rule name, a message
naming every value involved and how to fix it), and ConfigInvalid, which carries the
errors of a config that must not run. The small constructors every rule module uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning
    rule: str  # short identifier, stable for tests and scripts
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: [{self.rule}] {self.message}"


class ConfigInvalid(ValueError):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        errors = [f for f in findings if f.severity == ERROR]
        super().__init__(
            f"{len(errors)} configuration error(s), nothing was submitted:\n" + "\n".join(f"  {f}" for f in errors)
        )


def error(rule: str, message: str) -> Finding:
    return Finding(ERROR, rule, message)


def warning(rule: str, message: str) -> Finding:
    return Finding(WARNING, rule, message)


def one_of(rule: str, key: str, value, allowed: Iterable) -> Iterator[Finding]:
    allowed = tuple(allowed)
    if value not in allowed:
        yield error(rule, f"{key}={value!r} is not one of {', '.join(repr(a) for a in allowed)}")


def positive(rule: str, **values) -> Iterator[Finding]:
    for key, value in values.items():
        if value is None or value < 1:
            yield error(rule, f"{key}={value} must be a positive integer")
