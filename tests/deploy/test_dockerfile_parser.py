"""The Dockerfile parser used by the deploy checks reads what it claims to and refuses the rest."""

from __future__ import annotations

import pytest

from tests.deploy.dockerfile_parser import DockerfileError, parse

SAMPLE = """\
# syntax=docker/dockerfile:1
# a comment
ARG BASE=python:3.11-slim
FROM ${BASE} AS base
ENV A=1 \\
    B="two words" \\
    PATH=/x/bin:${PATH}
ENV LEGACY some value
RUN apt-get update \\
    # a comment inside a continuation
    && apt-get install -y make

COPY --chown=1:1 src/ dest/
EXPOSE 8000 9101
CMD ["python", "-m", "gateway"]
"""


def test_reads_each_instruction_form() -> None:
    arg, from_, env, legacy, run, copy, expose, cmd = parse(SAMPLE)
    assert (arg.cmd, arg.value, arg.line) == ("ARG", ("BASE=python:3.11-slim",), 3)
    assert from_.value == ("${BASE}", "AS", "base")
    assert env.value == ("A", "1", "B", "two words", "PATH", "/x/bin:${PATH}")
    assert legacy.value == ("LEGACY", "some value")
    assert run.value == ("apt-get update && apt-get install -y make",) and run.line == 9
    assert copy.flags == ("--chown=1:1",) and copy.value == ("src/", "dest/")
    assert expose.value == ("8000", "9101")
    assert cmd.json and cmd.value == ("python", "-m", "gateway")


@pytest.mark.parametrize(
    "text",
    [
        "FROM x\nRUNN echo\n",  # unknown instruction
        "RUN echo\n",  # no FROM
        "FROM x\nRUN echo \\\n",  # ends inside a continuation
        "FROM x\nRUN <<EOF\necho\nEOF\n",  # heredoc
        "# escape=`\nFROM x\n",  # other escape character
        "FROM x\nENV A=1 B\n",  # half a pair
        "FROM x\nWORKDIR\n",  # no arguments
    ],
)
def test_refuses_what_it_cannot_read_exactly(text: str) -> None:
    with pytest.raises(DockerfileError):
        parse(text)


def test_shell_form_cmd_stays_one_string() -> None:
    *_, cmd = parse('FROM x\nCMD python -m "worker"\n')
    assert not cmd.json and cmd.value == ('python -m "worker"',)
