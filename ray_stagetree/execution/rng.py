"""Capture, restore and seed the process-global random number generators.

A stage that resumes from a checkpoint must draw the same random numbers the
uninterrupted run would have drawn (DESIGN invariant 4), so a checkpoint carries
the state of every global generator training touches: Python's `random`,
NumPy's legacy global generator (`np.random.*`) and, when the trainable uses
torch, torch's CPU generator and every CUDA device's generator.

torch is optional: it is never imported here. Its generators are captured only
when the user's code has already imported torch (it is in `sys.modules`), so a
torch-free trainable pays nothing and gets a torch-free state.

The state is made of plain Python values (tuples, lists, ints, floats, bytes),
so it can be pickled, stored with ``torch.save`` and loaded back with
``torch.load(..., weights_only=True)``; it holds no tensors and no device
references.

Examples
--------
>>> import random
>>> seed_everything(0)
>>> state = capture_rng_state()
>>> first = random.random()
>>> restore_rng_state(state)
>>> random.random() == first
True
"""

from __future__ import annotations

import hashlib
import importlib
import pickle
import random
import sys
import warnings
from typing import Any

import numpy as np

from ray_stagetree.validation import Int, check

__all__ = ["capture_rng_state", "fork_rng_state", "restore_rng_state", "seed_everything"]

#: Bumped when the layout of the captured dict changes.
STATE_VERSION = 1


def capture_rng_state() -> dict[str, Any]:
    """Return the state of the global random number generators.

    Returns
    -------
    dict
        ``{"version": 1, "python": ..., "numpy": ...}`` plus ``"torch"`` (bytes
        of ``torch.get_rng_state()``) when torch is already imported, and
        ``"torch_cuda"`` (one bytes object per device, from
        ``torch.cuda.get_rng_state_all()``) when CUDA is also available.
        Capturing the CUDA state initialises CUDA in this process.

    Examples
    --------
    >>> state = capture_rng_state()
    >>> {"version", "python", "numpy"} <= set(state)
    True
    """
    name, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(name),
            "key": [int(k) for k in key],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = _tensor_to_bytes(torch.get_rng_state())
        if torch.cuda.is_available():
            state["torch_cuda"] = [_tensor_to_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore generators from a dict made by `capture_rng_state`.

    Entries that are missing are left alone (a state captured before torch was
    imported does not touch torch's generators). A state that holds torch
    entries imports torch; if torch is not installed they are skipped with a
    warning.

    Parameters
    ----------
    state:
        The dict `capture_rng_state` returned (possibly after a round trip
        through pickle or ``torch.save`` / ``torch.load``).

    Raises
    ------
    ValueError
        If ``state`` is not a dict, has an unknown version, or holds CUDA
        states for a different number of devices than this process sees.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from capture_rng_state(), got {type(state).__name__}")
    version = state.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise ValueError(f"state['version'] = {version!r} is not supported; expected {STATE_VERSION}")

    torch = None
    if "torch" in state or "torch_cuda" in state:
        torch = _import_torch()
        if torch is None:
            warnings.warn(
                "restore_rng_state: the state holds torch generator states but torch is not "
                "installed; they were skipped",
                RuntimeWarning,
                stacklevel=2,
            )
    # Check everything that can fail before changing any generator.
    cuda_states = state.get("torch_cuda")
    if torch is not None and cuda_states is not None:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(cuda_states) != have:
            raise ValueError(
                f"state['torch_cuda'] holds RNG states for {len(cuda_states)} CUDA device(s), "
                f"but this process sees {have}; restore on a process with the same visible "
                "devices (CUDA_VISIBLE_DEVICES) or drop 'torch_cuda' from the state"
            )

    if "python" in state:
        random.setstate(_as_python_state(state["python"]))
    if "numpy" in state:
        np_state = state["numpy"]
        np.random.set_state(
            (
                np_state["bit_generator"],
                np.asarray(np_state["key"], dtype=np.uint32),
                np_state["pos"],
                np_state["has_gauss"],
                np_state["cached_gaussian"],
            )
        )
    if torch is not None:
        if "torch" in state:
            torch.set_rng_state(_bytes_to_tensor(torch, state["torch"]))
        if cuda_states is not None:
            torch.cuda.set_rng_state_all([_bytes_to_tensor(torch, s) for s in cuda_states])


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and, when torch is
    already imported, torch (CPU and every CUDA device).

    Parameters
    ----------
    seed:
        A non-negative int. NumPy's legacy generator takes 32 bits, so it is
        seeded with ``seed % 2**32``.

    Examples
    --------
    >>> import random
    >>> seed_everything(7); a = random.random()
    >>> seed_everything(7); a == random.random()
    True
    """
    seed = int(check("seed", seed, Int(low=0)))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)  # also seeds every CUDA device (lazily)


def fork_rng_state(label: str) -> None:
    """Seed every generator from a hash of their current state and ``label``:
    a stream of its own for each label, the same again from the same state
    and label (a reproducible study stays reproducible).

    Parameters
    ----------
    label:
        What tells this stream from the others that fork from the same state.

    Examples
    --------
    >>> import random
    >>> seed_everything(0); fork_rng_state("a"); a = random.random()
    >>> seed_everything(0); fork_rng_state("a"); a == random.random()
    True
    >>> seed_everything(0); fork_rng_state("b"); a == random.random()
    False
    """
    digest = hashlib.sha256(pickle.dumps(capture_rng_state(), protocol=4) + label.encode()).digest()
    seed_everything(int.from_bytes(digest[:8], "big"))


def _import_torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _tensor_to_bytes(tensor: Any) -> bytes:
    return bytes(tensor.detach().cpu().numpy().tobytes())


def _bytes_to_tensor(torch: Any, data: bytes) -> Any:
    # bytearray: torch.frombuffer needs a writable buffer; clone detaches it.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _as_python_state(value: Any) -> tuple:
    # JSON-like round trips turn tuples into lists; random.setstate needs tuples.
    version, internal, gauss_next = value
    return (version, tuple(internal), gauss_next)
