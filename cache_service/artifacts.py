"""The data files the cache decides with, described by one manifest (cache_service/artifacts.json).

Each entry names a file, the format this code reads it in, its sha256, the offline command that builds it
(tools/cache/, never imported here) and what it was built from. The service checks every file against the
manifest before it serves: a hand-edited, half-copied or stale file would silently move the false-hit rate
the thresholds were calibrated for, so it stops the start instead, naming the file and how to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = Path(__file__).with_name("artifacts.json")
# The artifacts this code needs, and the format of each that it reads.
FORMATS = {"calibration": 1, "word_frequency": 1}


class ArtifactError(RuntimeError):
    """An artifact does not match the manifest (or is missing, or in a format this code cannot read)."""


@dataclass(frozen=True)
class Artifact:
    name: str
    file: str
    format: int
    sha256: str
    built_by: str
    built_from: dict[str, str] = field(default_factory=dict)
    license: str = ""

    def path(self, folder: Path) -> Path:
        return folder / self.file


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(manifest: Path = MANIFEST) -> dict[str, Artifact]:
    entries = json.loads(manifest.read_text())["artifacts"]
    return {name: Artifact(name=name, **entry) for name, entry in entries.items()}


def path_of(name: str, manifest: Path = MANIFEST) -> Path:
    """Where artifact `name` lives: beside the manifest, under the file name it lists."""
    try:
        return read_manifest(manifest)[name].path(manifest.parent)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"no artifact {name!r} in the manifest {manifest}: {exc!r}") from exc


def verify(manifest: Path = MANIFEST) -> dict[str, Artifact]:
    """Every artifact this code needs, checked against the manifest; raises ArtifactError naming each
    problem and the command that rebuilds the file."""
    try:
        listed = read_manifest(manifest)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"cannot read the artifact manifest {manifest}: {exc}") from exc
    problems = [f"{name}: not in the manifest" for name in FORMATS if name not in listed]
    for name, artifact in listed.items():
        path = artifact.path(manifest.parent)
        rebuild = f"rebuild it with `{artifact.built_by}` or restore it from git"
        if name in FORMATS and artifact.format != FORMATS[name]:
            problems.append(
                f"{name}: {path.name} is format {artifact.format}, this code reads format {FORMATS[name]}"
            )
        elif not path.is_file():
            problems.append(f"{name}: {path} is missing; {rebuild}")
        elif sha256_of(path) != artifact.sha256:
            problems.append(f"{name}: {path} does not match its sha256 in {manifest.name}; {rebuild}")
    if problems:
        raise ArtifactError("; ".join(problems))
    return listed
