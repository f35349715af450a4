"""Reading a password a config section names: inline (a SecretStr) or from a file.

The file is read when a connection is made, not when settings load, so a rotated file is
picked up on the next connect. Nothing here ever puts the secret into a message.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from danube.config.errors import ConfigError

__all__ = ["PASSWORD_BYTES_MAX", "read_password"]

PASSWORD_BYTES_MAX = 4096  # a password file past this is a wrong file, not a password


def read_password(
    password: SecretStr | None, password_file: Path | None, *, key: str
) -> str | None:
    """The password, or ``None`` when neither is set; ``key`` names the section in errors.

    A file's trailing newline is dropped (``echo secret > file``). Raises ConfigError (with
    the path, never the content) when the file cannot be read, is empty or too big.
    """
    if password is not None:
        return password.get_secret_value()
    if password_file is None:
        return None
    try:
        with password_file.open("rb") as file:
            data = file.read(PASSWORD_BYTES_MAX + 1)
    except OSError as exc:
        raise ConfigError(
            f"{key}.password_file: cannot read {password_file}: {exc.strerror}"
        ) from None
    if len(data) > PASSWORD_BYTES_MAX:
        raise ConfigError(
            f"{key}.password_file: {password_file} is over {PASSWORD_BYTES_MAX} bytes"
        )
    try:
        text = data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"{key}.password_file: {password_file} is not UTF-8") from None
    if not text:
        raise ConfigError(f"{key}.password_file: {password_file} is empty")
    return text
