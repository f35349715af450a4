"""The schema registry: subjects of versioned schemas in etcd, compatibility enforced at
registration, and the binding of topics to subjects (docs/schemas.md).

A **schema id** names a subject: every version of the subject shares it, as in Danube's
protocol (``GetSchema(schema_id, version?)``); ids are global, handed out by a counter
(``schemas/next_id``) in the same transaction that creates the subject, and never reused.
Versions count from 1 per subject and are never reused either, even after a delete.
Registering a definition whose fingerprint a live version of the subject has answers that
version (``is_new`` False) and writes nothing.

Every write is one etcd transaction fenced on the subject record's revision (and the
counter's, for a new subject), so concurrent registrations on any discovery instance never
hand out one version twice; the loser reads again and retries (:data:`WRITE_ATTEMPTS_MAX`).

Deleting a version is a soft delete: it leaves ``latest``, ``versions`` and compatibility
checks, its fingerprint is freed (registering it again makes a new version), but
``get(schema_id, version)`` still answers it, for the stored records that carry it. The
last live version of a subject bound to a topic cannot be deleted (409 ``schema_in_use``).

The reads (versions, subjects, bindings) are danube.admission.schema_reads'
:class:`SchemaReader`, which every produce door's schema gate reads through: the registry
extends it with the writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence

from danube.admission.schema_reads import SchemaReader, SchemaVersion, TopicSchema, check_subject
from danube.discovery.errors import ConflictError, NotFoundError, UnavailableError
from danube.discovery.schemas.values import (
    Registered,
    bad_request,
    check_metadata,
    check_policy,
    now_ms,
)
from danube.meta import KeyValue, MetaStore, TopicName, decode_model, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import (
    SchemaSubject,
    SchemaVersionRecord,
    TopicSchemaRecord,
)
from danube.schemas import (
    VALIDATORS_CACHED,
    ParsedSchema,
    SchemaError,
    Validator,
    check_compatibility,
    compatibility_mode_of,
    compile_validator,
    parse_schema,
)

__all__ = ["Registered", "SchemaRegistry"]

log = logging.getLogger(__name__)

# Concurrent writers of one subject each retry at most this often before a 503.
WRITE_ATTEMPTS_MAX = 16
# Parsed versions kept for compatibility checks (protobuf parses run protoc).
PARSED_CACHED = 256


class SchemaRegistry(SchemaReader):
    """Subjects, versions and topic bindings in etcd, read and written; see the module
    docstring."""

    def __init__(self, store: MetaStore, *, default_mode: str = "backward") -> None:
        super().__init__(store, default_mode=default_mode)
        self._parsed: OrderedDict[tuple[str, str], ParsedSchema] = OrderedDict()
        self._validators: OrderedDict[tuple[str, str], Validator] = OrderedDict()

    # --- parsing (off the event loop: protoc runs as a child process) ------------------

    async def _parse(self, schema_type: str, definition: bytes) -> ParsedSchema:
        try:
            return await asyncio.to_thread(parse_schema, schema_type, definition)
        except SchemaError as exc:
            raise bad_request(exc) from exc

    async def _parsed_version(self, record: SchemaVersionRecord) -> ParsedSchema:
        key = (record.schema_type, record.fingerprint)
        found = self._parsed.get(key)
        if found is None:
            found = await self._parse(record.schema_type, record.definition.encode())
            self._parsed[key] = found
            if len(self._parsed) > PARSED_CACHED:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(key)
        return found

    async def validator(self, found: SchemaVersion) -> Validator:
        """The payload check of a version (:func:`danube.schemas.compile_validator`): built
        off the event loop the first time (protobuf runs protoc), then from a cache."""
        key = (found.schema_type, found.fingerprint)
        check = self._validators.get(key)
        if check is None:
            try:
                check = await asyncio.to_thread(
                    compile_validator, found.schema_type, found.definition
                )
            except SchemaError as exc:
                raise bad_request(exc) from exc
            self._validators[key] = check
            if len(self._validators) > VALIDATORS_CACHED:
                self._validators.popitem(last=False)
        else:
            self._validators.move_to_end(key)
        return check

    # --- compatibility -------------------------------------------------------------------

    async def _check(
        self,
        subject: str,
        meta: SchemaSubject | None,
        parsed: ParsedSchema,
        mode: str | None,
    ) -> tuple[bool, list[str]]:
        if meta is None:
            return True, []
        effective = mode or meta.compatibility_mode or self._default_mode
        records = [r for r in await self._records(subject) if r.deleted_ms is None]
        if not effective.endswith("_transitive"):
            records = records[-1:]
        previous = [(r.version, await self._parsed_version(r)) for r in records]
        try:
            return check_compatibility(parsed, previous, effective)
        except SchemaError as exc:
            raise bad_request(exc) from exc

    async def check(
        self, subject: str, schema_type: str, definition: bytes, mode: str | None = None
    ) -> tuple[bool, list[str]]:
        """Whether ``definition`` could be registered under ``subject`` now (with ``mode``,
        or the subject's); the errors name the version, rule and path. A subject that does
        not exist accepts anything."""
        if mode is not None:
            try:
                mode = compatibility_mode_of(mode)
            except SchemaError as exc:
                raise bad_request(exc) from exc
        parsed = await self._parse(schema_type, definition)
        found = await self._subject_kv(check_subject(subject))
        return await self._check(subject, None if found is None else found[0], parsed, mode)

    # --- writes ------------------------------------------------------------------------

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes,
        *,
        description: str = "",
        created_by: str = "",
        tags: Sequence[str] = (),
    ) -> Registered:
        """Register a version (see the module docstring); 400 ``invalid_schema`` with the
        location, 409 ``incompatible_schema`` listing the failed rules."""
        check_subject(subject)
        tags = check_metadata(description, created_by, tags)
        parsed = await self._parse(schema_type, definition)
        for _ in range(WRITE_ATTEMPTS_MAX):
            found = await self._subject_kv(subject)
            meta = None if found is None else found[0]
            if meta is not None:
                same = await self._same(subject, parsed)
                if same is not None:
                    return Registered(meta.schema_id, same, False, parsed.fingerprint)
            ok, errors = await self._check(subject, meta, parsed, None)
            if not ok:
                raise ConflictError(
                    f"schema incompatible with subject {subject!r}: " + "; ".join(errors),
                    code="incompatible_schema",
                )
            record = SchemaVersionRecord(
                version=1 if meta is None else meta.next_version,
                schema_type=parsed.schema_type,
                definition=definition.decode(),
                fingerprint=parsed.fingerprint,
                description=description,
                created_by=created_by,
                tags=tags,
                created_ms=now_ms(),
            )
            if found is None:
                schema_id = await self._create_subject(subject, record)
            else:
                schema_id = await self._add_version(subject, found, record)
            if schema_id is not None:
                self._parsed[(parsed.schema_type, parsed.fingerprint)] = parsed
                log.info(
                    "schema %s version %d registered (id %d)", subject, record.version, schema_id
                )
                return Registered(schema_id, record.version, True, parsed.fingerprint)
        raise UnavailableError(f"subject {subject!r}: too many concurrent registrations")

    async def _same(self, subject: str, parsed: ParsedSchema) -> int | None:
        key = meta_keys.schema_fingerprint_key(subject, parsed.fingerprint)
        kv = await self._store.get(key)
        if kv is None:
            return None
        version = int(kv.value)
        record = await self._store.get_model(
            meta_keys.schema_version_key(subject, version), SchemaVersionRecord
        )
        if record is None or record.schema_type != parsed.schema_type:
            return None
        return version

    async def _create_subject(self, subject: str, record: SchemaVersionRecord) -> int | None:
        """Create the subject with its first version; its id if this call did, else None."""
        counter = await self._store.get(meta_keys.SCHEMA_NEXT_ID_KEY)
        schema_id = 1 if counter is None else int(counter.value)
        meta = SchemaSubject(
            schema_id=schema_id,
            schema_type=record.schema_type,
            next_version=2,
            created_ms=record.created_ms,
        )
        subject_key = meta_keys.subject_key(subject)
        result = await (
            self._store.txn()
            .if_mod_revision(
                meta_keys.SCHEMA_NEXT_ID_KEY, "==", 0 if counter is None else counter.mod_revision
            )
            .if_absent(subject_key)
            .then_put(meta_keys.SCHEMA_NEXT_ID_KEY, str(schema_id + 1).encode())
            .then_put(meta_keys.schema_id_key(schema_id), subject.encode())
            .then_put(subject_key, encode_model(meta))
            .then_put(meta_keys.schema_version_key(subject, 1), encode_model(record))
            .then_put(meta_keys.schema_fingerprint_key(subject, record.fingerprint), b"1")
            .commit()
        )
        return schema_id if result.succeeded else None

    async def _add_version(
        self, subject: str, found: tuple[SchemaSubject, KeyValue], record: SchemaVersionRecord
    ) -> int | None:
        meta, kv = found
        updated = meta.model_copy(
            update={"next_version": record.version + 1, "schema_type": record.schema_type}
        )
        result = await (
            self._store.txn()
            .if_mod_revision(kv.key, "==", kv.mod_revision)
            .then_put(kv.key, encode_model(updated))
            .then_put(meta_keys.schema_version_key(subject, record.version), encode_model(record))
            .then_put(
                meta_keys.schema_fingerprint_key(subject, record.fingerprint),
                str(record.version).encode(),
            )
            .commit()
        )
        return meta.schema_id if result.succeeded else None

    async def set_mode(self, subject: str, mode: str) -> None:
        """Set the subject's compatibility mode (404 ``subject_not_found``)."""
        try:
            checked = compatibility_mode_of(mode)
        except SchemaError as exc:
            raise bad_request(exc) from exc
        for _ in range(WRITE_ATTEMPTS_MAX):
            found = await self._subject_kv(check_subject(subject))
            if found is None:
                raise NotFoundError(f"subject {subject!r} does not exist", code="subject_not_found")
            meta, kv = found
            updated = meta.model_copy(update={"compatibility_mode": checked})
            if await self._store.compare_and_swap(
                kv.key, encode_model(updated), expected_mod_revision=kv.mod_revision
            ):
                return
        raise UnavailableError(f"subject {subject!r}: too many concurrent changes")

    async def delete_version(self, subject: str, version: int) -> None:
        """Soft-delete a version (see the module docstring)."""
        current = await self.version(subject, version)
        if current.deleted:
            raise NotFoundError(
                f"subject {subject!r} version {version} is deleted already",
                code="schema_not_found",
            )
        live = await self.versions(subject)
        if len(live) == 1 and await self._bound_topics(subject):
            raise ConflictError(
                f"version {version} is the last of subject {subject!r}, which topics are "
                "bound to (unbind them first)",
                code="schema_in_use",
            )
        key = meta_keys.schema_version_key(subject, version)
        found = await self._store.get_model_kv(key, SchemaVersionRecord)
        if found is None:
            raise NotFoundError(
                f"subject {subject!r} has no version {version}", code="schema_not_found"
            )
        record, kv = found
        deleted = record.model_copy(update={"deleted_ms": now_ms()})
        fingerprint_key = meta_keys.schema_fingerprint_key(subject, record.fingerprint)
        result = await (
            self._store.txn()
            .if_mod_revision(key, "==", kv.mod_revision)
            .then_put(key, encode_model(deleted))
            .then_delete(fingerprint_key)
            .commit()
        )
        if not result.succeeded:
            raise ConflictError(f"version {version} changed meanwhile; try again", code="conflict")

    # --- topic bindings --------------------------------------------------------------

    async def _bound_topics(self, subject: str) -> list[str]:
        prefix = meta_keys.SCHEMAS_PREFIX + "topics/"
        bound = []
        for kv in await self._store.range(prefix):
            if decode_model(kv, TopicSchemaRecord).subject == subject:
                bound.append(kv.key[len(prefix) :])
        return bound

    async def bind_topic(
        self,
        topic: TopicName,
        subject: str,
        *,
        validation_policy: str,
        payload_validation: bool,
    ) -> TopicSchema:
        """Bind ``topic`` to ``subject`` (which must exist) with a policy; replaces any
        earlier binding. The topic need not exist yet (auto-created topics are bound
        before their first produce)."""
        policy = check_policy(validation_policy)
        meta = await self._require_subject(subject)
        record = TopicSchemaRecord(
            subject=subject,
            validation_policy=policy,
            payload_validation=payload_validation,
            updated_ms=now_ms(),
        )
        await self._store.put_model(meta_keys.topic_schema_key(topic), record)
        return self._binding(topic, record, meta.schema_id)

    async def update_topic_policy(
        self, topic: TopicName, *, validation_policy: str, payload_validation: bool
    ) -> TopicSchema:
        """Change the policy of a bound topic (404 ``topic_schema_not_found``)."""
        policy = check_policy(validation_policy)
        key = meta_keys.topic_schema_key(topic)
        for _ in range(WRITE_ATTEMPTS_MAX):
            found = await self._store.get_model_kv(key, TopicSchemaRecord)
            if found is None:
                raise NotFoundError(
                    f"topic {topic} is bound to no schema", code="topic_schema_not_found"
                )
            record, kv = found
            updated = record.model_copy(
                update={
                    "validation_policy": policy,
                    "payload_validation": payload_validation,
                    "updated_ms": now_ms(),
                }
            )
            if await self._store.compare_and_swap(
                key, encode_model(updated), expected_mod_revision=kv.mod_revision
            ):
                meta = await self._require_subject(record.subject)
                return self._binding(topic, updated, meta.schema_id)
        raise UnavailableError(f"topic {topic}: too many concurrent changes")

    async def unbind_topic(self, topic: TopicName) -> bool:
        """Remove the topic's binding; False when it had none."""
        return await self._store.delete(meta_keys.topic_schema_key(topic))
