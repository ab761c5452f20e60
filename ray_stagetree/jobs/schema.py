"""The job spec's JSON Schema, and its errors as messages a user can act on.

The schema checks the spec's shape: which keys exist, their types, ranges
and names. What needs Tune to judge (a domain's arguments, a sequence's
parameters, a scheduler's keyword arguments) is checked when the spec is
built (`ray_stagetree.jobs.build`), still before anything runs.

Every message names the field (``tune_config.mode``), the value and what is
allowed; `problems` returns all of them, not only the first.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from ray_stagetree.jobs.errors import field_path
from ray_stagetree.validation import did_you_mean

_IMPORT_PATH = r"^[^:\s]+:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
_NAMED = {
    "description": "a name, or a dict {name: ..., <keyword arguments>}",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
    ],
}
_POSITIVE_COUNT = {"type": "integer", "minimum": 1}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ray_stagetree job spec",
    "type": "object",
    "required": ["trainable"],
    "additionalProperties": False,
    "properties": {
        "trainable": {
            "type": "string",
            "pattern": _IMPORT_PATH,
            "description": "'module:function', 'module:Class' or 'path/to/script.py:function'",
        },
        "with_parameters": {
            "type": "object",
            "description": "keyword arguments for the trainable (tune.with_parameters): JSON values, or "
            "{call: 'module:function', kwargs: {...}} for an object built once on the driver",
            "additionalProperties": {
                "anyOf": [
                    {
                        "type": "object",
                        "required": ["call"],
                        "additionalProperties": False,
                        "properties": {
                            "call": {"type": "string", "pattern": _IMPORT_PATH},
                            "kwargs": {"type": "object"},
                        },
                    },
                    {"not": {"type": "object", "required": ["call"]}},
                ],
                "description": "a JSON value, or {call: 'module:function', kwargs: {...}}",
            },
        },
        "resources": {
            "type": "object",
            "description": "resources per trial (tune.with_resources): cpu, gpu, memory or a custom resource",
            "additionalProperties": {"type": "number", "minimum": 0},
        },
        "param_space": {"type": "object"},
        "tune_config": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "metric": {"type": "string", "minLength": 1},
                "mode": {"enum": ["min", "max"]},
                "num_samples": {
                    "type": "integer",
                    "anyOf": [{"const": -1}, {"minimum": 1}],
                    "description": "an int >= 1, or -1 (trials without end, until time_budget_s, a stopper or the searcher ends it)",
                },
                "max_concurrent_trials": {
                    "anyOf": [_POSITIVE_COUNT, {"type": "null"}],
                    "description": "an int >= 1, or null (no limit)",
                },
                "time_budget_s": {"type": "number", "exclusiveMinimum": 0},
                "scheduler": _NAMED,
                "search_alg": _NAMED,
            },
        },
        "run_config": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[^/\\]+$", "description": "a folder name (no '/')"},
                "storage_path": {"type": "string", "minLength": 1},
                "stop": {
                    "type": "object",
                    "properties": {"training_iteration": _POSITIVE_COUNT},
                    "additionalProperties": {"type": ["number", "boolean"]},
                },
                "failure_config": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "max_failures": {"type": "integer", "minimum": -1},
                        "fail_fast": {"type": "boolean"},
                    },
                },
                "checkpoint_config": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "num_to_keep": {
                            "anyOf": [_POSITIVE_COUNT, {"type": "null"}],
                            "description": "an int >= 1, or null (keep all)",
                        },
                        "checkpoint_score_attribute": {"type": ["string", "null"]},
                        "checkpoint_score_order": {"enum": ["min", "max"]},
                        "checkpoint_frequency": {"type": "integer", "minimum": 0},
                        "checkpoint_at_end": {"type": ["boolean", "null"]},
                    },
                },
                "verbose": {"enum": [0, 1, 2, 3]},
                "log_to_file": {"type": "boolean"},
            },
        },
        "stagetree": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "stage_sharing": {"type": "boolean"},
                "execution_policy": _NAMED,
                "checkpoint_budget_bytes": {"type": "integer", "minimum": 0},
                "parked_trainables_per_worker": {"type": "integer", "minimum": 0},
            },
        },
        "reproducible": {"type": "boolean"},
        "seed": {"type": "integer", "minimum": 0},
        "repeats": _POSITIVE_COUNT,
        "deterministic_algorithms": {"type": "boolean"},
        "monitor": {"type": "boolean"},
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
_JSON_TYPES = {
    "object": "a dict",
    "array": "a list",
    "string": "a string",
    "integer": "an int",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def problems(spec: Any) -> list[str]:
    """Every way ``spec`` breaks the schema, one message each, in field order."""
    return [message for _, message in located_problems(spec)]


def located_problems(spec: Any) -> list[tuple[tuple, str]]:
    """`problems`, each with the path of the value it is about (``()`` for the
    spec itself), so the checks that follow can skip what is broken."""
    errors = sorted(_VALIDATOR.iter_errors(spec), key=lambda error: [str(part) for part in error.absolute_path])
    return [(tuple(error.absolute_path), _message(error)) for error in errors]


def _message(error: jsonschema.ValidationError) -> str:
    where = field_path(tuple(error.absolute_path))
    value, kind, expected = error.instance, error.validator, error.validator_value
    if kind == "required":
        missing = [key for key in expected if key not in value]
        return f"{where}: missing required key {missing[0]!r}"
    if kind == "additionalProperties" and expected is False:
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(key for key in value if key not in allowed)
        named = ", ".join(f"{key!r}{did_you_mean(key, allowed)}" for key in unknown)
        return f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {named}; allowed: {', '.join(allowed)}"
    if kind == "enum":
        suggestion = did_you_mean(value, [choice for choice in expected if isinstance(choice, str)])
        return f"{where}: {value!r} is not allowed{suggestion}; allowed: {', '.join(map(repr, expected))}"
    if kind == "type":
        wanted = " or ".join(_JSON_TYPES[name] for name in ([expected] if isinstance(expected, str) else expected))
        return f"{where}: must be {wanted}, got {value!r}"
    if kind in ("minimum", "exclusiveMinimum", "maximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<="}[kind]
        return f"{where}: must be {sign} {expected}, got {value!r}"
    description = error.schema.get("description")
    if description and kind in ("anyOf", "oneOf", "pattern", "const"):
        return f"{where}: {value!r} is not allowed; expected {description}"
    if kind in ("anyOf", "oneOf") and error.context:
        return _message(jsonschema.exceptions.best_match(error.context))
    return f"{where}: {error.message}"
