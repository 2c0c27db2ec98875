"""The cache's data files are described by one manifest (cache_service/artifacts.json): every file the
service reads is listed with its sha256 and the command that rebuilds it, a changed or missing file stops
the service before it serves, and the tools rewrite an entry when they rebuild its file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from cache_service import artifacts
from cache_service.artifacts import FORMATS, MANIFEST, ArtifactError, read_manifest, sha256_of, verify
from cache_service.metrics import CacheMetrics
from tools.cache import manifest as manifest_tool

SERVICE = MANIFEST.parent
ROOT = SERVICE.parent
NOT_ARTIFACTS = {"artifacts.json", "WORD_FREQUENCY_LICENSE"}  # the manifest itself, a licence text


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The manifest and every file it lists, copied: damaging the copy leaves the service's own alone."""
    for name in {MANIFEST.name} | {a.file for a in read_manifest().values()}:
        shutil.copy(SERVICE / name, tmp_path / name)
    return tmp_path / MANIFEST.name


def test_the_manifest_lists_every_data_file_the_service_reads() -> None:
    data_files = {
        p.name for p in SERVICE.iterdir() if p.is_file() and p.suffix != ".py" and p.name not in NOT_ARTIFACTS
    }
    listed = read_manifest()
    assert {a.file for a in listed.values()} == data_files
    assert set(listed) == set(FORMATS)
    for artifact in listed.values():
        assert artifact.built_by.startswith("python -m tools.cache."), artifact
        assert artifact.built_from, artifact
        if artifact.license:
            assert (SERVICE / artifact.license).is_file()


def test_every_file_matches_its_sha256_in_the_manifest() -> None:
    assert set(verify()) == set(FORMATS)
    for artifact in read_manifest().values():
        assert sha256_of(SERVICE / artifact.file) == artifact.sha256


def test_the_service_reads_the_files_the_manifest_names() -> None:
    from cache_service import calibration, spelling

    assert calibration.CALIBRATION_FILE == SERVICE / read_manifest()["calibration"].file
    assert spelling.FREQUENCY_FILE == SERVICE / read_manifest()["word_frequency"].file


def test_a_changed_file_is_refused_with_the_command_that_rebuilds_it(copy: Path) -> None:
    calibration = copy.parent / "calibration.json"
    calibration.write_text(calibration.read_text().replace("0.7925", "0.7"))
    with pytest.raises(ArtifactError) as refused:
        verify(copy)
    message = str(refused.value)
    assert "calibration.json does not match its sha256" in message
    assert "python -m tools.cache.evaluate --write-calibration" in message
    assert "word_frequency" not in message  # the unchanged file is not blamed


def test_a_missing_file_an_unknown_format_and_a_missing_entry_are_refused(copy: Path) -> None:
    (copy.parent / "word_frequency.tsv.gz").unlink()
    text = json.loads(copy.read_text())
    text["artifacts"]["calibration"]["format"] = FORMATS["calibration"] + 1
    copy.write_text(json.dumps(text))
    with pytest.raises(ArtifactError) as refused:
        verify(copy)
    assert "word_frequency.tsv.gz is missing" in str(refused.value)
    assert f"this code reads format {FORMATS['calibration']}" in str(refused.value)

    del text["artifacts"]["calibration"]
    copy.write_text(json.dumps(text))
    with pytest.raises(ArtifactError, match="calibration: not in the manifest"):
        verify(copy)
    with pytest.raises(ArtifactError, match="no artifact 'calibration'"):
        artifacts.path_of("calibration", copy)


def test_a_rebuild_recorded_by_the_tool_verifies_again(copy: Path) -> None:
    calibration = copy.parent / "calibration.json"
    calibration.write_text(calibration.read_text().replace("0.7925", "0.79"))
    with pytest.raises(ArtifactError):
        verify(copy)
    entry = manifest_tool.record("calibration", {"data": "abc", "split": "tune"}, copy)
    assert entry["sha256"] == sha256_of(calibration)
    assert set(verify(copy)) == set(FORMATS)
    assert read_manifest(copy)["calibration"].built_from == {"data": "abc", "split": "tune"}


def test_the_service_exports_what_it_runs_with() -> None:
    metrics = CacheMetrics()
    metrics.on_artifacts(verify().values())
    text = generate_latest(metrics.registry).decode()
    for artifact in read_manifest().values():
        assert (
            f'llmserve_cache_artifact_info{{artifact="{artifact.name}",format="{artifact.format}",'
            f'sha256="{artifact.sha256[:12]}"}} 1.0'
        ) in text


def test_the_service_process_refuses_to_start_on_a_changed_file(tmp_path: Path) -> None:
    """A copy of the package whose calibration was edited by hand: `python -m cache_service` exits 1 with the
    reason before it reads the file or reaches for Redis (none is running at this port)."""
    package = tmp_path / "cache_service"
    shutil.copytree(SERVICE, package, ignore=shutil.ignore_patterns("__pycache__"))
    calibration = package / "calibration.json"
    calibration.write_text(calibration.read_text().replace("0.7925", "0.7"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env["REDIS_URL"] = "redis://127.0.0.1:9/0"
    done = subprocess.run(
        [sys.executable, "-m", "cache_service"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot start" in done.stderr
    assert f"{calibration} does not match its sha256" in done.stderr
    assert "Redis" not in done.stderr
