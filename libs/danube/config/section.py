"""What every section of ``danube.yml`` is built on: a frozen model that refuses unknown keys
(a typo fails at start instead of being ignored), and a user with its password."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

MiB = 1024 * 1024


class Section(BaseModel):
    """A section (or sub-section) of the settings: frozen, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# A user name travels into NATS subjects (the per-user reply inbox) and etcd role names.
UserName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class Credentials(Section):
    """A user and its password: inline (best from the environment, e.g.
    ``DANUBE_BUS__PASSWORD``) or in a file (``password_file``, read when connecting).
    The password is a SecretStr: repr, logs and error messages show ``**********``."""

    user: UserName | None = None
    password: SecretStr | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _one_password_with_a_user(self) -> Credentials:
        if self.password is not None and self.password_file is not None:
            raise ValueError("set password or password_file, not both")
        has_password = self.password is not None or self.password_file is not None
        if has_password != (self.user is not None):
            raise ValueError("user and a password (password or password_file) go together")
        return self
