"""Danube's ``SchemaRegistry`` gRPC service over the registry (danube.discovery.schemas.registry):
the same operations and errors as ``/v1/schemas`` (docs/schemas.md). Topic names are
Danube's; a partition's schema is its topic's."""

from __future__ import annotations

from typing import Any

from danube.admission.schema_reads import SchemaVersion
from danube.discovery.errors import NotFoundError
from danube.discovery.schemas.registry import SchemaRegistry
from danube.names import client_topic
from danube.wire import SchemaRegistry_pb2 as sr


def _schema_response(found: SchemaVersion) -> Any:
    return sr.GetSchemaResponse(
        schema_id=found.schema_id,
        version=found.version,
        subject=found.subject,
        schema_type=found.schema_type,
        schema_definition=found.definition,
        description=found.description,
        created_at=found.created_ms // 1000,
        created_by=found.created_by,
        tags=list(found.tags),
        fingerprint=found.fingerprint,
        compatibility_mode=found.compatibility_mode,
    )


class SchemaRegistryApi:
    """The handlers of ``danube_schema.SchemaRegistry``."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    async def register_schema(self, request: Any, context: Any) -> Any:
        registered = await self.registry.register(
            request.subject,
            request.schema_type,
            request.schema_definition,
            description=request.description,
            created_by=request.created_by,
            tags=list(request.tags),
        )
        return sr.RegisterSchemaResponse(
            schema_id=registered.schema_id,
            version=registered.version,
            is_new_version=registered.is_new,
            fingerprint=registered.fingerprint,
        )

    async def get_schema(self, request: Any, context: Any) -> Any:
        version = request.version if request.HasField("version") else None
        return _schema_response(await self.registry.get(request.schema_id, version))

    async def get_latest_schema(self, request: Any, context: Any) -> Any:
        return _schema_response(await self.registry.latest(request.subject))

    async def list_versions(self, request: Any, context: Any) -> Any:
        versions = await self.registry.versions(request.subject)
        return sr.ListVersionsResponse(
            versions=[
                sr.SchemaVersionInfo(
                    version=v.version,
                    created_at=v.created_ms // 1000,
                    created_by=v.created_by,
                    description=v.description,
                    fingerprint=v.fingerprint,
                    schema_id=v.schema_id,
                )
                for v in versions
            ]
        )

    async def check_compatibility(self, request: Any, context: Any) -> Any:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        ok, errors = await self.registry.check(
            request.subject,
            request.schema_type,
            request.new_schema_definition,
            None if mode is None else mode.lower(),
        )
        return sr.CheckCompatibilityResponse(is_compatible=ok, errors=errors)

    async def delete_schema_version(self, request: Any, context: Any) -> Any:
        await self.registry.delete_version(request.subject, request.version)
        return sr.DeleteSchemaVersionResponse(
            success=True, message=f"version {request.version} of {request.subject} deleted"
        )

    async def set_compatibility_mode(self, request: Any, context: Any) -> Any:
        mode = request.compatibility_mode.lower()
        await self.registry.set_mode(request.subject, mode)
        return sr.SetCompatibilityModeResponse(
            success=True, message=f"{request.subject}: compatibility {mode}"
        )

    async def configure_topic_schema(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name).parent
        binding = await self.registry.bind_topic(
            topic,
            request.schema_subject,
            validation_policy=request.validation_policy.lower(),
            payload_validation=request.enable_payload_validation,
        )
        return sr.ConfigureTopicSchemaResponse(
            success=True,
            message=f"{topic} bound to {binding.subject} ({binding.validation_policy})",
        )

    async def update_topic_validation_policy(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name).parent
        binding = await self.registry.update_topic_policy(
            topic,
            validation_policy=request.validation_policy.lower(),
            payload_validation=request.enable_payload_validation,
        )
        return sr.UpdateTopicValidationPolicyResponse(
            success=True, message=f"{topic}: {binding.validation_policy}"
        )

    async def get_topic_schema_config(self, request: Any, context: Any) -> Any:
        topic = client_topic(request.topic_name).parent
        binding = await self.registry.topic_schema(topic)
        if binding is None:
            raise NotFoundError(f"{topic} has no schema", code="topic_schema_not_found")
        return sr.GetTopicSchemaConfigResponse(
            schema_subject=binding.subject,
            validation_policy=binding.validation_policy,
            enable_payload_validation=binding.payload_validation,
            schema_id=binding.schema_id,
        )
