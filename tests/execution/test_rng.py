"""Capture / restore of the global random number generators (ray_stagetree.execution.rng)."""

from __future__ import annotations

import io
import json
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest

from ray_stagetree.execution.rng import capture_rng_state, restore_rng_state, seed_everything


def _draw(with_torch: bool = True) -> list:
    # An odd number of normals leaves NumPy's cached Gaussian set (has_gauss=1).
    out = [random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(3).tolist()]
    if with_torch and "torch" in sys.modules:
        torch = sys.modules["torch"]
        out += [torch.rand(4).tolist(), torch.randint(0, 1000, (3,)).tolist(), torch.randn(5).tolist()]
    return out


def test_restore_replays_python_numpy_and_torch():
    pytest.importorskip("torch")
    seed_everything(3)
    _draw()  # move every generator off its seeded start
    state = capture_rng_state()
    assert {"python", "numpy", "torch"} <= set(state)
    first = _draw()
    restore_rng_state(state)
    assert _draw() == first
    assert _draw() != first  # and the generators keep going afterwards


def test_state_is_plain_data_and_survives_pickle_and_torch_save():
    torch = pytest.importorskip("torch")
    seed_everything(11)
    state = capture_rng_state()
    expected = _draw()

    restore_rng_state(pickle.loads(pickle.dumps(state)))
    assert _draw() == expected

    buffer = io.BytesIO()
    torch.save({"rng": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["rng"]  # no tensors, no numpy arrays
    restore_rng_state(loaded)
    assert _draw() == expected

    def walk(value):
        assert not isinstance(value, (torch.Tensor, np.ndarray)), type(value)
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(state)
    assert isinstance(state["torch"], bytes)


def test_state_without_torch_entries_leaves_torch_alone():
    torch = pytest.importorskip("torch")
    seed_everything(5)
    state = capture_rng_state()
    no_torch = {k: v for k, v in state.items() if not k.startswith("torch")}
    expected = _draw(with_torch=False)

    torch.manual_seed(1234)
    torch_before = torch.get_rng_state()
    restore_rng_state(no_torch)
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert _draw(with_torch=False) == expected


def test_json_round_trip_of_python_and_numpy_state():
    seed_everything(8)
    state = capture_rng_state()
    plain = {k: v for k, v in state.items() if not k.startswith("torch")}
    expected = _draw(with_torch=False)
    restore_rng_state(json.loads(json.dumps(plain)))  # tuples come back as lists
    assert _draw(with_torch=False) == expected


def test_capture_without_torch_imported_has_no_torch_entry():
    code = (
        "import sys, random\n"
        "from ray_stagetree.execution.rng import capture_rng_state, restore_rng_state\n"
        "s = capture_rng_state()\n"
        "assert 'torch' not in sys.modules, 'rng imported torch'\n"
        "assert not any(k.startswith('torch') for k in s), sorted(s)\n"
        "a = random.random(); restore_rng_state(s); assert random.random() == a\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cuda_device_count_mismatch_is_a_clear_error_and_changes_nothing():
    torch = pytest.importorskip("torch")
    seed_everything(2)
    state = capture_rng_state()
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    fake = dict(state, torch_cuda=[b"\0" * 16] * (have + 1), python=(3, tuple(range(625)), None))
    before = random.getstate()
    with pytest.raises(ValueError, match=rf"{have + 1} CUDA device\(s\).*sees {have}"):
        restore_rng_state(fake)
    assert random.getstate() == before  # checked before any generator was touched


def test_bad_state_is_rejected():
    with pytest.raises(ValueError, match="must be a dict"):
        restore_rng_state([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        restore_rng_state({"version": 99})


def test_seed_everything_is_reproducible_and_validates():
    pytest.importorskip("torch")
    seed_everything(42)
    a = _draw()
    seed_everything(42)
    assert _draw() == a
    seed_everything(43)
    assert _draw() != a
    seed_everything(2**40)  # wider than NumPy's 32-bit legacy seed
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            seed_everything(bad)  # type: ignore[arg-type]
