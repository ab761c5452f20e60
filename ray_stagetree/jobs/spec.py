"""A job spec: one YAML or JSON file that describes a study completely.

`JobSpec.from_file` reads and checks it (JSON Schema first, then every
domain, sequence, scheduler, searcher and import it names) and reports
every problem at once, each naming its field; `JobSpec.tuner` builds the
`ray_stagetree.Tuner` the spec describes, the one a Python script would
write. docs/guides/cli.md ("Job specs and the stagetree command") shows the format.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import yaml
from ray import tune

from ray_stagetree._extras import MissingExtraError
from ray_stagetree.jobs import schema
from ray_stagetree.jobs.algorithms import build_policy, build_scheduler, build_searcher
from ray_stagetree.jobs.domains import to_param_space
from ray_stagetree.jobs.errors import SpecError, field_path
from ray_stagetree.jobs.imports import load_object
from ray_stagetree.runtime.driver.tuner import Tuner, writing_nothing

#: Parts of a spec whose problems leave the Tuner's checks meaningful: a
#: value that cannot be built stands in as None.
_SOFT_FIELDS = (("param_space",), ("with_parameters",))

#: Top-level keys passed to the Tuner as keyword arguments of the same name,
#: only when the spec has them.
TUNER_KEYWORDS = ("reproducible", "seed", "repeats", "deterministic_algorithms", "monitor")


class JobSpec:
    """A checked job spec.

    Parameters
    ----------
    data:
        The spec as loaded from YAML or JSON.
    base_dir:
        Where the spec's relative imports and script paths are found (the
        spec file's folder).
    source:
        How messages name the spec (its path).

    Raises
    ------
    SpecError
        Listing every problem found, before anything runs.

    Examples
    --------
    >>> spec = JobSpec.from_file("examples/mnist1d_study.yaml")     # doctest: +SKIP
    >>> results = spec.tuner().fit()                                 # doctest: +SKIP
    """

    def __init__(self, data: Any, base_dir: str = ".", source: str = "the job spec") -> None:
        self.data = data
        self.base_dir = os.path.abspath(base_dir)
        self.source = source
        # Every problem in one go: the shape first, then what needs Tune and imports to
        # judge in every part whose shape is right, then the Tuner's own checks.
        shape = schema.located_problems(data)
        problems = [message for _, message in shape]
        if not isinstance(data, dict):
            raise SpecError(problems, source)
        self._broken = [path for path, _ in shape]
        self.param_space, found = to_param_space(data.get("param_space", {}) if self._intact("param_space") else {})
        problems += found
        self._parameters = {
            key: self._load(("with_parameters", key, "call"), value["call"], problems)
            for key, value in self._section("with_parameters").items()
            if isinstance(value, dict) and "call" in value
        }
        # What the Tuner's checks read: a problem here would only repeat itself as theirs.
        settled = len(problems)
        self.function = self._load("trainable", data["trainable"], problems) if self._intact("trainable") else None
        self.tune_config = self._tune_config(problems)
        self.run_config = self._run_config(problems)
        self.stagetree = self._stagetree(problems)
        unsettled = len(problems) > settled or any(path[:1] not in _SOFT_FIELDS for path in self._broken)
        if not unsettled:
            try:
                self.dry_tuner()  # the Tuner's own checks (horizon, metric and scheduler, checkpoint config, ...)
            except SpecError as error:
                problems += error.problems
        if problems:
            raise SpecError(problems, source)

    def _intact(self, *path: Any) -> bool:
        """Whether the value at ``path`` is in the spec with a shape the schema accepts."""
        value = self.data
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return False
            value = value[key]
        return not any(broken[: len(path)] == path for broken in self._broken)

    def _section(self, name: str) -> dict[str, Any]:
        """The keys of the spec's section ``name`` that the schema accepts."""
        section = self.data.get(name)
        if not isinstance(section, dict):
            return {}
        known = schema.SCHEMA["properties"][name].get("properties")
        return {
            key: value for key, value in section.items() if (known is None or key in known) and self._intact(name, key)
        }

    @classmethod
    def from_file(cls, path: str) -> JobSpec:
        """Read a ``.yaml`` / ``.yml`` / ``.json`` spec; a file that is missing
        or does not parse raises SpecError naming the line."""
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as error:
            raise SpecError([f"cannot read the file ({error.strerror})"], path) from None
        try:
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except json.JSONDecodeError as error:
            where = f"at line {error.lineno}, column {error.colno}"
            raise SpecError([f"not valid JSON: {error.msg} {where}"], path) from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise SpecError([f"not valid YAML: {getattr(error, 'problem', None) or error}{where}"], path) from None
        return cls(data, os.path.dirname(os.path.abspath(path)), path)

    # -- building ---------------------------------------------------------------------

    def tuner(self, storage_path: str | None = None, name: str | None = None) -> Tuner:
        """The `Tuner` the spec describes; ``storage_path`` and ``name``
        override ``run_config``'s. Objects named by ``with_parameters: {call:
        ...}`` are built here, so Ray must be running (as for ``tune.with_parameters``)."""
        return self._tuner(self.trainable(), self._overridden(storage_path, name))

    def _overridden(self, storage_path: str | None, name: str | None) -> tune.RunConfig:
        run_config = copy.copy(self.run_config)
        if storage_path is not None:
            run_config.storage_path = checked_storage_path(storage_path, "--storage-path", self.source)
        if name is not None:
            run_config.name = name
        return run_config

    def dry_tuner(self, run_config: tune.RunConfig | None = None) -> Tuner:
        """The spec's `Tuner` with the bare trainable: ``with_parameters`` objects
        are not built and Ray is not needed. For dry runs (which trials, what
        horizon) and for checking the spec: it writes nothing (a plan leaves no
        experiment folder behind, and never touches one of the same name)."""
        with writing_nothing():
            return self._tuner(self._with_resources(self.function), run_config or self.run_config)

    def experiment_path(self, storage_path: str | None = None, name: str | None = None) -> str:
        """The experiment folder `tuner` with these overrides runs in, known
        before the Tuner is built (which writes there) and without Ray."""
        return self.dry_tuner(self._overridden(storage_path, name)).experiment_path

    def _tuner(self, trainable: Any, run_config: tune.RunConfig) -> Tuner:
        keywords = {key: self.data[key] for key in TUNER_KEYWORDS if key in self.data}
        try:
            return Tuner(
                trainable,
                param_space=self.param_space,
                tune_config=self.tune_config,
                run_config=run_config,
                **self.stagetree,
                **keywords,
            )
        except (TypeError, ValueError, MissingExtraError) as error:  # MissingExtraError: monitor without its extra
            raise SpecError([str(error)], self.source) from None

    def trainable(self) -> Any:
        """The trainable with its parameters and resources, as ``tune.with_parameters``
        and ``tune.with_resources`` wrap it."""
        trainable = self.function
        arguments = self.data.get("with_parameters")
        if arguments:
            values = {
                key: self._parameters[key](**value.get("kwargs", {})) if key in self._parameters else value
                for key, value in arguments.items()
            }
            trainable = tune.with_parameters(trainable, **values)
        return self._with_resources(trainable)

    def _with_resources(self, trainable: Any) -> Any:
        resources = self.data.get("resources")
        return tune.with_resources(trainable, resources) if resources else trainable

    def _load(self, field: str | tuple, reference: str, problems: list[str]) -> Any:
        try:
            return load_object(reference, self.base_dir)
        except Exception as error:  # importing user code may raise anything
            kind = "" if isinstance(error, ImportError) else f"{type(error).__name__} while importing: "
            problems.append(f"{field_path(field if isinstance(field, tuple) else (field,))}: {kind}{error}")
            return None

    def _tune_config(self, problems: list[str]) -> tune.TuneConfig:
        section = self._section("tune_config")
        for key, build in (("scheduler", build_scheduler), ("search_alg", build_searcher)):
            if key in section:
                section[key], found = build(section[key], self.base_dir, ("tune_config", key))
                problems += found
        return tune.TuneConfig(**section)

    def _stagetree(self, problems: list[str]) -> dict[str, Any]:
        """The Tuner's own keyword arguments; the execution policy as a
        name, or as the instance its entry describes."""
        section = self._section("stagetree")
        if "execution_policy" in section:
            path = ("stagetree", "execution_policy")
            section["execution_policy"], found = build_policy(section["execution_policy"], self.base_dir, path)
            problems += found
        return section

    def _run_config(self, problems: list[str]) -> tune.RunConfig:
        section = self._section("run_config")
        if "storage_path" in section:
            try:
                given = section["storage_path"]
                section["storage_path"] = checked_storage_path(given, "run_config.storage_path", self.source)
            except SpecError as error:
                problems += error.problems
                section["storage_path"] = None
        nested = {"failure_config": tune.FailureConfig, "checkpoint_config": tune.CheckpointConfig}
        for key, config_class in nested.items():
            if key in section:
                try:
                    section[key] = config_class(**section[key])
                except (TypeError, ValueError) as error:
                    problems.append(f"run_config.{key}: {error}")
                    section[key] = None
        return tune.RunConfig(**section)


def checked_storage_path(path: str, field: str, source: str) -> str:
    """``path`` with ``~`` expanded. A relative path is refused, as the Tuner
    refuses it: under ``stagetree submit`` it would land in the job's temporary folder.

    Raises SpecError naming ``field`` and ``source``."""
    expanded = os.path.expanduser(path)
    if "://" in expanded or os.path.isabs(expanded):
        return expanded
    raise SpecError(
        [
            f"{field}: must be an absolute path, a path under '~' or a URI (s3://, gs://, file://, ...), got {path!r}: "
            "a relative path would land in the working folder of whichever process writes it"
        ],
        source,
    )
