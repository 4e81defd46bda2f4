"""Unit tests of the rigidformer plugin, calling its hooks with a stand-in trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from slhub import LossResult
from slhub.testing import build, check_resume_and_revalidate, hooks_of

from slhub_rigidformer.plugin import RigidFormerPlugin, RigidFormerSection
from slhub_rigidformer.scenes import simulate

SMALL = {"scenes": {"train_scenes": 24, "val_scenes": 4, "steps": 12}, "model": {"width": 32}}


def _built(make_trainer, batch_size=8, **changes):
    section = RigidFormerSection.model_validate({**SMALL, **changes})
    plugin, trainer = RigidFormerPlugin(), make_trainer(section, batch_size)
    return plugin, trainer, build(trainer, plugin)  # torch seeded as the loop seeds it


def test_scenes_have_uneven_counts_and_zero_padding():
    scenes = simulate(64, steps=20, seed=0, min_objects=1, max_objects=6)
    assert scenes.corners.shape == (64, 21, 6, 4, 2)
    assert set(scenes.counts.tolist()) == set(range(1, 7))
    valid = scenes.valid()
    assert not scenes.corners[~valid[:, None].repeat(21, 1)].any()  # padded slots hold zeros


def test_boxes_stay_above_ground_and_fall_freely_in_the_air():
    dt, g = 0.05, 9.8
    scenes = simulate(32, steps=40, seed=1, dt=dt, gravity=g)
    corners = scenes.corners.swapaxes(1, 2)[scenes.valid()].astype(np.float64)  # [obj, T+1, 4, 2]
    assert corners[..., 1].min() >= -1e-5
    centre_y = corners[..., 1].mean(-1)
    airborne = (corners[:, :-2, :, 1].min(-1) > 0.5) & (corners[:, 2:, :, 1].min(-1) > 0.5)
    accel = np.diff(centre_y, n=2, axis=1) / dt**2
    assert airborne.sum() > 100
    np.testing.assert_allclose(accel[airborne], -g, atol=1e-2)
    # Bounces happen: some boxes move up again after touching the ground.
    assert (np.diff(centre_y, axis=1) > 0).any()


def test_min_objects_above_max_is_refused():
    with pytest.raises(ValidationError, match="min_objects"):
        RigidFormerSection(scenes={"min_objects": 4, "max_objects": 3})


def test_padded_slots_do_not_change_valid_predictions(make_trainer):
    plugin, trainer, model = _built(make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    assert not batch["valid"].all()
    with torch.no_grad():
        pred = model(batch["features"], batch["valid"])
        noisy = batch["features"].clone()
        noisy[~batch["valid"]] = 123.0
        other = model(noisy, batch["valid"])
    valid = batch["valid"]
    torch.testing.assert_close(pred[valid], other[valid], rtol=0, atol=1e-5)


def test_objects_are_a_set(make_trainer):
    plugin, trainer, model = _built(make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(1))
    perm = torch.randperm(batch["valid"].shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = model(batch["features"], batch["valid"])
        shuffled = model(batch["features"][:, perm], batch["valid"][:, perm])
    valid = batch["valid"][:, perm]
    torch.testing.assert_close(shuffled[valid], pred[:, perm][valid], rtol=0, atol=1e-5)


def test_loss_is_a_mean_over_valid_objects_only(make_trainer):
    plugin, trainer, model = _built(make_trainer, batch_size=16)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(2))
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert isinstance(result, LossResult)
    valid = batch["valid"]
    assert result.weight == int(valid.sum()) * 8
    err = model(batch["features"], valid) - model.normalize_targets(batch["targets"])
    torch.testing.assert_close(result.loss, err[valid].square().mean())
    # A change to a padded slot's target changes nothing.
    targets = batch["targets"].clone()
    targets[~valid] = 1e6
    again = plugin.objective(trainer=trainer, model=model, batch={**batch, "targets": targets})
    assert torch.equal(again.loss, result.loss)


def test_sample_is_a_function_of_the_generator(make_trainer):
    plugin, trainer, _ = _built(make_trainer, batch_size=5)
    hooks = hooks_of(plugin)  # called as the loop calls it, at two different updates
    a = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(3), step=1)
    b = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(3), step=2)
    assert a["features"].shape == (5, 6, 16) and a["targets"].shape == (5, 6, 8)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_validate_and_float64(make_trainer):
    plugin, trainer, model = _built(make_trainer, precision="float64")
    assert all(p.dtype == torch.float64 for p in model.parameters())
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
    assert set(metrics) == {"mse"} and np.isfinite(metrics["mse"])


# ------------------------------------------------------------------ the example recipe


def test_example_recipe_resumes_bit_exactly(tmp_path, repo):
    """examples/rigidformer/boxes.yaml, made tiny, stopped after update 2 and resumed on one
    process, ends bit for bit where the uninterrupted run ends (model, optimizer, every
    rank's state); the checkpoint is this package's model and logs its validation."""
    check_resume_and_revalidate(
        repo / "examples/rigidformer/boxes.yaml",
        RigidFormerPlugin(),
        stop_at=2,
        workdir=tmp_path,
        workers=1,
        in_process=True,
        cwd=repo,
        overrides=[
            "trainer.steps=4",
            "trainer.batch_size=8",
            "trainer.validate_every=2",
            "trainer.save_every=2",
            "trainer.device=cpu",
            "rigidformer.scenes.train_scenes=16",
            "rigidformer.scenes.val_scenes=4",
            "rigidformer.scenes.steps=10",
            "rigidformer.model.width=16",
            "rigidformer.model.heads=2",
            "rigidformer.model.layers=1",
            "rigidformer.model.ff=32",
        ],
    )
