"""``slhub.unwritable_reason``: why a folder a logger is given cannot hold its files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slhub import unwritable_reason


def test_a_folder_that_can_be_made_or_written_has_no_reason(tmp_path: Path):
    assert unwritable_reason(tmp_path) is None
    assert unwritable_reason(tmp_path / "not" / "yet") is None
    assert not (tmp_path / "not").exists()  # nothing is created


def test_a_file_in_the_way_is_named(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    assert unwritable_reason(tmp_path / "file") == f"{tmp_path / 'file'} is not a directory"
    reason = unwritable_reason(tmp_path / "file" / "below")
    assert reason == f"{tmp_path / 'file'} is not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_folder_is_named(tmp_path: Path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert unwritable_reason(folder / "logs") == (
            f"{folder} is not writable (read-only, or another user's)"
        )
    finally:
        folder.chmod(0o700)


def test_a_name_the_os_refuses_is_a_reason_not_an_exception(tmp_path: Path):
    reason = unwritable_reason(tmp_path / ("x" * 300) / "logs")
    assert reason is not None and "File name too long" in reason
