"""``slhub eval`` refuses every bad argument in one stderr line with exit status 2, before
any work and writing nothing: bad numbers, a ``--video`` it cannot write, ``--env`` on a
model that cannot be judged in a simulator, and a simulator or dataset of another robot
(named with both layouts). Tiny checkpoints (2 updates) keep it fast."""

from __future__ import annotations

from pathlib import Path

import pytest

import slhub
from helpers import REPO, cli_error, one_line_error, run_cli

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

ENV = "gymnasium:InvertedPendulum-v5"
HOPPER = "gymnasium:Hopper-v5"
TINY = [
    "trainer.steps=2",
    "trainer.validate_every=2",
    "trainer.save_every=2",
    "trainer.batch_size=4",
    "trainer.device=cpu",
]


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` with its size and modification time, but the
    ``tmp`` folder eval collects into (its time changes; it must be left empty)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p != root / "tmp"
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Datasets, runs and statistics caches: nothing an evaluation may change."""
    from slhub.sim import collect

    root = tmp_path_factory.mktemp("eval_arguments")
    collect(root / "pendulum", ENV, episodes=6, steps=40, actions="smooth", seed=0,
            through_termination=True)  # fmt: skip
    collect(root / "hopper", HOPPER, episodes=1, steps=3, seed=0)
    return root


@pytest.fixture(scope="module")
def nerd(root: Path) -> Path:
    slhub.train(REPO / "examples/nerd/pendulum/sl.train.yaml", [
        *TINY, "model.width=8", "model.layers=1", "model.heads=2", "model.mlp_hidden=8",
        "model.history=4", "validation.horizons=[1, 5]", "data.split.validation_ratio=0.34",
        f"data.path={root / 'pendulum'}", f"data.cache_dir={root / 'cache'}",
        f"trainer.output_dir={root / 'nerd'}",
    ])  # fmt: skip
    return root / "nerd" / "last.pt"


@pytest.fixture
def unchanged(root: Path, tmp_path: Path, monkeypatch):
    """Asserts, after the test, that nothing under ``root``, the test's folder or the
    temporary folder eval collects into was created or changed."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = _files(root), _files(tmp_path)
    yield
    assert (_files(root), _files(tmp_path)) == before
    assert not any(scratch.iterdir())


def _refused(capsys, ckpt: Path, *argv: str) -> str:
    return cli_error(capsys, "eval", "--checkpoint", str(ckpt), *argv)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--episodes", "0", "--env", ENV], ["--episodes must be >= 1, got 0"]),
        (["--episodes", "-3"], ["--episodes must be >= 1, got -3"]),
        (["--steps", "0", "--env", ENV], ["--steps must be >= 1, got 0"]),
        (["--seed", "-1", "--env", ENV], ["--seed must be >= 0, got -1"]),
        (["--video", "out.mp4"], ["--video", "needs --env"]),
        (["--env", ENV, "--video", "."], ["--video", "is a directory", "rollout.mp4"]),
        (["--env", ENV, "--video", "missing/out.mp4"], ["missing", "does not exist"]),
        (["--env", ENV, "--video", "out.avi"], ["out.avi", ".mp4 file"]),
        (["--env", ENV, "--video", "out.mp4"], ["--video", "plugin nerd", "not a policy"]),
        (["--set", "valdation.horizons=[1]"], ["valdation", "reads no", "model, data"]),
        (["--set", "trainer.batch_size=0"], ["--set trainer.batch_size=0", "must be > 0"]),
        (["--set", "model.width=0"], ["--set model.width=0", "model.width"]),
    ],
)
def test_a_bad_argument_is_one_line_before_any_work(
    argv, words, nerd, unchanged, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # the relative --video paths
    line = _refused(capsys, nerd, *argv)
    for word in words:
        assert word in line, line
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob("*.avi"))


def test_a_simulator_of_another_robot_is_named_with_both_layouts(nerd, unchanged, capsys):
    line = _refused(capsys, nerd, "--env", HOPPER, "--episodes", "1", "--steps", "3")
    assert f"--env {HOPPER}: this model was trained on {ENV}'s 4-component state" in line
    assert "(qpos.slider, qpos.hinge, qvel.slider, qvel.hinge)" in line
    # Hopper's 12 components, cut to a readable list
    assert f"{HOPPER} gives 12 (qpos.rootx, qpos.rootz, qpos.rooty, " in line, line
    assert ", ..., qvel.foot_joint)" in line and "qvel.thigh_joint" not in line
    assert "slhub-eval-" not in line and "validation.groups" not in line


def test_a_dataset_of_another_robot_is_named_with_both_layouts(nerd, root, unchanged, capsys):
    line = _refused(capsys, nerd, "--set", f"data.path={root / 'hopper'}")
    assert f"this model was trained on {ENV}'s 4-component state" in line
    assert f"{root / 'hopper'} (from {HOPPER}) gives 12 (qpos.rootx, " in line, line


def test_eval_help_says_what_it_refuses(capsys):
    from slhub import cli

    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "with --env (refused without it)" in text and "a folder that exists" in text
    assert "with --env, >= 1 (default 16)" in text and "any other model is refused" in text


# ------------------------------------------------------------------ other plugins


def test_a_policy_refuses_bad_numbers_and_videos_in_one_line(root, tmp_path, capsys):
    """BC validates ``validation.env`` with pydantic: its refusals are one line, not tracebacks."""
    pytest.importorskip("slhub_bc")
    import yaml

    raw = yaml.safe_load((REPO / "examples/bc/state.yaml").read_text())
    raw["trainer"].update(steps=2, batch_size=4, validate_every=2, save_every=2,
                          device="cpu", output_dir=str(tmp_path / "run"))  # fmt: skip
    raw["bc"].update(history=2, frame_gap=1, chunk=4, hidden=8, rollouts=0)
    raw["data"] = {
        "path": str(root / "pendulum"),
        "cache_dir": str(tmp_path / "cache"),
        "split": {"validation_ratio": 0.34, "seed": 0},
        "window": {"pad": True},
        "features": {"observation": ["observation"], "action": ["action"]},
    }
    recipe = tmp_path / "bc.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    slhub.train(recipe)
    ckpt = tmp_path / "run" / "last.pt"
    before = _files(tmp_path)
    capsys.readouterr()  # the training's log lines
    # the reported case, through a whole process: exit 2, one line, no pydantic traceback
    line = one_line_error(run_cli("eval", "--checkpoint", str(ckpt), "--env", ENV,
                                  "--episodes", "0"))  # fmt: skip
    assert "--episodes must be >= 1, got 0" in line
    assert "--steps must be >= 1" in _refused(capsys, ckpt, "--env", ENV, "--steps", "0")
    line = _refused(capsys, ckpt, "--env", ENV, "--video", str(tmp_path))
    assert "is a directory" in line
    line = _refused(capsys, ckpt, "--env", ENV, "--video", str(tmp_path / "no" / "v.mp4"))
    assert "does not exist" in line
    assert "needs --env" in _refused(capsys, ckpt, "--video", str(tmp_path / "v.mp4"))
    assert "bc.hidden" in _refused(capsys, ckpt, "--set", "bc.hidden=-1")
    line = _refused(capsys, ckpt, "--env", ENV, "--init", "random")
    assert "--init random: plugin bc's model is a policy" in line and "leave --init out" in line
    assert _files(tmp_path) == before


def test_env_on_a_model_that_cannot_be_judged_in_a_simulator(root, tmp_path, capsys):
    """RigidFormer (generated scenes) and the sl_ddp example (a synthetic corpus) neither
    roll a policy out nor read episodes: ``--env`` is refused naming the plugin."""
    pytest.importorskip("slhub_rigidformer")
    slhub.train(REPO / "examples/rigidformer/boxes.yaml", [
        *TINY, "rigidformer.scenes.train_scenes=8", "rigidformer.scenes.val_scenes=2",
        "rigidformer.scenes.steps=4", "rigidformer.model.width=8", "rigidformer.model.heads=2",
        "rigidformer.model.ff=8", f"trainer.output_dir={tmp_path / 'rigidformer'}",
    ])  # fmt: skip
    slhub.train(REPO / "examples/sl_ddp/cpu.yaml", [
        *TINY, "data.train_size=32", "data.validation_size=8",
        f"trainer.output_dir={tmp_path / 'sl_ddp'}",
    ])  # fmt: skip
    before = _files(tmp_path)
    capsys.readouterr()  # the training's log lines
    line = _refused(capsys, tmp_path / "rigidformer" / "last.pt", "--env", ENV)
    assert f"--env {ENV}: plugin rigidformer can neither roll a policy out" in line, line
    assert "leave --env out" in line
    sl_ddp = "examples.sl_ddp.plugin:SlDdpPlugin"
    line = _refused(capsys, tmp_path / "sl_ddp" / "last.pt", "--plugin", sl_ddp, "--env", ENV)
    assert f"plugin {sl_ddp} can neither roll a policy out" in line, line
    assert _files(tmp_path) == before


def test_a_world_model_names_both_layouts_and_evaluates_its_own_robot(
    root, tmp_path, monkeypatch, capsys
):
    """RWM: another robot is one line naming both layouts; its own robot's fresh episodes
    evaluate (the layout buffer names the dataset's folder, which eval's is not)."""
    pytest.importorskip("slhub_rwm")
    import tempfile

    from slhub import evaluate

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    run = tmp_path / "rwm"
    slhub.train(REPO / "examples/rwm/halfcheetah.yaml", [
        *TINY, "rwm.history=4", "rwm.horizon=2", "rwm.hidden=8", "rwm.layers=1",
        "rwm.angles=[]", "rwm.val_stride=4", "data.split.validation_ratio=0.34",
        f"data.path={root / 'pendulum'}", f"data.cache_dir={tmp_path / 'cache'}",
        f"trainer.output_dir={run}",
    ])  # fmt: skip
    before = _files(root), _files(tmp_path)
    capsys.readouterr()  # the training's log lines
    line = _refused(capsys, run / "last.pt", "--env", HOPPER, "--episodes", "1", "--steps", "3")
    assert f"trained on {ENV}'s 4-component state (qpos.slider, " in line, line
    assert f"{HOPPER} gives 12 (qpos.rootx, " in line
    assert (_files(root), _files(tmp_path)) == before and not any(scratch.iterdir())
    metrics = evaluate(run / "last.pt", env=ENV, episodes=2, steps=20, seed=3)
    assert set(metrics) >= {"relative_error", "baseline_relative_error"}
