"""The counters admission's refusals go to, one set per process and named by it.

Prometheus refuses a metric name registered twice in one process, and each service names
its metrics ``danube_<service>_*``: so no module here registers a counter at import.
A service makes its set once (:meth:`AdmissionCounters.register` with its prefix:
discovery's are ``danube_discovery_policy_refusals_total`` and the like, docs/operations.md)
and hands it to :func:`danube.admission.build`, which gives each collaborator the
counter it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter


@dataclass(frozen=True, slots=True)
class AdmissionCounters:
    """What admission and its collaborators count."""

    policy_refusals: Counter  # by ``reason`` (a code): the topic's policies and limits
    schema_violations: Counter  # by ``policy``: payloads that failed their topic's schema
    authz_denied: Counter  # by ``permission``: RBAC denials (403)
    authn_failed: Counter  # by ``code``: missing or bad credentials (401)

    @classmethod
    def register(
        cls, prefix: str, registry: CollectorRegistry | None = REGISTRY
    ) -> AdmissionCounters:
        """The four counters named ``<prefix>_<what>``, registered in ``registry`` (None:
        registered nowhere, as a test's own). Once per prefix and registry."""
        return cls(
            policy_refusals=Counter(
                f"{prefix}_policy_refusals",
                "Requests refused by a topic's policies (docs/policies.md), by reason",
                ["reason"],
                registry=registry,
            ),
            schema_violations=Counter(
                f"{prefix}_schema_violations",
                "Produced payloads that failed their topic's schema "
                "(policy warn: stored; enforce: refused)",
                ["policy"],
                registry=registry,
            ),
            authz_denied=Counter(
                f"{prefix}_authz_denied",
                "Requests refused for a missing permission (HTTP 403 / gRPC PERMISSION_DENIED)",
                ["permission"],
                registry=registry,
            ),
            authn_failed=Counter(
                f"{prefix}_authn_failed",
                "Requests refused for missing or invalid credentials "
                "(HTTP 401 / gRPC UNAUTHENTICATED)",
                ["code"],
                registry=registry,
            ),
        )

    @classmethod
    def unregistered(cls) -> AdmissionCounters:
        """Counters no registry exports: for a piece built alone (a test, a tool)."""
        return cls.register("danube_unexported", registry=None)
