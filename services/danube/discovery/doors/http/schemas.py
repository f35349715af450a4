"""Schema registry routes: ``/v1/schemas/...`` (subjects, versions, compatibility, modes)
and ``/v1/topics/{ns}/{topic}/schema`` (bindings). The logic is
:class:`~danube.discovery.schemas.registry.SchemaRegistry`; docs/schemas.md."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from danube.admission.schema_reads import SchemaVersion, TopicSchema
from danube.discovery.doors.bodies.schemas import (
    CompatibilityIn,
    ModeIn,
    SchemaIn,
    TopicPolicyIn,
    TopicSchemaIn,
)
from danube.discovery.doors.http.params import Namespace, Topic
from danube.discovery.doors.http.state import ServicesDep
from danube.discovery.errors import NotFoundError, TooLargeError
from danube.names import user_topic, validate_subject
from danube.schemas import DEFINITION_BYTES_MAX
from danube.wire.api.schemas import (
    CompatibilityOut,
    ModeOut,
    RegisteredOut,
    SchemaVersionList,
    SchemaVersionOut,
    SubjectList,
    TopicSchemaOut,
)

router = APIRouter(prefix="/v1", tags=["schemas"])

Subject = Annotated[
    str,
    Path(
        description="A subject: letters, digits, '.', '_' and '-'.",
        json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,255}$"},
    ),
]
VERSION_MAX = 10**10 - 1
Version = Annotated[int, Path(ge=1, le=VERSION_MAX, description="A version of the subject.")]


def _definition(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > DEFINITION_BYTES_MAX:
        raise TooLargeError(
            f"the schema is {len(data)} bytes, over the {DEFINITION_BYTES_MAX} byte limit",
            code="schema_too_large",
            limit=DEFINITION_BYTES_MAX,
        )
    return data


def _version_out(found: SchemaVersion) -> SchemaVersionOut:
    fields: dict[str, Any] = {
        "subject": found.subject,
        "schema_id": found.schema_id,
        "version": found.version,
        "schema_type": found.schema_type,
        "schema": found.definition.decode(),
        "fingerprint": found.fingerprint,
        "description": found.description,
        "created_by": found.created_by,
        "created_ms": found.created_ms,
        "tags": list(found.tags),
        "compatibility_mode": found.compatibility_mode,
        "deleted": found.deleted,
    }
    return SchemaVersionOut.model_validate(fields)


def _binding_out(found: TopicSchema) -> TopicSchemaOut:
    return TopicSchemaOut(
        topic=str(found.topic),
        subject=found.subject,
        schema_id=found.schema_id,
        validation_policy=found.validation_policy,
        payload_validation=found.payload_validation,
        updated_ms=found.updated_ms,
    )


@router.get("/schemas", response_model=SubjectList)
async def list_subjects(services: ServicesDep) -> SubjectList:
    """Every subject."""
    return SubjectList(subjects=await services.schemas.subjects())


@router.get("/schemas/ids/{schema_id:int}", response_model=SchemaVersionOut)
async def get_by_id(
    schema_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    services: ServicesDep,
    version: Annotated[int | None, Query(ge=1, le=VERSION_MAX)] = None,
) -> SchemaVersionOut:
    """A version by schema id: ``?version=N``, or the subject's latest live version."""
    return _version_out(await services.schemas.get(schema_id, version))


@router.post(
    "/schemas/{subject}/versions",
    response_model=RegisteredOut,
    status_code=201,
    responses={
        200: {"model": RegisteredOut, "description": "The subject has this definition already"}
    },
)
async def register(
    subject: Subject, body: SchemaIn, services: ServicesDep, response: Response
) -> RegisteredOut:
    """Register a version: 201 when new, 200 with the existing version for a definition
    the subject has (same fingerprint); 400 ``invalid_schema`` saying where, 409
    ``incompatible_schema`` listing the failed rules."""
    registered = await services.schemas.register(
        validate_subject(subject),
        body.schema_type,
        _definition(body.schema_),
        description=body.description,
        created_by=body.created_by,
        tags=body.tags,
    )
    response.status_code = 201 if registered.is_new else 200
    return RegisteredOut(
        schema_id=registered.schema_id,
        version=registered.version,
        is_new_version=registered.is_new,
        fingerprint=registered.fingerprint,
    )


@router.get("/schemas/{subject}/versions", response_model=SchemaVersionList)
async def list_versions(subject: Subject, services: ServicesDep) -> SchemaVersionList:
    """The subject's live versions, oldest first."""
    found = await services.schemas.versions(validate_subject(subject))
    return SchemaVersionList(subject=subject, versions=[_version_out(v) for v in found])


@router.get("/schemas/{subject}/versions/latest", response_model=SchemaVersionOut)
async def latest(subject: Subject, services: ServicesDep) -> SchemaVersionOut:
    """The subject's newest live version."""
    return _version_out(await services.schemas.latest(validate_subject(subject)))


@router.get("/schemas/{subject}/versions/{version:int}", response_model=SchemaVersionOut)
async def get_version(
    subject: Subject,
    version: Version,
    services: ServicesDep,
    deleted: Annotated[bool, Query(description="Answer a deleted version too.")] = False,
) -> SchemaVersionOut:
    """One version; a deleted one is 404 ``schema_not_found`` unless ``?deleted=true`` (by
    id and version, ``GET /v1/schemas/ids/{id}?version=V``, it is always answered)."""
    found = await services.schemas.version(validate_subject(subject), version)
    if found.deleted and not deleted:
        raise NotFoundError(
            f"subject {subject!r} version {version} is deleted", code="schema_not_found"
        )
    return _version_out(found)


@router.delete("/schemas/{subject}/versions/{version:int}", status_code=204)
async def delete_version(subject: Subject, version: Version, services: ServicesDep) -> Response:
    """Soft-delete a version; 409 ``schema_in_use`` for the last live version of a subject
    bound to a topic."""
    await services.schemas.delete_version(validate_subject(subject), version)
    return Response(status_code=204)


@router.post("/schemas/{subject}/compatibility", response_model=CompatibilityOut)
async def check_compatibility(
    subject: Subject, body: CompatibilityIn, services: ServicesDep
) -> CompatibilityOut:
    """Whether the definition could be registered now (a new subject accepts anything)."""
    name = validate_subject(subject)
    compatible, errors = await services.schemas.check(
        name, body.schema_type, _definition(body.schema_), body.mode
    )
    mode: str | None = body.mode
    if mode is None:
        try:
            mode = await services.schemas.mode(name)
        except NotFoundError:  # a new subject: it would take the cluster's default
            mode = services.schemas.default_mode
    return CompatibilityOut.model_validate(
        {"compatible": compatible, "mode": mode, "errors": errors}
    )


@router.get("/schemas/{subject}/mode", response_model=ModeOut)
async def get_mode(subject: Subject, services: ServicesDep) -> ModeOut:
    """The subject's compatibility mode (its own, or the cluster's default)."""
    mode = await services.schemas.mode(validate_subject(subject))
    return ModeOut.model_validate({"subject": subject, "mode": mode})


@router.put("/schemas/{subject}/mode", response_model=ModeOut)
async def set_mode(subject: Subject, body: ModeIn, services: ServicesDep) -> ModeOut:
    """Set the subject's compatibility mode (later registrations are checked by it)."""
    await services.schemas.set_mode(validate_subject(subject), body.mode)
    return ModeOut(subject=subject, mode=body.mode)


# --- topic bindings ----------------------------------------------------------------------


@router.get("/topics/{ns}/{topic}/schema", response_model=TopicSchemaOut)
async def get_topic_schema(ns: Namespace, topic: Topic, services: ServicesDep) -> TopicSchemaOut:
    """The topic's subject and validation policy; 404 ``topic_schema_not_found``."""
    name = user_topic(ns, topic)
    found = await services.schemas.topic_schema(name)
    if found is None:
        raise NotFoundError(f"topic {name} is bound to no schema", code="topic_schema_not_found")
    return _binding_out(found)


@router.put("/topics/{ns}/{topic}/schema", response_model=TopicSchemaOut)
async def put_topic_schema(
    ns: Namespace, topic: Topic, body: TopicSchemaIn, services: ServicesDep
) -> TopicSchemaOut:
    """Bind the topic to a subject (which must exist) with a validation policy."""
    found = await services.schemas.bind_topic(
        user_topic(ns, topic),
        validate_subject(body.subject),
        validation_policy=body.validation_policy,
        payload_validation=body.payload_validation,
    )
    return _binding_out(found)


@router.patch("/topics/{ns}/{topic}/schema", response_model=TopicSchemaOut)
async def patch_topic_schema(
    ns: Namespace, topic: Topic, body: TopicPolicyIn, services: ServicesDep
) -> TopicSchemaOut:
    """Change a bound topic's validation policy."""
    found = await services.schemas.update_topic_policy(
        user_topic(ns, topic),
        validation_policy=body.validation_policy,
        payload_validation=body.payload_validation,
    )
    return _binding_out(found)


@router.delete("/topics/{ns}/{topic}/schema", status_code=204)
async def delete_topic_schema(ns: Namespace, topic: Topic, services: ServicesDep) -> Response:
    """Unbind the topic (404 ``topic_schema_not_found`` when it was not bound)."""
    name = user_topic(ns, topic)
    if not await services.schemas.unbind_topic(name):
        raise NotFoundError(f"topic {name} is bound to no schema", code="topic_schema_not_found")
    return Response(status_code=204)
