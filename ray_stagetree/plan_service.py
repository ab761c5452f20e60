"""Plan services: long-lived search plans that studies attach to.

``Tuner(..., plan_service="team")`` attaches a study to the plan service
``team`` of the driver's Ray namespace (started if there is none); studies
of the same trainable there share their common stages, concurrent and
earlier ones alike. See docs/guides/plan-services.md.

>>> import ray_stagetree.plan_service as plan_service   # doctest: +SKIP
>>> plan_service.status("team")["studies"]             # doctest: +SKIP
>>> plan_service.shutdown("team")                      # doctest: +SKIP
"""

from ray_stagetree.runtime.service.service_client import SERVICE_ENV, PlanServiceConfig, shutdown, status

__all__ = ["PlanServiceConfig", "SERVICE_ENV", "shutdown", "status"]
