import os
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
RUNTIME_HELPERS = os.path.join(TESTS, "runtime")
EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
# Shared helpers (trainables_for_tests here, the study scripts of tests/runtime)
# and the examples are imported by name, from every test folder.
sys.path[:0] = [TESTS, RUNTIME_HELPERS, EXAMPLES]
# Experiments' checkpoint keys (ray_stagetree.execution.payload_auth) go to a
# folder of this session, not the user's ~/.ray_stagetree; subprocesses inherit it.
os.environ.setdefault("RAY_STAGETREE_KEY_DIR", tempfile.mkdtemp(prefix="stagetree_test_keys_"))


def _default_storage_in_a_temporary_folder() -> None:
    """A Tuner writes its experiment folder when it is made (as Tune's does),
    under RunConfig's default storage path (~/ray_results) when a test
    gives none: the session's tests write to a temporary folder instead.
    (tune.RunConfig reads Ray's constant when it is built.)"""
    import ray.train.constants

    ray.train.constants.DEFAULT_STORAGE_PATH = tempfile.mkdtemp(prefix="stagetree_test_results_")


_default_storage_in_a_temporary_folder()

# Fixtures that start Ray: a test using one (directly or through another
# fixture) is slow, so `pytest -m "not slow"` is the fast loop without them.
RAY_FIXTURES = frozenset({"ray_session", "counter"})


def pytest_collection_modifyitems(items):
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        items[:] = _long_tests_first_on_each_worker(items, workers)


def _long_tests_first_on_each_worker(items: list, workers: int) -> list:
    """The order that starts the tests marked ``long`` first, spread over
    the workers. pytest-xdist's work stealing hands worker k the k-th
    contiguous share of this order and lets idle workers take the far end of
    others' shares: a long test at the start of a share runs at the start,
    where in collection order one ran last and made the suite minutes longer.
    (Every worker collects, and computes the same order.)"""
    long_tests = [item for item in items if item.get_closest_marker("long")]
    others = [item for item in items if not item.get_closest_marker("long")]
    ordered = []
    for share in range(workers):
        ordered += long_tests[share::workers]
        ordered += others[len(others) * share // workers : len(others) * (share + 1) // workers]
    return ordered


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session: 2 CPUs and 4 fake GPUs (Ray still
    sets CUDA_VISIBLE_DEVICES per actor, so placement is testable)."""
    import ray

    # Ray's workers import the trainables defined in test modules and examples by
    # name, as pytest imported them: from the folder of each test module.
    folders = [TESTS, EXAMPLES] + [
        folder for folder, _, files in os.walk(TESTS) if any(name.endswith(".py") for name in files) and folder != TESTS
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, folders + [os.environ.get("PYTHONPATH")]))
    # address="local": never the cluster RAY_ADDRESS or a `ray start` on this machine names.
    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def counter(ray_session):
    """Name of a Ray actor that counts step() calls across all workers
    (trainables_for_tests count when their config names it)."""
    from trainables_for_tests import Counter

    name = f"counter_{os.urandom(4).hex()}"
    actor = Counter.options(name=name).remote()
    yield name
    ray_session.kill(actor)
