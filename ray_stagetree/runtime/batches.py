"""The messages between the controller and a stage worker: a `BatchSpec`
says what to train, a `BatchOutcome` carries back what was trained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchSpec:
    batch_id: int
    config: dict[str, Any]
    segments: list[tuple[int, int, int]]  # (node_id, start, stop)
    save_steps: set[int]
    source: Any = None  # ObjectRef of a CheckpointPayload, or None for a fresh start

    @property
    def start(self) -> int:
        return self.segments[0][1]

    @property
    def stop(self) -> int:
        return self.segments[-1][2]


@dataclass
class BatchOutcome:
    batch_id: int
    records: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[tuple[int, int, Any, int]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    error_step: int | None = None
    error_node: int | None = None
