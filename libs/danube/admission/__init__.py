"""Admission: the one decision every produce door makes before storing (DESIGN §10), and the
pieces it decides with, shared by every service that serves produce.

- :mod:`danube.admission.core`: :class:`Admission` (RBAC, exclusive-producer fence,
  sequences, limits, topic policies, schema), what a door hands in (:class:`Messages`:
  :class:`FramesMessages`, :class:`PayloadMessages`) and gets back (:class:`Admitted`), and
  the Protocols of its collaborators;
- :mod:`danube.admission.parts`: :func:`build`, an admission from settings and etcd, and
  :class:`AdmissionParts` to load and follow its views;
- :mod:`danube.admission.counters`: the counters of its refusals, one set per service;
- :mod:`danube.admission.policies`: the cached topic configs and namespace policies;
- :mod:`danube.admission.schema_gate` over :mod:`danube.admission.schema_reads`: schema
  stamps and checks over the registry's read side;
- :mod:`danube.admission.exclusive`: the exclusive producers, kept current from etcd;
- :mod:`danube.admission.refresh`: refresh-ahead of the caches;
- pure checks: :mod:`~danube.admission.payloads`, :mod:`~danube.admission.chunks`,
  :mod:`~danube.admission.sequences`.

The security gate it asks is danube.security.gate's. Nothing here imports a service.
"""

from danube.admission.core import (
    Admission,
    Admitted,
    Authorizer,
    Fence,
    FramesMessages,
    Messages,
    PayloadMessages,
    PolicySource,
    Principal,
    ProduceLimits,
    SchemaCheck,
    Stamp,
)
from danube.admission.counters import AdmissionCounters
from danube.admission.parts import AdmissionParts, build
from danube.admission.sequences import Sequencing

__all__ = [
    "Admission",
    "AdmissionCounters",
    "AdmissionParts",
    "Admitted",
    "Authorizer",
    "Fence",
    "FramesMessages",
    "Messages",
    "PayloadMessages",
    "PolicySource",
    "Principal",
    "ProduceLimits",
    "SchemaCheck",
    "Sequencing",
    "Stamp",
    "build",
]
