"""A small Dockerfile instruction parser: enough of BuildKit's grammar to read deploy/Dockerfile strictly.

It handles comments, `\\` line continuations, the JSON (exec) and shell forms, `--flag` options and
ENV/ARG key=value pairs. Heredocs and a changed escape character are refused rather than half-parsed.
(A parser of our own, because the one on PyPI ships wheels for x86_64 Linux only, and requirements.txt
is installed inside the image on every platform.)
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

INSTRUCTIONS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)
FLAGGED = frozenset({"ADD", "COPY", "FROM", "RUN", "HEALTHCHECK"})
EXEC_FORM = frozenset({"CMD", "ENTRYPOINT", "RUN", "SHELL", "ADD", "COPY", "VOLUME"})
_DIRECTIVE = re.compile(r"#\s*(\w+)\s*=\s*(\S+)\s*$")


class DockerfileError(ValueError):
    pass


@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case
    value: tuple[str, ...]  # arguments: the exec-form list, shell-form command, or split words
    flags: tuple[str, ...]  # --name=value options, in order
    json: bool  # exec (JSON) form
    line: int  # first line, 1-based


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continuation lines and drop comments; keep each instruction's first line number."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    in_directives = True
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if in_directives:
            match = _DIRECTIVE.match(stripped)
            if match and match.group(1).lower() == "escape" and match.group(2) != "\\":
                raise DockerfileError("only the default escape character is supported")
            if not match:
                in_directives = False
        if stripped.startswith("#") or (not stripped and pending):
            continue  # comments, and blank lines inside a continuation, are dropped
        if not stripped:
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        out.append((start, " ".join(part.strip() for part in pending)))
        pending = []
    if pending:
        raise DockerfileError(f"line {start}: the file ends inside a line continuation")
    return out


def _parse_one(number: int, line: str) -> Instruction:
    word, _, rest = line.partition(" ")
    cmd = word.upper()
    if cmd not in INSTRUCTIONS:
        raise DockerfileError(f"line {number}: unknown instruction {word!r}")
    rest = rest.strip()
    if "<<" in rest and cmd in ("RUN", "COPY", "ADD"):
        raise DockerfileError(f"line {number}: heredocs are not supported")
    flags: list[str] = []
    if cmd in FLAGGED:
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
    if cmd in EXEC_FORM and rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
            return Instruction(cmd, tuple(parsed), tuple(flags), True, number)
    if not rest:
        raise DockerfileError(f"line {number}: {cmd} needs arguments")
    if cmd in ("RUN", "CMD", "ENTRYPOINT", "SHELL", "HEALTHCHECK", "ONBUILD"):
        value: tuple[str, ...] = (rest,)
    elif cmd in ("ENV", "LABEL") and "=" not in rest.split()[0]:
        key, _, val = rest.partition(" ")  # legacy `ENV key value`
        value = (key, val.strip())
    elif cmd in ("ENV", "LABEL", "ARG"):
        value = tuple(part for pair in shlex.split(rest) for part in _pair(cmd, pair))
    else:
        value = tuple(rest.split())
    return Instruction(cmd, value, tuple(flags), False, number)


def _pair(cmd: str, item: str) -> tuple[str, ...]:
    if cmd == "ARG":
        return (item,)
    key, sep, val = item.partition("=")
    if not sep:
        raise DockerfileError(f"{cmd} {item!r}: expected key=value")
    return key, val


def parse(text: str) -> tuple[Instruction, ...]:
    """The instructions in order; DockerfileError on anything this parser does not read exactly."""
    instructions = tuple(_parse_one(number, line) for number, line in _logical_lines(text))
    first_real = next((i for i in instructions if i.cmd != "ARG"), None)
    if first_real is None or first_real.cmd != "FROM":
        raise DockerfileError("the first instruction after ARGs must be FROM")
    return instructions
