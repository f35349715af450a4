"""Every `danube ...` command line in README.md and docs/*.md names commands and options the
`danube` command has (its typer app, walked as click sees it; nothing is run). Code blocks
and inline code are read; `a | b` alternatives, `[optional]` parts and `<placeholders>` of
the synopses in docs/cli.md are understood."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from danube.cli.main import app

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A word that stands for something to fill in (or for more of the same): not checked.
_FILLERS = ("...", "…", "PLACEHOLDER")
# In a code block: a line that runs it (`danube`, `$ danube`, `.venv/bin/danube`), or
# `.../bin/danube` anywhere (after another command's `--`); not `from danube import`.
_IN_CODE = re.compile(r"(?:^\s*(?:\$\s+)?|bin/)danube (?=[-a-z\[<])")
_INLINE = re.compile(r"`(danube [^`]+)`")


def command_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, the command from `danube` on) of every mention in ``text``."""
    in_block = False
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            start = number
            while line.rstrip().endswith("\\") and number < len(lines):
                line = line.rstrip()[:-1] + " " + lines[number]
                number += 1
            match = _IN_CODE.search(line)
            if match:
                yield start, line[match.end() - len("danube ") :]
        else:
            for found in _INLINE.finditer(line):
                yield number, found.group(1)


def _words(command: str) -> list[str]:
    command = re.sub(r"\s#\s.*$", "", command)  # a shell comment
    command = re.sub(r"<[^>]*>", "PLACEHOLDER", command)
    # Brackets that group words (`[--to N]`, `(--file F | --schema T)`), not `/ns/t[-part-N]`.
    command = re.sub(r"(?:^|(?<=\s))[\[(]+|[\])]+(?=\s|$)", " ", command)
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: the words as they are
        return command.split()


def _options(command: Any) -> dict[str, bool]:
    """Each option name of a click command, and whether it takes a value."""
    names: dict[str, bool] = {"--help": False}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        takes_value = not (param.is_flag or param.count)
        for name in [*param.opts, *param.secondary_opts]:
            names[name] = takes_value
    return names


def problems_of(root: Any, command: str) -> list[str]:
    """What `command` names that the app does not have (empty: it checks out)."""
    words = _words(command)[1:]  # after `danube`
    if any(word.endswith(":") for word in words[:3]):
        return []  # an error line the command prints, not a command line
    problems: list[str] = []
    path: list[Any] = [root]  # the groups and the command reached
    alternatives: list[list[str]] = [[]]
    for word in words:
        if word == "|":
            alternatives.append([])
        else:
            alternatives[-1].append(word)
    for index, alternative in enumerate(alternatives):
        # `list | get NS | create NS`: another command of the same group.
        another = index and alternative and not alternative[0].startswith("-")
        if another and len(path) > 1 and not hasattr(path[-1], "commands"):
            path.pop()
        problems += _walk(path, alternative)
    return problems


def _walk(path: list[Any], words: list[str]) -> list[str]:
    problems: list[str] = []
    queue = list(words)
    while queue:
        word = queue.pop(0)
        current = path[-1]
        if any(filler in word for filler in _FILLERS):
            if hasattr(current, "commands"):
                break  # `danube schemas ...`: any command of the group
            continue
        if word.startswith("-") and len(word) > 1:
            options = _options(current)
            names = word.split("|")  # `--validate|--no-validate`
            for name in names:
                name = name.split("=", 1)[0]
                if name not in options:
                    problems.append(f"{' '.join(c.name for c in path)}: no option {name}")
            first = names[0].split("=", 1)[0]
            if options.get(first) and "=" not in word and queue:
                queue.pop(0)  # its value
            continue
        if hasattr(current, "commands"):
            for name in word.split("|"):  # `produce|consume|e2e`
                if name not in current.commands:
                    problems.append(f"{' '.join(c.name for c in path)}: no command {name!r}")
                    return problems
            path.append(current.commands[word.split("|")[0]])
        # else: an argument of the command
    return problems


def test_every_documented_command_line_exists() -> None:
    root = typer.main.get_command(app)
    found: list[str] = []
    checked = 0
    for doc in DOCS:
        for number, command in command_lines(doc.read_text()):
            checked += 1
            for problem in problems_of(root, command):
                found.append(f"{doc.relative_to(REPO)}:{number}: {problem}  [{command.strip()}]")
    assert checked > 100  # the reader still finds the docs' commands
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("command", "problems"),
    [
        ("danube produce -t /ns/t -m hi -c 3", []),
        ("danube produce: namespace_not_found: no such namespace", []),
        ("danube admin namespaces list | get NS | create NS [--max-topics N]", []),
        ("danube schemas register S --type avro (--file F | --schema TEXT)", []),
        ("danube admin topics schema set T --subject S [--validate|--no-validate]", []),
        ("danube bench produce|consume|e2e", []),
        ("danube --ca-file ca.pem <command> ...", []),
        ("danube produce -t /ns/t --colour red", ["danube produce: no option --colour"]),
        ("danube admin topic list", ["danube admin: no command 'topic'"]),
        (
            "danube admin topics list | frobnicate T",
            ["danube admin topics: no command 'frobnicate'"],
        ),
    ],
)
def test_the_checker_itself(command: str, problems: list[str]) -> None:
    assert problems_of(typer.main.get_command(app), command) == problems


def test_code_blocks_and_inline_code_are_read() -> None:
    text = "Run `danube up --secure`.\n\n```sh\n$ danube admin topics list \\\n  --json\n```\n"
    assert list(command_lines(text)) == [
        (1, "danube up --secure"),
        (4, "danube admin topics list    --json"),
    ]
