"""One :class:`~danube.admission.core.Admission` with its collaborators, built from settings
and an etcd store: what a service calls to serve produce (discovery's proxy doors, an ingest
leader's direct door).

    parts = build(settings, store, refresher=refresher, cache_ttl_s=ttl_s, counters=counters)
    await parts.load()                    # before the first request is decided
    tg.create_task(parts.follow(), ...)   # until the service stops (cancel it)
    ... parts.admission.produce(principal, topic, messages) ...

What the pieces read from etcd: security roles and bindings (``security/``) and the
exclusive producers (``producers/``), read whole by :meth:`AdmissionParts.load` and kept
current by watches (:meth:`AdmissionParts.follow`), so a decision waits on no etcd round
trip; topic configs, namespace policies and schema bindings, cached with a TTL and read
again ahead of expiry (the ``refresher``, owned and closed by the caller).

A service that writes some of these itself hands in its own piece, so its writes are seen at
once by its admission: discovery gives its catalog (``policies``: a
:class:`~danube.admission.policies.PolicyCache` with writes), its schema registry
(``schemas``) and its producer sessions' holders (``holders``). Anything not handed in is
built here, read-only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from danube.admission.core import Admission, ProduceLimits
from danube.admission.counters import AdmissionCounters
from danube.admission.exclusive import ExclusiveHolders
from danube.admission.policies import PolicyCache
from danube.admission.refresh import Refresher
from danube.admission.schema_gate import SchemaGate
from danube.admission.schema_reads import SchemaReader
from danube.config import DanubeSettings
from danube.meta import MetaStore
from danube.security.gate import SecurityGate


@dataclass
class AdmissionParts:
    """An admission and the pieces it decides with; the views of etcd it needs loaded
    (:meth:`load`) before serving and followed (:meth:`follow`) while serving."""

    admission: Admission
    security: SecurityGate
    policies: PolicyCache
    holders: ExclusiveHolders
    schemas: SchemaGate
    _revisions: tuple[int, int] | None = field(default=None, init=False, repr=False)

    async def load(self) -> None:
        """Read every security role and binding and every exclusive producer (MetaError
        when etcd fails: the service does not serve without them)."""
        security_revision = await self.security.load()
        holders_revision = await self.holders.load()
        self._revisions = (security_revision, holders_revision)

    async def follow(self) -> None:
        """Keep the security policy, the security keys and the exclusive producers current,
        and forget cached topic configs and namespace policies as they change, until
        cancelled (each watch re-reads its prefix after a break). After :meth:`load`."""
        if self._revisions is None:
            raise RuntimeError("AdmissionParts.follow before load")
        security_revision, holders_revision = self._revisions
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.security.follow(security_revision), name="security")
            tg.create_task(self.security.follow_keys(), name="security-keys")
            tg.create_task(self.holders.follow(holders_revision), name="exclusive-producers")
            tg.create_task(self.policies.follow_changes(), name="policy-changes")


def build(
    settings: DanubeSettings,
    store: MetaStore,
    *,
    refresher: Refresher | None,
    cache_ttl_s: float,
    counters: AdmissionCounters,
    policies: PolicyCache | None = None,
    schemas: SchemaReader | None = None,
    holders: ExclusiveHolders | None = None,
) -> AdmissionParts:
    """The admission of ``settings`` over ``store``: limits from ``settings``
    (:meth:`ProduceLimits.from_settings`), the security gate of ``settings.security``
    (ValueError when it is enabled without its keys), caches of ``cache_ttl_s`` refreshed
    ahead by ``refresher`` (None: read again inline once expired), refusals counted in
    ``counters``. ``policies``, ``schemas``, ``holders``: a service's own pieces (see the
    module docstring); built here when None."""
    security = SecurityGate.from_config(
        settings.security,
        store,
        authn_failed=counters.authn_failed,
        authz_denied=counters.authz_denied,
    )
    if policies is None:
        policies = PolicyCache(store, cache_ttl_s=cache_ttl_s, refresher=refresher)
    if schemas is None:
        schemas = SchemaReader(store, default_mode=settings.discovery.schema_compatibility)
    if holders is None:
        holders = ExclusiveHolders(store)
    gate = SchemaGate(
        schemas,
        cache_ttl_s=cache_ttl_s,
        refresher=refresher,
        violations=counters.schema_violations,
    )
    admission = Admission(
        ProduceLimits.from_settings(settings),
        security=security,
        policies=policies,
        fence=holders.view,
        schemas=gate,
        refusals=counters.policy_refusals,
    )
    return AdmissionParts(admission, security, policies, holders, gate)
