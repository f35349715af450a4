"""A producer session (docs/producers.md): opened with ``POST …/producers``, kept alive by a
task it owns with ``POST …/producers/{id}/keepalive`` three times per TTL, closed with
``DELETE``. A producer with an access mode holds one while it is open.

The keep-alive tolerates failures (a discovery instance restarting, a lost connection) for
as long as the session can still be alive on the server; once the server answers 404 (the
session expired, was closed, or its topic deleted) the session is **lost**: :attr:`lost`
holds the error, and the producer fails every later batch with it rather than producing
outside the session it was asked to hold. A keep-alive task that fails (a bug) loses the
session the same way: nothing keeps it alive any more.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from danube.client._http import HttpCore
from danube.client.errors import ClientError, NotFoundError, ProtocolError
from danube.client.messages import topic_path
from danube.names import TopicName
from danube.tasks import TaskSet

log = logging.getLogger(__name__)

AccessMode = Literal["shared", "exclusive"]
REFRESHES_PER_TTL = 3
_MIN_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What the server answered to an open."""

    producer_id: str
    access_mode: AccessMode
    ttl_s: float


class ProducerSession:
    """An open session and its keep-alive task; made by :meth:`open`."""

    def __init__(self, http: HttpCore, topic: TopicName, info: SessionInfo) -> None:
        self.topic = topic
        self.info = info
        self.lost: ClientError | None = None
        self._http = http
        self._path = f"/v1/topics/{topic_path(topic)}/producers/{info.producer_id}"
        self._tasks = TaskSet(
            f"producer session {info.producer_id}", on_failure=self._keep_alive_failed
        )

    @property
    def producer_id(self) -> str:
        """The id the server gave the session (sent with every produce)."""
        return self.info.producer_id

    @classmethod
    async def open(
        cls, http: HttpCore, topic: TopicName, name: str, access_mode: AccessMode
    ) -> ProducerSession:
        """Open a session and start keeping it alive; :class:`ConflictError` (409
        ``exclusive_producer`` or ``producer_exists``) when the topic refuses it."""
        answer = await http.request_retrying(
            "POST",
            f"/v1/topics/{topic_path(topic)}/producers",
            body={"name": name, "access_mode": access_mode},
            timeout_s=http.timeout_s,
        )
        body = answer.body
        try:
            info = SessionInfo(
                producer_id=str(body["producer_id"]),
                access_mode=body["access_mode"],
                ttl_s=int(body["session_ttl_ms"]) / 1000,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"producer open answered {body!r:.200}") from exc
        session = cls(http, topic, info)
        session._tasks.spawn(session._keep_alive(), name="keep-alive")
        return session

    async def close(self) -> None:
        """Stop keeping it alive and close it on the server (best effort: a session that
        cannot be closed now expires after its TTL)."""
        await self._tasks.close()
        try:
            await self._http.request("DELETE", self._path)
        except ClientError as exc:
            log.warning("could not close producer session %s: %s", self.producer_id, exc)

    def _keep_alive_failed(self, _task: str, error: BaseException) -> None:
        # The keep-alive died of a bug (its owner logged it): nothing keeps the session
        # alive on the server any more, so it is lost from here, as after a 404; the
        # producer fails its later batches rather than produce outside it.
        self.lost = ClientError(
            f"producer session {self.producer_id}: keep-alive failed: {error!r}"
        )

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = max(_MIN_INTERVAL_S, self.info.ttl_s / REFRESHES_PER_TTL)
        alive_until = loop.time() + self.info.ttl_s
        while True:
            await asyncio.sleep(interval_s)
            sent = loop.time()
            try:
                await self._http.request(
                    "POST", self._path + "/keepalive", timeout_s=max(interval_s, 0.1)
                )
            except NotFoundError as exc:
                self.lost = exc
                log.warning(
                    "producer session %s of %s is gone: %s", self.producer_id, self.topic, exc
                )
                return
            except ClientError as exc:  # a restart, a lost connection: try again next tick
                log.warning("producer session %s keep-alive failed: %s", self.producer_id, exc)
                if loop.time() >= alive_until:
                    self.lost = exc
                    return
                continue
            alive_until = sent + self.info.ttl_s
