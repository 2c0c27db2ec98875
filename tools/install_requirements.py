"""`python -m tools.install_requirements -r FILE ...`: install pinned requirements into this interpreter's
venv with uv, honouring the machine's pip configuration (indexes, wheel folders, constraints, CA bundle).

uv installs the same pinned wheels as pip in a fraction of the time (it unpacks in parallel and compiles no
byte-code; the processes write the byte-code of what they import, see the Makefile). uv reads no pip.conf,
so the settings pip would use (`pip config list`: its files and PIP_* variables) are handed over as flags.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

UV = "uv==0.13.9"
# pip's setting -> uv's flag; a setting that holds several values (space separated) repeats the flag.
FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# The sections pip reads for `pip install`, weakest first: [global], then [install], then PIP_* variables.
SCOPE_ORDER = ("global", "install", ":env:")


def pip_settings(python: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """pip's settings for `pip install`, e.g. {"find-links": "/opt/wheels", "cert": "/etc/ca.crt"}."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True, env=env
    ).stdout
    return parse_config_list(listed)


def parse_config_list(listed: str) -> dict[str, str]:
    """The settings in `pip config list`'s lines (`section.key='value'`), the stronger section winning."""
    found: dict[tuple[int, str], str] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        if scope in SCOPE_ORDER:
            found[(SCOPE_ORDER.index(scope), key)] = value.strip().strip("'\"")
    return {key: value for (_, key), value in sorted(found.items())}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    args: list[str] = []
    for key, flag in FLAGS.items():
        for value in shlex.split(settings.get(key, "")):
            args += [flag, value]
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--requirement", action="append", required=True, help="a requirements file")
    args = parser.parse_args(argv)
    python = sys.executable
    settings = pip_settings(python)
    subprocess.run([python, "-m", "pip", "install", "--quiet", UV], check=True)
    env = dict(os.environ)
    if "cert" in settings:
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    uv = os.path.join(os.path.dirname(python), "uv")
    command = [uv, "pip", "install", "--quiet", "--python", python]
    # pip takes the best match over all indexes; uv's default stops at the first index that has a package.
    command += ["--index-strategy", "unsafe-best-match", *uv_arguments(settings)]
    for requirement in args.requirement:
        command += ["-r", requirement]
    subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
