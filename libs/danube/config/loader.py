"""``load_settings``: build :class:`DanubeSettings` once at start, or fail with every problem.

pydantic reports a bad value by its location in the *model*; this module turns
that into the key path the user *wrote* (dropping the tag pydantic inserts for
the ``cloud`` union), adds where the value came from (file line or environment
variable), hides secret values, and raises one :class:`ConfigError` listing
every problem.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import SettingsError

from danube.config.errors import ConfigError, ConfigProblem, KeyPath, format_key_path
from danube.config.settings import (
    CLIENT_VARIABLES,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    PROCESS_VARIABLES,
    DanubeSettings,
    LoadRequest,
    loading,
    resolve_config_path,
)

__all__ = ["load_settings"]

log = logging.getLogger(__name__)

_MAX_SHOWN_INPUT_CHARS = 60
_NO_INPUT_TYPES = frozenset({"missing", "union_tag_not_found", "union_tag_invalid"})


def load_settings(
    path: Path | None = None, *, environ: Mapping[str, str] | None = None
) -> DanubeSettings:
    """Load the settings: model defaults, then the YAML file, then ``DANUBE_*`` variables.

    ``path`` defaults to ``$DANUBE_CONFIG``; with neither, only defaults and the
    environment apply. ``environ`` defaults to ``os.environ`` and is used both
    for ``DANUBE_<SECTION>__<KEY>`` overrides and for ``${VAR}`` in the file.

    Raises :class:`ConfigError` (code ``"bad_config"``) for a missing or
    unreadable file, bad YAML, an unresolved ``${VAR}``, or any invalid value,
    listing every problem with its dotted key path.
    """
    env = os.environ if environ is None else environ
    request = LoadRequest(path=resolve_config_path(path, env), environ=env)
    try:
        with loading(request):
            settings = DanubeSettings()
    except ValidationError as exc:
        problems = _problems_from_validation(exc, request)
        raise ConfigError.from_problems(problems, source=request.path) from exc
    except SettingsError as exc:
        # A complex value given as an environment variable that is not valid JSON.
        problem = ConfigProblem(path="", message=str(exc), origin="environment")
        raise ConfigError.from_problems([problem], source=request.path) from exc
    _warn_unknown_variables(env)
    log.info("settings loaded", extra={"config_file": str(request.path) if request.path else None})
    return settings


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    # pydantic-settings ignores DANUBE_* names that match no section; a typo there
    # would otherwise be silent, but other tools may share the prefix: warn only.
    sections = {name.upper() for name in DanubeSettings.model_fields}
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in PROCESS_VARIABLES | CLIENT_VARIABLES:
            continue
        section = upper[len(ENV_PREFIX) :].split(ENV_NESTED_DELIMITER, 1)[0]
        if section not in sections:
            log.warning("environment variable %s matches no setting; ignored", name)


def _problems_from_validation(exc: ValidationError, request: LoadRequest) -> list[ConfigProblem]:
    env_names = {name.upper(): name for name in request.environ}
    problems: list[ConfigProblem] = []
    for error in exc.errors(include_url=False):
        path, is_secret, discriminator = _user_path(error["loc"])
        if error["type"] in ("union_tag_invalid", "union_tag_not_found") and discriminator:
            # The fix is at the tag key itself, e.g. `wal_cloud.cloud.backend`.
            path = (*path, discriminator)
        message = str(error["msg"])
        shown = _shown_input(error, is_secret)
        if shown is not None:
            message = f"{message} (got {shown})"
        origin = _origin(path, request.key_lines, env_names)
        problems.append(ConfigProblem(format_key_path(path), message, origin))
    return problems


def _user_path(loc: Sequence[str | int]) -> tuple[KeyPath, bool, str | None]:
    """Map pydantic's ``loc`` to the written key path.

    Returns the path, whether its field holds a secret, and the discriminator
    name if the path ends at a tagged union (``cloud``).
    """
    model: type[BaseModel] | None = DanubeSettings
    tagged: dict[str, type[BaseModel]] | None = None
    path: list[str | int] = []
    is_secret = False
    discriminator: str | None = None
    for item in loc:
        if tagged is not None:
            # pydantic inserts the union tag (`s3`) into the location; the user never wrote it.
            model, tagged = tagged.get(str(item)), None
            continue
        path.append(item)
        field = (
            model.model_fields.get(item) if model is not None and isinstance(item, str) else None
        )
        model, discriminator, is_secret = None, None, False
        if field is None:
            continue
        is_secret = _mentions(field.annotation, SecretStr)
        if isinstance(field.discriminator, str):
            discriminator = field.discriminator
            tagged = _tag_members(field.annotation, discriminator)
        else:
            model = _model_of(field.annotation)
    return tuple(path), is_secret, discriminator


def _mentions(annotation: Any, target: type) -> bool:
    if annotation is target:
        return True
    return any(_mentions(arg, target) for arg in get_args(annotation))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class inside ``annotation`` (``X`` or ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [arg for arg in get_args(annotation) if _model_of(arg) is not None]
    return _model_of(models[0]) if len(models) == 1 else None


def _tag_members(annotation: Any, discriminator: str) -> dict[str, type[BaseModel]]:
    members: dict[str, type[BaseModel]] = {}
    for member in get_args(annotation):
        model = _model_of(member)
        if model is None or discriminator not in model.model_fields:
            continue
        for tag in get_args(model.model_fields[discriminator].annotation):
            members[str(tag)] = model
    return members


def _shown_input(error: Any, is_secret: bool) -> str | None:
    if is_secret or error["type"] in _NO_INPUT_TYPES:
        return None
    value = error.get("input")
    if isinstance(value, Mapping | list | tuple | set):
        return None
    text = repr(value)
    if len(text) > _MAX_SHOWN_INPUT_CHARS:
        text = text[: _MAX_SHOWN_INPUT_CHARS - 3] + "..."
    return text


def _origin(
    path: KeyPath, key_lines: Mapping[KeyPath, int], env_names: Mapping[str, str]
) -> str | None:
    # The environment wins over the file, so a variable naming this key (or a
    # section above it, given as JSON) is where the value came from.
    for end in range(len(path), 0, -1):
        prefix = path[:end]
        if any(isinstance(part, int) for part in prefix):
            continue
        name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part) for part in prefix).upper()
        if name in env_names:
            return f"from {env_names[name]}"
    line = key_lines.get(path)
    return f"line {line}" if line is not None else None
