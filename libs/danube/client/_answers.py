"""How the admin clients read the server's answers: one parse that turns a body that does
not fit its model into :class:`~danube.client.errors.ProtocolError`."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from danube.client.errors import ProtocolError

M = TypeVar("M", bound=BaseModel)


def parse_answer(model: type[M], body: Any, what: str) -> M:
    """``body`` as ``model``; ProtocolError naming ``what`` when it does not fit."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(f"{what}: unexpected answer: {exc.errors()[:1]}") from exc
