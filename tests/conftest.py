import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session: 2 CPUs and 4 fake GPUs (Ray still
    sets CUDA_VISIBLE_DEVICES per actor, so placement is testable)."""
    import os

    import ray

    # Ray's workers import the trainables defined in tests/ and examples/ by name.
    here = os.path.dirname(os.path.abspath(__file__))
    examples = os.path.join(os.path.dirname(here), "examples")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, examples, os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, configure_logging=False)
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
