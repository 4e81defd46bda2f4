"""Image augmentation (random crop at train, centre crop otherwise, colour jitter) and
policies judged in their environment (``validation.env``, ``slhub eval --env``), on
InvertedPendulum-v5 demonstrations collected with slhub's own expert."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import slhub
import torch
import yaml
from slhub import Trainer
from slhub.sim import collect
from slhub.testing import StandInTrainer, assert_tree_equal, build, check_resume_and_revalidate

from slhub_bc.augment import crop, crop_sizes, jitter
from slhub_bc.plugin import BcPlugin

ENV = "gymnasium:InvertedPendulum-v5"
EXPERT = "slhub.sim.experts:inverted_pendulum"
#: What both policies read of the collected store: the clean expert action is the label.
STATE = {"observation": ["observation"], "action": ["policy_action"]}
VISUAL = {"image": ["image"], "action": ["policy_action"]}
#: Random 28 x 28 crops of the 32 x 32 frames and colour jitter.
AUGMENTED = {"crop": 28, "color_jitter": {"brightness": 0.2, "contrast": 0.2}}


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """8 expert episodes of 80 steps with 32 x 32 frames from the ``fixed`` camera."""
    path = tmp_path_factory.mktemp("pendulum") / "store"
    collect(path, ENV, episodes=8, steps=80, actions="policy", policy=EXPERT, noise=0.1,
            render=True, camera="fixed", size=32, seed=0)  # fmt: skip
    return path


def _recipe(tmp_path: Path, repo: Path, dataset: Path, observation: str, **sections) -> Path:
    raw = yaml.safe_load((repo / f"examples/bc/{observation}.yaml").read_text())
    raw["trainer"].update(
        steps=6, batch_size=4, validate_every=3, save_every=3, device="cpu",
        output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    raw["bc"].update(history=2, frame_gap=1, chunk=4, hidden=16, channels=4, rollouts=0)
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "window": {"pad": True},
        "features": STATE if observation == "state" else VISUAL,
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = tmp_path / f"{observation}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _trainer(recipe: Path) -> tuple[BcPlugin, Trainer, torch.nn.Module]:
    raw = yaml.safe_load(recipe.read_text())
    plugin = BcPlugin()
    sections = {k: raw[k] for k in ("bc", "data", "validation") if k in raw}
    trainer = StandInTrainer(plugin, sections, **raw["trainer"])
    return plugin, trainer, build(trainer, plugin)


def _streams() -> tuple:
    return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()


# ------------------------------------------------------------------ augmentation


def test_crop_sizes_from_pixels_or_a_share():
    assert crop_sizes(None, [(64, 48, 3)]) == [(64, 48)]
    assert crop_sizes(56, [(64, 64, 3), (60, 60, 1)]) == [(56, 56), (56, 56)]
    assert crop_sizes(0.875, [(64, 48, 3)]) == [(56, 42)]
    with pytest.raises(slhub.RecipeError, match="larger than camera image"):
        crop_sizes(70, [(64, 64, 3)])


def test_crop_and_jitter_are_pure_functions_of_their_numbers():
    frames = torch.arange(2 * 2 * 6 * 5 * 1, dtype=torch.int64).view(2, 2, 6, 5, 1)
    corners = torch.tensor([[0, 0], [2, 1]])
    cut = crop(frames, (4, 3), corners)
    assert cut.shape == (2, 2, 4, 3, 1)
    assert torch.equal(cut[0], frames[0, :, 0:4, 0:3]) and torch.equal(
        cut[1], frames[1, :, 2:6, 1:4]
    )
    centre = crop(frames, (4, 3), None)
    assert torch.equal(centre, crop(frames, (4, 3), torch.tensor([[1, 1], [1, 1]])))
    images = torch.rand(2, 2, 4, 4, 3, generator=torch.Generator().manual_seed(0))
    same = jitter(images, torch.ones(2, 2, dtype=torch.float64))
    torch.testing.assert_close(same, images)
    darker = jitter(images, torch.tensor([[0.5, 1.0], [1.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(darker[0], images[0] * 0.5)
    grey = (images[1] * torch.tensor([0.299, 0.587, 0.114])).sum(-1, keepdim=True)
    torch.testing.assert_close(
        darker[1], grey.mean(dim=(1, 2, 3), keepdim=True).expand_as(darker[1])
    )


def test_augmentation_draws_only_from_the_given_generator(tmp_path, repo, pendulum):
    bc = {"crop": 28, "color_jitter": {"brightness": 0.3, "contrast": 0.3}}
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc=bc)
    plugin, trainer, model = _trainer(recipe)
    assert model.crops == [(28, 28)] and model.encoders[0][0].in_channels == 2 * 3
    before = _streams()
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(3))
    after = _streams()
    assert before[0] == after[0] and np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])  # no process-wide stream was drawn from
    again = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(3))
    other = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(4))
    assert set(batch) >= {"image[0]", "image[0]_crop", "image[0]_jitter", "action"}
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    assert not torch.equal(batch["image[0]_crop"], other["image[0]_crop"])
    corners = batch["image[0]_crop"]
    assert corners.shape == (4, 2) and corners.min() >= 0 and corners.max() <= 32 - 28
    factors = batch["image[0]_jitter"]
    assert factors.shape == (4, 2) and bool(((factors >= 0.7) & (factors <= 1.3)).all())
    with torch.no_grad():
        trained = model(batch)
        assert not torch.equal(trained, model({k: batch[k] for k in ("image[0]", "action")}))


def test_evaluation_sees_the_centre_crop_deterministically(tmp_path, repo, pendulum):
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc={"crop": 0.875})
    plugin, trainer, model = _trainer(recipe)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    plain = {k: v for k, v in batch.items() if not k.endswith(("_crop", "_jitter"))}
    corners = torch.full((4, 2), 2, dtype=torch.int64)  # (32 - 28) // 2 = 2
    centred = dict(plain, **{"image[0]_crop": corners})
    frames = plain["image[0]"]
    # the crop itself moves values only: the centre is exactly the frames at corner (2, 2)
    assert torch.equal(crop(frames, (28, 28), None), crop(frames, (28, 28), corners))
    with torch.no_grad():
        # the convolutions read a strided view in one case and a gathered copy in the
        # other: two computations whose float32 sums may round apart (by ~1e-8 on a CPU
        # without AVX-512), so they agree to float32 precision, not bit for bit
        torch.testing.assert_close(model(centred), model(plain), rtol=1e-5, atol=1e-6)
        first = plugin.validate(trainer=trainer, model=model.eval(), step=1)
        assert plugin.validate(trainer=trainer, model=model, step=2) == first


@pytest.mark.parametrize("ema", [False, True])
def test_resume_is_bit_exact_with_augmentation(tmp_path, repo, pendulum, ema):
    extra = {"ema": {"decay": 0.99}} if ema else {}
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc=AUGMENTED, **extra)
    check = check_resume_and_revalidate(
        recipe, BcPlugin(), stop_at=int(np.random.default_rng().integers(2, 6)),
        workdir=tmp_path / "runs", cwd=repo, in_process=True,
    )  # fmt: skip
    final = check.final("resumed")
    assert (final.ema is not None) == ema


def test_decode_workers_do_not_change_augmented_training(tmp_path, repo, pendulum):
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc=AUGMENTED)
    finals = []
    for workers in (0, 2):
        out = tmp_path / f"workers{workers}"
        slhub.train(recipe, ["data.decode.ahead=2", f"data.decode.workers={workers}",
                             f"trainer.output_dir={out}"])  # fmt: skip
        finals.append(torch.load(out / "last.pt", weights_only=True))
    assert_tree_equal(finals[0]["model"], finals[1]["model"])
    assert_tree_equal(finals[0]["optimizer"], finals[1]["optimizer"])


# ------------------------------------------------------------------ validation.env


def _losses(run: Path) -> list[tuple[int, float]]:
    lines = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["train/loss"]) for r in lines if "train/loss" in r]


def _validations(run: Path) -> dict[int, dict]:
    lines = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r for r in lines if any(k.startswith("validation/") for k in r)}


def test_env_validation_leaves_training_bitwise_unchanged(tmp_path, repo, pendulum):
    """A run validated in the simulator and one without: the same loss at every update and
    bitwise-equal checkpoints at every save; the rollouts are reported and repeat exactly."""
    env = {"env": {"id": ENV, "episodes": 3, "seed": 5, "max_steps": 60}}
    recipe = _recipe(tmp_path, repo, pendulum, "state", validation=env)
    sets = ["trainer.save_every=1", "trainer.validate_every=2"]
    slhub.train(recipe, [*sets, f"trainer.output_dir={tmp_path / 'with'}"])
    plain = ["validation={}", f"trainer.output_dir={tmp_path / 'without'}"]
    slhub.train(recipe, [*sets, *plain])
    assert _losses(tmp_path / "with") == _losses(tmp_path / "without")
    assert len(_losses(tmp_path / "with")) == 6
    for step in range(1, 7):
        a = torch.load(tmp_path / "with" / f"step_{step}.pt", weights_only=True)
        b = torch.load(tmp_path / "without" / f"step_{step}.pt", weights_only=True)
        assert_tree_equal(a["model"], b["model"], f"step {step}")
        assert_tree_equal(a["optimizer"], b["optimizer"], f"step {step}")
        assert_tree_equal(a["ranks"], b["ranks"], f"step {step}")
    validated = _validations(tmp_path / "with")
    assert sorted(validated) == [2, 4, 6]
    record = validated[6]
    assert record["validation/env_episodes"] == 3.0
    assert 1 <= record["validation/env_length"] <= 60
    # v5 rewards every step but a terminating one
    assert record["validation/env_length"] - 1 <= record["validation/env_return"]
    assert record["validation/env_return"] <= record["validation/env_length"]
    assert "validation/env_success" not in record  # InvertedPendulum reports no success
    assert "validation/env_return" not in _validations(tmp_path / "without")[6]
    plugin, trainer, model = _trainer(recipe)
    model.load_state_dict(torch.load(tmp_path / "with" / "last.pt", weights_only=True)["model"])
    with torch.no_grad():
        again = plugin.validate(trainer=trainer, model=model.eval(), step=6)
    assert again["env_return"] == record["validation/env_return"]


def test_best_checkpoint_follows_the_env_return(tmp_path, repo, pendulum):
    env = {"env": {"episodes": 2, "max_steps": 80}}  # the id: the store's collect provenance
    recipe = _recipe(tmp_path, repo, pendulum, "state", validation=env)
    best = "trainer.best={metric: validation/env_return, mode: max}"
    slhub.train(recipe, [best, "trainer.steps=8", "trainer.validate_every=1", "trainer.lr=0.02"])
    returns = {s: r["validation/env_return"] for s, r in _validations(tmp_path / "run").items()}
    assert len(returns) == 8 and len(set(returns.values())) > 1, returns
    chosen = torch.load(tmp_path / "run" / "best.pt", weights_only=True)["step"]
    assert chosen == min(s for s, v in returns.items() if v == max(returns.values())), returns


def test_visual_policy_rolls_out_on_rendered_frames_within_a_time_budget(tmp_path, repo, pendulum):
    env = {"env": {"id": ENV, "episodes": 4, "max_steps": 20, "time_budget_s": 1e-6}}
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc={"crop": 28, "n_action_steps": 2},
                     validation=env)  # fmt: skip
    plugin, trainer, model = _trainer(recipe)
    assert plugin._env.render.name == "fixed" and plugin._env.render.size == 32  # provenance
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
    assert metrics["env_episodes"] == 1.0  # the budget ran out during the first episode
    assert 1 <= metrics["env_length"] <= 20


@pytest.mark.parametrize(
    ("data", "validation", "match"),
    [
        ({"features": {"observation": ["observation", "reward"], "action": ["policy_action"]}},
         {"env": {}}, "reads reward, which a rollout does not record"),
        ({}, {"env": {"id": "gymnasium:Reacher-v5"}}, "has 4 components; gymnasium:Reacher-v5"),
        ({}, {"env": {"id": ENV, "features": {"observation": "qpos"}}}, "has 4 components"),
    ],
)  # fmt: skip
def test_env_validation_refuses_what_it_cannot_simulate_at_build(
    tmp_path, repo, pendulum, data, validation, match
):
    recipe = _recipe(tmp_path, repo, pendulum, "state", validation=validation)
    raw = yaml.safe_load(recipe.read_text())
    raw["data"].update(data)
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(slhub.RecipeError, match=match) as caught:
        _trainer(recipe)
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------ slhub eval


def test_eval_rolls_a_policy_out_and_writes_a_video(tmp_path, repo, pendulum):
    import av
    from slhub import evaluate as run_eval

    recipe = _recipe(tmp_path, repo, pendulum, "state")
    slhub.train(recipe)
    video = tmp_path / "rollout.mp4"
    metrics = run_eval(tmp_path / "run" / "last.pt", env=ENV, episodes=3, steps=25, seed=2,
                       video=video)  # fmt: skip
    assert metrics["env_episodes"] == 3.0 and 1 <= metrics["env_length"] <= 25
    assert "mse" in metrics  # the run's own held-out error as well
    again = run_eval(tmp_path / "run" / "last.pt", env=ENV, episodes=3, steps=25, seed=2)
    assert again == metrics
    with av.open(str(video)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert frames[0].shape == (256, 256, 3) and float(np.mean(frames[0])) > 20  # not black
    with pytest.raises(slhub.RecipeError, match="--video"):
        run_eval(tmp_path / "run" / "last.pt", video=video)


def test_the_command_line_eval_and_a_cropping_export(tmp_path, repo, pendulum, capsys):
    """``slhub eval --env ... --video`` through the parser, and the export of a cropping
    visual policy: it records the crop and acts on whole frames as the checkpoint does."""
    import subprocess
    import sys

    import av
    from slhub.export import load
    from slhub.export.writer import run_export

    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc=AUGMENTED)
    slhub.train(recipe, ["trainer.steps=3"])
    last = tmp_path / "run" / "last.pt"
    video = tmp_path / "eval.mp4"
    done = subprocess.run(
        [sys.executable, "-m", "slhub", "eval", "--checkpoint", str(last), "--env", ENV,
         "--episodes", "2", "--steps", "15", "--video", str(video), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads(done.stdout)
    assert metrics["env_episodes"] == 2.0 and metrics["env_length"] <= 15
    with av.open(str(video)) as container:
        assert sum(1 for _ in container.decode(video=0)) >= 2
    run_export(last, tmp_path / "export")
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert manifest["architecture"]["crop"] == 28
    policy = load(tmp_path / "export")
    plugin, trainer, trained = _trainer(recipe)
    trained.load_state_dict(torch.load(last, weights_only=True)["model"])
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    frames = {k: batch[k] for k in ("image[0]", "action")}
    with torch.no_grad():
        assert torch.equal(policy.act(frames), trained.eval().act(frames))


@pytest.mark.slow
def test_two_gloo_workers_resume_exactly_with_augmentation_ema_and_env_validation(
    tmp_path, repo, pendulum
):
    """Each rank crops with its own generator, rank 0 rolls out: the resumed 2-worker run
    ends bit for bit where the uninterrupted one does."""
    import os

    env = {"env": {"id": ENV, "episodes": 2, "max_steps": 30}}
    recipe = _recipe(tmp_path, repo, pendulum, "visual", bc=AUGMENTED, ema={"decay": 0.99},
                     validation=env)  # fmt: skip
    check = check_resume_and_revalidate(
        recipe, BcPlugin(), stop_at=int(np.random.default_rng().integers(2, 6)),
        workdir=tmp_path / "runs", cwd=repo, workers=2,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert check.final("resumed").world_size == 2
    assert "validation/env_return" in _validations(check.resumed)[6]
