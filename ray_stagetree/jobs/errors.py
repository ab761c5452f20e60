"""The one error a job spec raises: every problem, each naming where it is."""

from __future__ import annotations


class SpecError(ValueError):
    """A job spec that cannot run. ``problems`` lists every mistake found,
    each as ``"<field>: <what is wrong, the value, what is allowed>"``; the
    message holds them all, one a line, prefixed with the spec's source."""

    def __init__(self, problems: list[str], source: str = "the job spec") -> None:
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        header = f"{source}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n  ".join([header, *self.problems]))


def field_path(parts: tuple | list) -> str:
    """``("tune_config", "scheduler", "max_t")`` as ``tune_config.scheduler.max_t``,
    list indices as ``[i]``; the spec's root as ``(top level)``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"
