"""Searchers over sequence search spaces (installed as ``ray_stagetree.searchers``)."""

from ray_stagetree.searchers.ask_tell import AskTellAlgorithm, AskTellSearcher
from ray_stagetree.searchers.structured_bo import StructuredBO
from ray_stagetree.searchers.variants import (
    SequenceGridSearch,
    from_tune_config,
    generate_trials,
    to_tune_space,
)

__all__ = [
    "AskTellAlgorithm",
    "AskTellSearcher",
    "generate_trials",
    "SequenceGridSearch",
    "StructuredBO",
    "to_tune_space",
    "from_tune_config",
]
