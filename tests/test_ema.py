"""The recipe's ``ema`` section: the moving average of the trained parameters.

- The average is the recurrence ``ema = ema * d + w * (1 - d)`` over the weights each
  update committed, exactly (``torch.equal`` against the same arithmetic by hand), and
  the power schedule's decay is diffusion_policy's formula.
- Validation sees the averaged weights; training never does: a run with EMA trains the
  same weights, bit for bit, as one without at every update.
- The average and its warm-up counter are checkpointed, and a stop at any update
  resumes bit-exact (one process and two Gloo workers); resuming across a change of
  the section, or an EMA run from a checkpoint without one, is refused in one line.
- Export writes the averaged weights as the model's and records that it did.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from ema_probe import RECORD
from torch import nn

from examples.sl_ddp.plugin import SlDdpPlugin, masked_mse
from helpers import REPO, metrics_of, subprocess_env, warm_launcher, write_recipe
from slhub import checkpoint, train
from slhub.ema import Ema
from slhub.errors import CheckpointError, RecipeError
from slhub.export.writer import run_export
from slhub.recipe import EmaSection, as_recipe, recipe_digest
from slhub.testing import (
    StandInTrainer,
    assert_tree_equal,
    build,
    check_resume_and_revalidate,
    check_resume_exact,
)

POWER = {"power": 0.75, "inv_gamma": 2.0, "min_decay": 0.3, "max_decay": 0.95}


def _recipe(tmp_path: Path, name: str = "ema.yaml", **changes: Any) -> Path:
    base = {
        "plugin": "ema_probe:EmaProbe",
        "trainer__steps": 12,
        "trainer__validate_every": 3,
        "trainer__save_every": 6,
        "trainer__batch_size": 16,
        "trainer__output_dir": str(tmp_path / "unused"),
    }
    return write_recipe(tmp_path / name, **{**base, **changes})


def _power_decay(done: int, power: float, inv_gamma: float, lo: float, hi: float, after: int):
    """diffusion_policy's ``EMAModel.get_decay(done)``, written out from its formula."""
    s = max(0, done - after - 1)
    if s <= 0:
        return 0.0
    return max(lo, min(1 - (1 + s / inv_gamma) ** -power, hi))


# ------------------------------------------------------------------ the section


def test_power_schedule_values_equal_the_formula():
    section = EmaSection(**POWER, update_after_step=3)
    for done in range(60):
        assert section.decay_after(done) == _power_decay(done, 0.75, 2.0, 0.3, 0.95, 3), done
    assert [section.decay_after(n) for n in range(5)] == [0.0] * 5  # warm-up copies, no floor
    assert section.decay_after(5) == 0.3  # 1 - 1.5 ** -0.75 = 0.26, raised to the floor
    assert section.decay_after(6) == 1 - 2.0**-0.75
    assert section.decay_after(10**6) == 0.95  # the ceiling


def test_power_schedule_reaches_the_decays_crowsonkb_quotes():
    """gamma 1, power 2/3: 0.999 after about 31.6K updates, 0.9999 after about 1M."""
    section = EmaSection(power=2 / 3, max_decay=1.0)
    assert section.decay_after(31_623 + 1) == pytest.approx(0.999, abs=1e-6)
    assert section.decay_after(10**6 + 1) == pytest.approx(0.9999, abs=1e-7)


def test_a_constant_decay_is_the_same_at_every_update():
    section = EmaSection(decay=0.9)
    assert {section.decay_after(n) for n in range(20)} == {0.9}


@pytest.mark.parametrize(
    ("ema", "message"),
    [
        ({}, "set either decay (a constant) or power (the warm-up schedule), not neither"),
        ({"decay": 0.9, "power": 1.0}, "not both"),
        ({"decay": 0.9, "inv_gamma": 2.0}, "inv_gamma apply to the power schedule only"),
        ({"power": 1.0, "min_decay": 0.5, "max_decay": 0.4}, "min_decay 0.5 exceeds max_decay"),
        ({"decay": 1.0}, "ema.decay: must be < 1"),
        ({"power": 0}, "ema.power: must be > 0"),
        ({"decay": 0.9, "typo": 1}, "ema.typo"),
    ],
)
def test_a_bad_section_is_refused_in_one_line(ema, message):
    with pytest.raises(RecipeError) as caught:
        as_recipe({"plugin": "p", "trainer": _trainer(), "ema": ema})
    text = str(caught.value)
    assert "\n" not in text and message in text, text
    assert text.startswith("recipe: ema"), text


def _trainer() -> dict[str, Any]:
    return {"steps": 4, "batch_size": 2, "lr": 0.1, "output_dir": "out"}


def test_no_section_changes_nothing_a_run_records():
    """Absent and null are the same recipe as before EMA existed: same mapping, same digest."""
    plain = {"plugin": "p", "trainer": _trainer()}
    recorded = as_recipe(plain).to_dict()
    assert "ema" not in recorded and as_recipe({**plain, "ema": None}).to_dict() == recorded
    assert as_recipe(plain).ema is None
    with_ema = as_recipe({**plain, "ema": {"decay": 0.5}}).to_dict()
    assert with_ema["ema"]["decay"] == 0.5 and recipe_digest(with_ema) != recipe_digest(recorded)


# ------------------------------------------------------------ the average itself


def test_the_average_is_the_recurrence_done_by_hand():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)  # frozen: not averaged, used as it is
    ema = Ema(model, EmaSection(**POWER, update_after_step=1))
    expected = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    assert set(ema.weights) == set(expected) and "0.bias" not in ema.weights
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    for done in range(6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update()
        decay = _power_decay(done, 0.75, 2.0, 0.3, 0.95, 1)
        for name, p in model.named_parameters():
            if name in expected:
                expected[name] = expected[name] * decay + p.detach() * (1 - decay)
        for name, value in expected.items():
            assert torch.equal(ema.weights[name], value), (done, name)
    assert ema.step == 6
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())  # not averaged


def test_the_swap_puts_the_average_in_and_the_trained_weights_back_bit_for_bit():
    torch.manual_seed(1)
    model = nn.Linear(5, 3)
    ema = Ema(model, EmaSection(decay=0.5))
    with torch.no_grad():
        model.weight.mul_(3.0)
    ema.update()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped_in():
        assert all(torch.equal(p, ema.weights[n]) for n, p in model.named_parameters())
        assert not torch.equal(model.weight, trained["weight"])
        saved = ema.trained_state_dict(model)  # what trainer.save() from validate writes
        assert all(torch.equal(saved[k], v) for k, v in trained.items())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in trained.items())
    with pytest.raises(RuntimeError, match="boom"), ema.swapped_in():
        raise RuntimeError("boom")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in trained.items())


def test_a_tied_parameter_is_averaged_once_under_every_name():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    ema = Ema(model, EmaSection(decay=0.5))
    assert ema.names == (("0.weight", "1.weight"),)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    ema.update()
    assert torch.equal(ema.weights["0.weight"], ema.weights["1.weight"])
    with ema.swapped_in():
        assert torch.equal(model[1].weight, ema.weights["1.weight"])


def test_loading_weights_of_another_model_is_refused_in_one_line():
    ema = Ema(nn.Linear(2, 2), EmaSection(decay=0.5))
    with pytest.raises(CheckpointError, match=r"unexpected: extra; missing: bias"):
        ema.load(3, {"weight": torch.zeros(2, 2), "extra": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=r"EMA weight weight is float64 \[2, 2\]"):
        ema.load(3, {"weight": torch.zeros(2, 2, dtype=torch.float64), "bias": torch.zeros(2)})


# ------------------------------------------------------------------ in the loop


def test_validation_sees_the_average_the_hand_recurrence_gives(tmp_path: Path):
    ema = {**POWER, "update_after_step": 2}
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, ema=ema)
    train(recipe, [f"trainer.output_dir={out}"])
    seen = RECORD[str(out)]
    section = EmaSection(**ema)
    average = dict(seen["initial"])
    for step in range(1, 13):
        decay = section.decay_after(step - 1)
        weights = seen["trained"][step]
        average = {n: average[n] * decay + weights[n] * (1 - decay) for n in average}
        if step % 3 == 0:
            validated = seen["validated"][step]
            assert all(torch.equal(validated[n], average[n]) for n in average), step
            trained = all(torch.equal(validated[n], weights[n]) for n in weights)
            assert trained == (step <= 3), step  # the warm-up copies the weights
    final = checkpoint.load(out / "last.pt")
    assert final.ema is not None and final.ema.step == 12
    assert all(torch.equal(final.ema.weights[n], average[n]) for n in average)
    assert all(torch.equal(final.model[n], seen["trained"][12][n]) for n in average)
    assert final.to_dict()["ema"]["step"] == 12


def test_ema_never_changes_what_training_computes(tmp_path: Path):
    """Bitwise-equal trained weights at every update, the swap at each validation included."""
    recipe = _recipe(tmp_path, trainer__validate_every=2)
    plain, averaged = tmp_path / "plain", tmp_path / "averaged"
    train(recipe, [f"trainer.output_dir={plain}"])
    train(recipe, [f"trainer.output_dir={averaged}", "ema.decay=0.8"])
    a, b = RECORD[str(plain)]["trained"], RECORD[str(averaged)]["trained"]
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert all(torch.equal(a[step][n], b[step][n]) for n in a[step]), step
    first, second = checkpoint.load(plain / "last.pt"), checkpoint.load(averaged / "last.pt")
    assert first.ema is None and "ema" not in first.to_dict() and second.ema is not None
    for key in ("model", "optimizer", "ranks"):
        assert_tree_equal(getattr(first, key), getattr(second, key), key)


def test_save_from_validate_writes_the_trained_weights_and_the_average(tmp_path: Path):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, plugin="ema_probe:SavesFromValidate", ema__decay=0.7)
    train(recipe, [f"trainer.output_dir={out}"])
    seen = RECORD[str(out)]
    saved = checkpoint.load(out / "from_validate_9.pt")
    assert saved.step == 9 and saved.ema is not None
    assert all(torch.equal(saved.model[n], t) for n, t in seen["trained"][9].items())
    assert all(torch.equal(saved.ema.weights[n], t) for n, t in seen["validated"][9].items())


def test_best_is_picked_by_the_averaged_weights_validation(tmp_path: Path):
    out = tmp_path / "run"
    best = {"metric": "validation/mse", "mode": "min"}
    train(_recipe(tmp_path, ema__decay=0.9, trainer__best=best), [f"trainer.output_dir={out}"])
    chosen = checkpoint.load(out / "best.pt")
    model = SlDdpPlugin()
    stand_in = StandInTrainer(model, {}, steps=12, batch_size=16, lr=1e-3)
    net = build(stand_in, model)
    net.load_state_dict(chosen.evaluation_weights)
    logged = {r["step"]: r["validation/mse"] for r in metrics_of(out) if "validation/mse" in r}
    x, y, mask = model.validation_corpus
    with torch.no_grad():
        assert float(masked_mse(net.eval()(x), y, mask)[0]) == logged[chosen.step]
    assert logged[chosen.step] == min(logged.values())


# --------------------------------------------------------------------- resume


def _stops(count: int, steps: int) -> list[int]:
    """Random updates to stop at (2 .. steps - 1), drawn from a fixed seed: reproducible."""
    draw = random.Random(23)
    return sorted(draw.sample(range(2, steps), count))


@pytest.mark.parametrize("stop_at", _stops(2, 12))
def test_a_stop_at_a_random_update_resumes_bit_exact(tmp_path: Path, stop_at: int):
    """Model, optimizer, every rank's state and the EMA weights and counter, ``torch.equal``;
    the validations after the stop, computed from the average, reproduce as well."""
    recipe = _recipe(
        tmp_path, plugin="examples.sl_ddp.plugin:SlDdpPlugin", ema={**POWER, "update_after_step": 3}
    )
    check = check_resume_and_revalidate(
        recipe, SlDdpPlugin(), stop_at=stop_at, workdir=tmp_path, in_process=True, rel_tol=0.0,
        abs_tol=0.0,
    )  # fmt: skip
    final = check.final("resumed")
    assert final.ema is not None and final.ema.step == 12
    assert check.final("stopped").ema.step == stop_at


def test_two_gloo_workers_resume_bit_exact(tmp_path: Path):
    """Fast two-worker case: every rank averages alike; rank 0's average is checkpointed."""
    (stop_at,) = _stops(1, 6)
    recipe = _recipe(
        tmp_path, plugin="examples.sl_ddp.plugin:SlDdpPlugin", trainer__steps=6,
        trainer__validate_every=2, trainer__save_every=0, ema={**POWER, "update_after_step": 1},
    )  # fmt: skip
    check = check_resume_exact(
        recipe, stop_at=stop_at, workdir=tmp_path, workers=2, cwd=REPO, env=subprocess_env(),
        launcher=warm_launcher,
    )  # fmt: skip
    final = check.final("resumed")
    assert final.world_size == 2 and final.ema is not None and final.ema.step == 6


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_resuming_across_a_change_of_the_section_is_refused(tmp_path: Path):
    recipe = _recipe(tmp_path, trainer__steps=4)
    plain, averaged = tmp_path / "plain", tmp_path / "averaged"
    train(recipe, [f"trainer.output_dir={plain}", "trainer.save_every=2"])
    train(recipe, [f"trainer.output_dir={averaged}", "trainer.save_every=2", "ema.decay=0.9"])
    cases = [
        (plain, ["ema.decay=0.9"], "ema (absent -> {"),
        (averaged, ["ema.decay=0.8"], "ema.decay (0.9 -> 0.8)"),
        (averaged, [], "ema ({"),
    ]
    for i, (run, sets, change) in enumerate(cases):
        with pytest.raises(CheckpointError) as caught:
            train(recipe, [f"trainer.output_dir={tmp_path / f'r{i}'}", "trainer.save_every=2",
                           "trainer.steps=6", *sets], resume=run / "step_2.pt")  # fmt: skip
        text = _one_line(caught)
        assert "recipe differs from the checkpoint's" in text and change in text, text


def test_an_ema_run_from_a_v1_checkpoint_is_refused(tmp_path: Path):
    """A v1 file's recipe is not compared; the checkpoint component still refuses it."""
    recipe = _recipe(tmp_path, trainer__steps=4)
    plain = tmp_path / "plain"
    train(recipe, [f"trainer.output_dir={plain}"])
    v1 = tmp_path / "v1.pt"
    torch.save(checkpoint.load(plain / "last.pt").to_v1(), v1)
    with pytest.raises(CheckpointError) as caught:
        train(recipe, [f"trainer.output_dir={tmp_path / 'r'}", "trainer.steps=6",
                       "ema.decay=0.9"], resume=v1)  # fmt: skip
    assert "holds no EMA weights and this recipe has an ema section" in _one_line(caught)


def test_a_damaged_ema_entry_is_refused_in_one_line(tmp_path: Path):
    out = tmp_path / "run"
    train(_recipe(tmp_path, trainer__steps=3, ema__decay=0.5), [f"trainer.output_dir={out}"])
    data = torch.load(out / "last.pt", weights_only=True)
    data["ema"]["step"] = -1
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"damaged v2 checkpoint \(ema.step is -1"):
        checkpoint.load(tmp_path / "bad.pt")


# --------------------------------------------------------------------- export


def test_export_writes_the_average_as_the_weights_and_records_it(tmp_path: Path):
    out = tmp_path / "run"
    train(_recipe(tmp_path, ema__decay=0.9), [f"trainer.output_dir={out}"])
    ckpt = checkpoint.load(out / "last.pt")
    exported = run_export(out / "last.pt", tmp_path / "export", plugin="ema_probe:EmaProbe")
    weights = torch.load(exported.path / "weights.pt", weights_only=True)
    assert set(weights) == set(ckpt.model)
    assert all(torch.equal(weights[n], t) for n, t in ckpt.ema.weights.items())
    assert not all(torch.equal(weights[n], ckpt.model[n]) for n in ckpt.ema.weights)
    manifest = json.loads((exported.path / "export.json").read_text())
    assert manifest["kind"] == "ema-probe"
    assert manifest["averaged_weights"] == {"updates": 12, "ema": ckpt.recipe["ema"]}


def test_export_without_ema_is_unchanged(tmp_path: Path):
    out = tmp_path / "run"
    train(_recipe(tmp_path, trainer__steps=3), [f"trainer.output_dir={out}"])
    exported = run_export(out / "last.pt", tmp_path / "export", plugin="ema_probe:EmaProbe")
    weights = torch.load(exported.path / "weights.pt", weights_only=True)
    model = checkpoint.load(out / "last.pt").model
    assert all(torch.equal(weights[n], t) for n, t in model.items())
    assert "averaged_weights" not in json.loads((exported.path / "export.json").read_text())


def test_a_nerd_export_of_an_ema_run_loads_and_predicts_with_the_average(tmp_path: Path):
    """The record of the average has its own key: NeRD's manifest names its weights file
    under ``weights``, which the record must not replace (the export would not load)."""
    from slhub.export import load

    recipe = write_recipe(
        tmp_path / "nerd.yaml", base=REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml",
        trainer__steps=4, trainer__validate_every=2, trainer__save_every=2,
        trainer__batch_size=8, trainer__device="cpu", trainer__output_dir=str(tmp_path / "run"),
        model__width=16, model__layers=1, model__heads=2, model__mlp_hidden=32, model__history=4,
        data__cache_dir=str(tmp_path / "cache"), validation__horizons=[2],
        data__generated_train={"num_trajectories": 8, "length": 20, "seed": 0},
        data__generated_validation={"num_trajectories": 2, "length": 12, "seed": 1},
        ema={"decay": 0.5},
    )  # fmt: skip
    train(recipe)
    ckpt = checkpoint.load(tmp_path / "run" / "last.pt")
    run_export(tmp_path / "run" / "last.pt", tmp_path / "export")
    predictor = load(tmp_path / "export")
    state = predictor.model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in ckpt.ema.weights.items())
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert (
        manifest["weights"] == "model.safetensors" and manifest["averaged_weights"]["updates"] == 4
    )
