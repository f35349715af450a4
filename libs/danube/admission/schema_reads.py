"""The read side of the schema registry (docs/schemas.md): a subject's versions, a schema id's
subject, a topic's binding, as every produce door's schema gate (danube.admission.schema_gate)
reads them from etcd. The writes (registration, compatibility, bindings, deletes) are the
registry's in discovery, which extends :class:`SchemaReader`; the keys and records are
danube.meta's.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube.errors import BadRequestError, NotFoundError
from danube.meta import KeyValue, MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.records import SchemaSubject, SchemaVersionRecord, TopicSchemaRecord
from danube.names import InvalidNameError, validate_subject
from danube.schemas import compatibility_mode_of


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One version of a subject, with the subject's effective compatibility mode."""

    schema_id: int
    version: int
    subject: str
    schema_type: str
    definition: bytes
    description: str
    created_ms: int
    created_by: str
    tags: tuple[str, ...]
    fingerprint: str
    compatibility_mode: str
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class TopicSchema:
    """A topic's binding: its subject, policy, and the subject's schema id."""

    topic: TopicName
    subject: str
    validation_policy: str
    payload_validation: bool
    schema_id: int
    updated_ms: int


def check_subject(subject: str) -> str:
    """A valid subject name (``invalid_name`` 400 otherwise, from :mod:`danube.meta.keys`)."""
    return validate_subject(subject)


class SchemaReader:
    """Subjects, versions and topic bindings as etcd holds them: reads only."""

    def __init__(self, store: MetaStore, *, default_mode: str = "backward") -> None:
        """``default_mode``: the compatibility mode of subjects that set none
        (``discovery.schema_compatibility``), answered with their versions."""
        self._store = store
        self._default_mode = compatibility_mode_of(default_mode)

    @property
    def default_mode(self) -> str:
        """The mode of subjects that set none (``discovery.schema_compatibility``)."""
        return self._default_mode

    # --- reads -------------------------------------------------------------------------

    async def _subject_kv(self, subject: str) -> tuple[SchemaSubject, KeyValue] | None:
        return await self._store.get_model_kv(meta_keys.subject_key(subject), SchemaSubject)

    async def _require_subject(self, subject: str) -> SchemaSubject:
        found = await self._subject_kv(check_subject(subject))
        if found is None:
            raise NotFoundError(f"subject {subject!r} does not exist", code="subject_not_found")
        return found[0]

    async def _records(self, subject: str) -> list[SchemaVersionRecord]:
        """Every version of the subject, deleted ones included, oldest first."""
        prefix = meta_keys.schema_versions_prefix(subject)
        return [record for _, record in await self._store.range_models(prefix, SchemaVersionRecord)]

    def _version(
        self, subject: str, meta: SchemaSubject, record: SchemaVersionRecord
    ) -> SchemaVersion:
        return SchemaVersion(
            schema_id=meta.schema_id,
            version=record.version,
            subject=subject,
            schema_type=record.schema_type,
            definition=record.definition.encode(),
            description=record.description,
            created_ms=record.created_ms,
            created_by=record.created_by,
            tags=record.tags,
            fingerprint=record.fingerprint,
            compatibility_mode=meta.compatibility_mode or self._default_mode,
            deleted=record.deleted_ms is not None,
        )

    async def versions(self, subject: str) -> list[SchemaVersion]:
        """The live versions of a subject, oldest first (404 ``subject_not_found``)."""
        meta = await self._require_subject(subject)
        records = await self._records(subject)
        return [self._version(subject, meta, r) for r in records if r.deleted_ms is None]

    async def latest(self, subject: str) -> SchemaVersion:
        """The newest live version (404 ``subject_not_found`` / ``schema_not_found``)."""
        found = await self.versions(subject)
        if not found:
            raise NotFoundError(f"subject {subject!r} has no live version", code="schema_not_found")
        return found[-1]

    async def version(self, subject: str, version: int) -> SchemaVersion:
        """One version, deleted ones included (404 ``schema_not_found``)."""
        meta = await self._require_subject(subject)
        try:
            key = meta_keys.schema_version_key(subject, version)
        except InvalidNameError as exc:
            raise BadRequestError(exc.message, code="invalid_version") from exc
        record = await self._store.get_model(key, SchemaVersionRecord)
        if record is None:
            raise NotFoundError(
                f"subject {subject!r} has no version {version}", code="schema_not_found"
            )
        return self._version(subject, meta, record)

    async def subject_of(self, schema_id: int) -> str:
        """The subject a schema id names (404 ``schema_not_found``)."""
        kv = None
        if 1 <= schema_id <= meta_keys.OFFSET_MAX:
            kv = await self._store.get(meta_keys.schema_id_key(schema_id))
        if kv is None:
            raise NotFoundError(f"no schema with id {schema_id}", code="schema_not_found")
        return kv.value.decode()

    async def get(self, schema_id: int, version: int | None = None) -> SchemaVersion:
        """A version by schema id: ``version``, or the latest live one when None."""
        subject = await self.subject_of(schema_id)
        if version is None:
            return await self.latest(subject)
        return await self.version(subject, version)

    async def subjects(self) -> list[str]:
        """Every subject's name, sorted (read from the id keys, whose values are small)."""
        kvs = await self._store.range(meta_keys.SCHEMAS_PREFIX + "ids/")
        return sorted(kv.value.decode() for kv in kvs)

    async def mode(self, subject: str) -> str:
        """The subject's effective compatibility mode."""
        meta = await self._require_subject(subject)
        return meta.compatibility_mode or self._default_mode

    async def topic_schema(self, topic: TopicName) -> TopicSchema | None:
        """The topic's binding, or None when it has none."""
        record = await self._store.get_model(meta_keys.topic_schema_key(topic), TopicSchemaRecord)
        if record is None:
            return None
        found = await self._subject_kv(record.subject)
        if found is None:  # the subject is gone: nothing to validate against
            return None
        return self._binding(topic, record, found[0].schema_id)

    @staticmethod
    def _binding(topic: TopicName, record: TopicSchemaRecord, schema_id: int) -> TopicSchema:
        return TopicSchema(
            topic=topic,
            subject=record.subject,
            validation_policy=record.validation_policy,
            payload_validation=record.payload_validation,
            schema_id=schema_id,
            updated_ms=record.updated_ms,
        )
