"""Plugin loading: entry points, module:object specs, and every way a plugin fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, TESTS, cli_error, subprocess_env, write_recipe
from slhub import cli, hookimpl, registry
from slhub.errors import PluginError

FAKE_DISTS = str(TESTS / "fake_dists")


@pytest.fixture
def fake_dists(monkeypatch) -> None:
    """The fake distribution ``fakeplug`` installed, in this process, for one test: its
    entry points are found on ``sys.path`` (import caches invalidated; restored after)."""
    monkeypatch.syspath_prepend(FAKE_DISTS)


def fresh_slhub(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m slhub ARGS`` in a new interpreter in the repository root, which reads
    ``PYTHONPATH`` (and so finds ``fakeplug``) only at its own start-up."""
    return subprocess.run(
        [sys.executable, "-m", "slhub", *args],
        cwd=REPO,
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _train_error(capsys, tmp_path: Path, plugin: str) -> str:
    recipe = write_recipe(
        tmp_path / "r.yaml",
        plugin=plugin,
        trainer__output_dir=str(tmp_path / "out"),
        trainer__steps=2,
    )
    return cli_error(capsys, "train", "--config", str(recipe))


def test_entry_point_that_fails_to_import_names_plugin_and_distribution(
    capsys, tmp_path: Path, fake_dists
):
    line = _train_error(capsys, tmp_path, "broken")
    assert 'slhub plugin "broken" (dist fakeplug 1.2) failed to import' in line
    assert "ModuleNotFoundError: No module named 'slhub_dependency_that_does_not_exist'" in line
    assert not (tmp_path / "out").exists()


def test_broken_entry_point_is_listed_not_fatal():
    """End to end: a fresh ``python -m slhub plugins`` finds the distribution on PYTHONPATH."""
    proc = fresh_slhub("plugins", env={"PYTHONPATH": FAKE_DISTS + os.pathsep + str(TESTS)})
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("broken "))
    assert "fakeplug 1.2" in row and "BROKEN: ModuleNotFoundError" in row


def test_module_spec_that_fails_to_import(capsys, tmp_path: Path):
    line = _train_error(capsys, tmp_path, "no_such_module_xyz:Plugin")
    assert 'slhub plugin "no_such_module_xyz:Plugin" (no distribution) failed to import' in line


def test_module_spec_with_missing_object(capsys, tmp_path: Path):
    line = _train_error(capsys, tmp_path, "slhub_testplugins:Nope")
    assert "module slhub_testplugins has no 'Nope'" in line


def test_plugin_with_unknown_hook(capsys, tmp_path: Path):
    line = _train_error(capsys, tmp_path, "slhub_testplugins:UnknownHook")
    assert 'slhub plugin "slhub_testplugins:UnknownHook"' in line
    assert "unknown hook" in line and "build_modle" in line


def test_plugins_lists_builtins_and_their_hooks(capsys):
    code = cli.main(["plugins"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert "scale_loss" in rows["ddp_weighting"]
    assert "recovery" not in rows  # the loop registers rng, sampler and buffers itself
    assert "validate" in rows["rank0_validation"]
    assert "nerd" in rows and "slhub 0.1.0" in rows["nerd"]


def test_distribution_providing_agrees_with_packages_distributions():
    """The start-up's cheap lookup names the distribution importlib's full scan names
    first, for packages declared in top_level.txt, packages found only in RECORD, an
    installed plugin, a local package and a name nothing provides."""
    from importlib.metadata import packages_distributions

    from slhub.registry import distribution_providing

    table = packages_distributions()
    names = ["torch", "yaml", "_yaml", "numpy", "pluggy", "structlog", "slhub_rwm", "slhub"]
    names += ["examples", "no_such_top_level_module"]
    for top in names:
        found = distribution_providing(top)
        expected = table.get(top, [None])[0]
        assert (found.metadata["Name"] if found is not None else None) == expected, top


class _OldNames:
    @hookimpl
    def save(self, trainer):
        return {"x": 1}

    @hookimpl
    def restore(self, trainer, state):
        pass


def test_hooks_under_their_old_names_are_refused_naming_the_new_ones():
    with pytest.raises(PluginError) as caught:
        registry.build_manager("examples.sl_ddp.plugin:SlDdpPlugin", ["old"], {"old": _OldNames()})
    message = str(caught.value)
    assert "save -> state_dict" in message and "restore -> load_state_dict" in message
    assert "\n" not in message
