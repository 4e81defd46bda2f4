"""Plugin loading: entry points, module:object specs, and every way a plugin fails."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import TESTS, one_line_error, run_cli, write_recipe

FAKE_DISTS = str(TESTS / "fake_dists")


def _train(tmp_path: Path, plugin: str, env: dict[str, str] | None = None):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        plugin=plugin,
        trainer__output_dir=str(tmp_path / "out"),
        trainer__steps=2,
    )
    return run_cli("train", "--config", str(recipe), env=env)


def test_entry_point_that_fails_to_import_names_plugin_and_distribution(tmp_path: Path):
    env = {"PYTHONPATH": FAKE_DISTS + os.pathsep + str(TESTS)}
    line = one_line_error(_train(tmp_path, "broken", env))
    assert 'slhub plugin "broken" (dist fakeplug 1.2) failed to import' in line
    assert "ModuleNotFoundError: No module named 'slhub_dependency_that_does_not_exist'" in line
    assert not (tmp_path / "out").exists()


def test_broken_entry_point_is_listed_not_fatal():
    proc = run_cli("plugins", env={"PYTHONPATH": FAKE_DISTS + os.pathsep + str(TESTS)})
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("broken "))
    assert "fakeplug 1.2" in row and "BROKEN: ModuleNotFoundError" in row


def test_module_spec_that_fails_to_import(tmp_path: Path):
    line = one_line_error(_train(tmp_path, "no_such_module_xyz:Plugin"))
    assert 'slhub plugin "no_such_module_xyz:Plugin" (no distribution) failed to import' in line


def test_module_spec_with_missing_object(tmp_path: Path):
    line = one_line_error(_train(tmp_path, "slhub_testplugins:Nope"))
    assert "module slhub_testplugins has no 'Nope'" in line


def test_plugin_with_unknown_hook(tmp_path: Path):
    line = one_line_error(_train(tmp_path, "slhub_testplugins:UnknownHook"))
    assert 'slhub plugin "slhub_testplugins:UnknownHook"' in line
    assert "unknown hook" in line and "build_modle" in line


def test_plugins_lists_builtins_and_their_hooks():
    proc = run_cli("plugins")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "scale_loss" in rows["ddp_weighting"]
    assert "save" in rows["recovery"] and "restore" in rows["recovery"]
    assert "validate" in rows["rank0_validation"]
    assert "nerd" in rows and "slhub 0.1.0" in rows["nerd"]
