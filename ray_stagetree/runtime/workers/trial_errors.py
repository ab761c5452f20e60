"""A trial's error as Tune gives it in ``Result.error`` / ``ResultGrid.errors``.

Tune runs a trainable in an actor task, so what reaches the user is Ray's
``RayTaskError`` made an instance of the trainable's own exception
(``as_instanceof_cause``): ``isinstance(result.error, RuntimeError)`` holds
for a ``RuntimeError`` the trainable raised, and ``.cause`` is that exception.
A stage worker builds the same object where the trainable raised, pickled,
and it travels as bytes beside the traceback text through the controller
(which never unpickles it) to the driver. What cannot make that trip (an
exception holding a lock, or one whose class cannot be rebuilt from its
pickle) degrades: a ``RayTaskError`` with the traceback and no cause, then
Tune's ``TuneError`` with the text.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("ray_stagetree")


def pack_error(error: BaseException, traceback_text: str, function_name: str) -> bytes | None:
    """``error`` as Tune's ``RayTaskError`` (an instance of the error's type
    too), pickled; None when neither it nor a cause-less one pickles."""
    from ray.exceptions import RayTaskError

    if not isinstance(error, Exception):  # SystemExit: Ray's task would raise it as itself
        error = RuntimeError(f"the trainable exited: {error!r}")
    candidates = []
    try:
        candidates.append(RayTaskError(function_name, traceback_text, error).as_instanceof_cause())
    except Exception:  # noqa: BLE001, S110 - a class Ray cannot derive from (as Ray: it then keeps the plain error)
        pass
    candidates.append(RayTaskError(function_name, traceback_text, None))
    for candidate in candidates:
        data = pack_exception(candidate)
        if data is not None:
            return data
    return None


def pack_exception(error: BaseException) -> bytes | None:
    """``error`` pickled as it is (Ray's own errors: a worker that died is
    Tune's ``RayActorError``), None when it does not survive the round trip."""
    import ray.cloudpickle as pickle

    try:
        data = pickle.dumps(error)
        pickle.loads(data)  # a class whose __init__ cannot take its own args fails here, not on the driver
    except Exception:  # noqa: BLE001 - whatever an exception's pickling raises, it degrades to its text
        return None
    return data


def unpack_error(data: bytes | None, text: str, trial_name: str) -> Exception:
    """The trial's error for ``Result.error``: the packed ``RayTaskError``, or
    Tune's ``TuneError`` with the traceback text where there is none (a
    worker that died, a trial refused before it ran) or it cannot be
    unpickled here (its class is not importable on the driver)."""
    from ray.tune.error import TuneError

    if data is not None:
        import ray.cloudpickle as pickle

        try:
            return pickle.loads(data)
        except Exception as error:  # noqa: BLE001 - any unpickling failure degrades to the text
            logger.warning("the error of trial %s cannot be rebuilt here (%s); giving its text", trial_name, error)
    return TuneError(f"trial {trial_name} failed:\n{text}")
