"""The set-up's installer hands pip's settings to uv (tools/install_requirements.py)."""

from __future__ import annotations

import os
import sys

from tools.install_requirements import parse_config_list, pip_settings, uv_arguments

LISTED = """\
:env:.find-links='/from/env'
global.cert='/etc/ssl/ca.crt'
global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/from/file'
global.index-url='https://mirror.example/simple'
install.constraint='/etc/constraints.txt'
download.find-links='/not/for/install'
"""


def test_variables_win_over_files_and_other_commands_sections_are_ignored() -> None:
    settings = parse_config_list(LISTED)
    assert settings["find-links"] == "/from/env"
    assert settings["cert"] == "/etc/ssl/ca.crt"
    assert settings["constraint"] == "/etc/constraints.txt"


def test_each_value_becomes_a_flag_of_uv() -> None:
    args = uv_arguments(parse_config_list(LISTED))
    assert args == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///a/simple",
        "--extra-index-url", "file:///b/simple",
        "--find-links", "/from/env",
        "--constraint", "/etc/constraints.txt",
    ]  # fmt: skip


def test_pip_itself_reports_a_variable_set_for_it(tmp_path) -> None:
    wheels = str(tmp_path / "wheels")
    settings = pip_settings(sys.executable, env=os.environ | {"PIP_FIND_LINKS": wheels})
    assert settings["find-links"] == wheels
    assert ["--find-links", wheels] == uv_arguments({"find-links": wheels})
