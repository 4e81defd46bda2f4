"""The model packages as a third party ships them: wheels in a fresh virtual environment.

One session fixture builds slhub's wheel and each package's wheel from copies of
their folders, deletes the copies, makes a fresh ``python -m venv`` (torch from
the local CPU wheel), installs slhub, lists plugins, installs the three package
wheels and lists again. The tests then check the listings and train every
package's example recipe with the installed console script from a directory
that has nothing to do with the repository, and train one under two Gloo workers
uninterrupted and stopped-then-resumed with ``--resume auto``, bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO, assert_same_final_state, load
from slhub.testing import STOP_AT_ENV

#: Every test here is slow (cross-process, seconds to minutes): `python -m pytest -m slow`.
pytestmark = pytest.mark.slow

PACKAGES = {"rwm": "slhub-rwm", "rigidformer": "slhub-rigidformer", "bc": "slhub-bc"}
#: The hooks `slhub plugins` lists for each package.
HOOKS = {
    "rwm": ["build_model", "export", "objective", "recipe_sections", "sample", "validate"],
    "rigidformer": ["build_model", "objective", "recipe_sections", "sample", "validate"],
    "bc": ["build_model", "export", "objective", "recipe_sections", "sample", "validate"],
}  # fmt: skip
IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")

#: example recipe, distribution, small-data overrides (the recipes' own sizes take minutes).
EXAMPLES = {
    "rwm": (
        "rwm/cartpole.yaml",
        "slhub-rwm",
        [
            "data.generated_train={num_trajectories: 8, length: 40, seed: 0}",
            "data.generated_validation={num_trajectories: 2, length: 40, seed: 1}",
        ],
    ),
    "rigidformer": (
        "rigidformer/boxes.yaml",
        "slhub-rigidformer",
        ["rigidformer.scenes.train_scenes=16", "rigidformer.scenes.val_scenes=4"],
    ),
    "bc_state": (
        "bc/state.yaml",
        "slhub-bc",
        ["data.demos.train_episodes=8", "data.demos.val_episodes=2", "bc.rollouts=2"],
    ),
    "bc_visual": (
        "bc/visual.yaml",
        "slhub-bc",
        ["data.demos.train_episodes=8", "bc.val_stride=30"],
    ),
}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **(extra or {}))
    return env


def _run(
    args: list, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_env(env), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if ok:
        assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="session")
def venv(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("packaging")
    src, dist = root / "src", root / "dist"
    shutil.copytree(REPO / "slhub", src / "slhub" / "slhub", ignore=IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / "slhub" / name)
    for name in PACKAGES:
        shutil.copytree(REPO / "plugins" / name, src / name, ignore=IGNORE)
    builds = [src / "slhub", *(src / name for name in PACKAGES)]
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    _run([*pip, "-w", dist, *builds], cwd=root)
    shutil.rmtree(src)  # what is installed must not need the sources

    env_dir = root / "venv"
    _run([sys.executable, "-m", "venv", env_dir], cwd=root)
    python, slhub = env_dir / "bin" / "python", env_dir / "bin" / "slhub"
    install = [python, "-m", "pip", "install", "-q"]
    _run([*install, "torch==2.13.0", *dist.glob("slhub-*.whl")], cwd=root, timeout=600)
    before = _run([slhub, "plugins"], cwd=root).stdout
    _run([*install, *(w for w in dist.glob("slhub_*.whl"))], cwd=root)
    after = _run([slhub, "plugins"], cwd=root).stdout
    return SimpleNamespace(dir=env_dir, python=python, slhub=slhub, before=before, after=after)


def test_slhub_plugins_lists_the_packages_once_installed_and_not_before(venv) -> None:
    assert re.search(r"^nerd\s+model\s+slhub ", venv.before, re.M), venv.before
    for name, dist in PACKAGES.items():
        assert not re.search(rf"^{name}\s", venv.before, re.M), venv.before
        row = re.search(rf"^{name}\s+model\s+{dist} 0\.1\.0\s+(.+)$", venv.after, re.M)
        assert row, venv.after
        assert row.group(1).strip().split(", ") == HOOKS[name]


def test_installed_code_comes_from_the_environment(venv, tmp_path) -> None:
    names = ["slhub", *(f"slhub_{name}" for name in PACKAGES)]
    code = "import importlib\n" + "\n".join(
        f"print(importlib.import_module({n!r}).__file__)" for n in names
    )
    files = _run([venv.python, "-c", code], cwd=tmp_path).stdout.split()
    assert len(files) == 4 and all(Path(f).is_relative_to(venv.dir) for f in files), files


@pytest.mark.parametrize("case", list(EXAMPLES))
def test_installed_wheels_train_the_example_from_an_unrelated_directory(venv, tmp_path, case):
    recipe, dist, small = EXAMPLES[case]
    shutil.copy(REPO / "examples" / recipe, tmp_path / "recipe.yaml")
    sets = [*small, "trainer.steps=6", "trainer.validate_every=3", "trainer.output_dir=out"]
    _run([venv.slhub, "train", "--config", "recipe.yaml", *(f"--set={s}" for s in sets)], tmp_path)
    out = tmp_path / "out"
    plugins = json.loads((out / "run.json").read_text())["source"]["plugins"]
    assert [(p["dist"], p["role"]) for p in plugins] == [(dist, "model")]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validated = [r["step"] for r in rows if any(k.startswith("validation/") for k in r)]
    assert validated == [3, 6]
    assert (out / "step_6.pt").is_file()


def test_installed_wheel_stops_and_resumes_two_gloo_workers_exactly(venv, tmp_path) -> None:
    """Two Gloo workers under the installed torchrun, from an unrelated directory, with
    the command a requeued job reruns (``--resume auto``): uninterrupted, and preempted at
    update 3 (the installed ``slhub.testing:StopAt``, a SIGUSR1 as a scheduler sends) then
    resumed. The two final checkpoints are equal bit for bit."""
    recipe, _, small = EXAMPLES["rwm"]
    shutil.copy(REPO / "examples" / recipe, tmp_path / "recipe.yaml")
    sets = [
        *small, "trainer.steps=6", "trainer.validate_every=2",
        "trainer.device=cpu",  # the example's auto would give worker 1 a GPU it may not have
        'plugins=["slhub.testing:StopAt"]',
    ]  # fmt: skip
    torchrun = [venv.dir / "bin" / "torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=2"]

    def train(out: str, stop_at: str = "", ok: bool = True) -> subprocess.CompletedProcess:
        args = ["-m", "slhub", "train", "--config", "recipe.yaml", "--resume", "auto"]
        args += [f"--set={s}" for s in [*sets, f"trainer.output_dir={out}"]]
        return _run([*torchrun, *args], tmp_path, env={STOP_AT_ENV: stop_at}, ok=ok)

    train("full")
    stopped = train("out", stop_at="3", ok=False)
    assert stopped.returncode != 0, stopped.stderr[-3000:]  # torchrun's status for the 75
    assert "stop signal at update 3:" in stopped.stderr, stopped.stderr[-3000:]
    assert load(tmp_path / "out" / "last.pt")["step"] == 3
    train("out")
    assert json.loads((tmp_path / "out" / "run.json").read_text())["world_size"] == 2
    assert_same_final_state(tmp_path / "full" / "last.pt", tmp_path / "out" / "last.pt")
