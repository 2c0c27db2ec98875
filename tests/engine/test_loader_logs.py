"""Loading a model writes no progress bar: a service's output is its log (JSON lines with LOG_FORMAT=json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.factories import tiny_llama
from worker.model.loader import load_hf_model


def test_loading_weights_draws_no_progress_bar(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """transformers draws a `Loading weights` bar on stderr: in a container's log it was one long line of
    carriage returns, and the one line of the worker's log that was not JSON with LOG_FORMAT=json."""
    tiny_llama().save_pretrained(tmp_path)
    capfd.readouterr()
    load_hf_model(str(tmp_path), "float32", "cpu")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
