import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session: 2 CPUs and 4 fake GPUs (Ray still
    sets CUDA_VISIBLE_DEVICES per actor, so placement is testable)."""
    import ray

    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
