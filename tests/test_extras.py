"""Optional features name the extra to install when their library is missing."""

import sys

import pytest

from ray_stagetree._extras import MissingExtraError, require


def test_a_missing_library_names_the_feature_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.gaussian_process", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r"StructuredBO needs sklearn\.gaussian_process.*ray_stagetree\[bo\]"):
        require("sklearn.gaussian_process", "StructuredBO", "bo")


def test_an_installed_library_is_returned():
    assert require("json", "anything", "none").dumps([1]) == "[1]"


def test_a_tuner_with_the_monitor_checks_its_extra_before_anything_runs(monkeypatch):
    from trainables_for_tests import noisy_descent

    from ray_stagetree import Tuner

    monkeypatch.setitem(sys.modules, "flask", None)
    with pytest.raises(MissingExtraError, match=r'Tuner\(monitor=True\) needs flask.*"ray_stagetree\[monitor\]"'):
        Tuner(noisy_descent, monitor=True)
