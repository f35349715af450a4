"""How a request whose values break their model is refused, by every door alike: the code
and the message the HTTP API answers a bad body with (``invalid_json``, ``unknown_field``,
else ``invalid_request``; the first bad field named by its path), and :func:`checked`, which
builds one of the HTTP API's models from another door's values (the gRPC doors') so that
both doors hold a value to exactly the same rules and refuse it with the same code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from danube.errors import BadRequestError

# pydantic puts the tag of a union's member in an error's location; tags start with this, so
# the error message leaves them out (``start.timestamp_ms``, not ``start.<tag>.timestamp_ms``).
UNION_TAG_MARK = "~"

Model = TypeVar("Model", bound=BaseModel)
_NO_RENAMES: Mapping[str, str] = {}


def location(error: Mapping[str, Any], renames: Mapping[str, str] = _NO_RENAMES) -> tuple[Any, ...]:
    """Where an error of pydantic's is, without union tags; a part in ``renames`` is shown
    by its new name (a field by the name another door gives it)."""
    parts = error.get("loc", ())
    return tuple(
        renames.get(p, p) if isinstance(p, str) else p
        for p in parts
        if not (isinstance(p, str) and p.startswith(UNION_TAG_MARK))
    )


def validation_code(errors: Sequence[Any]) -> str:
    """The error code of a refused request, from pydantic's error types."""
    kinds = {str(error.get("type", "")) for error in errors}
    if "json_invalid" in kinds:
        return "invalid_json"
    if "extra_forbidden" in kinds:
        return "unknown_field"
    return "invalid_request"


def validation_message(errors: Sequence[Any], renames: Mapping[str, str] = _NO_RENAMES) -> str:
    """The first bad field by its path and what is wrong with it (never the value)."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in location(first, renames)) or "request"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def checked(
    model: type[Model], values: Mapping[str, Any], renames: Mapping[str, str] = _NO_RENAMES
) -> Model:
    """``model`` made of ``values``, or BadRequestError with the code and message the HTTP
    API answers the same values with (``renames``: the fields' names in the caller's
    request, for the message)."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise BadRequestError(
            validation_message(errors, renames), code=validation_code(errors)
        ) from exc
