"""Rewrites one entry of the cache's artifact manifest (cache_service/artifacts.json) after a tool rebuilt
its file: the new sha256, the command that built it and what it was built from. The service refuses a file
whose sha256 is not the manifest's, so a rebuild that skipped this would not start."""

from __future__ import annotations

import json
from pathlib import Path

from cache_service.artifacts import MANIFEST, sha256_of


def record(name: str, built_from: dict[str, str], manifest: Path = MANIFEST) -> dict:
    """Entry `name` of `manifest` after its file was rebuilt: the file's sha256 now and `built_from`."""
    text = json.loads(manifest.read_text())
    entry = text["artifacts"][name]
    entry["sha256"] = sha256_of(manifest.parent / entry["file"])
    entry["built_from"] = built_from
    manifest.write_text(json.dumps(text, indent=1) + "\n")
    return entry
