"""scripts/nerd_ablation.py's table: per configuration and measure the mean over seeds
with the smallest and largest, the best mean of each column in bold."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import script_module


def _result(script, value: float) -> dict:
    """One run's actuated validation line and passive evaluation, every figure ``value``."""
    out: dict = {"actuated": {}, "passive": {}}
    for setting, horizons in script.HORIZONS.items():
        for kind in ("selfcontact", "rollout", "baseline", "linear"):
            for measure in script.MEASURES:
                for k in horizons:
                    out[setting][f"{kind}_{measure}_{k}"] = value * k
    return out


def test_figures_keep_every_seed_and_the_table_bolds_the_best_mean():
    script = script_module("nerd_ablation")
    seeds = [_result(script, 1.0), _result(script, 3.0)]
    figures = script.figures(seeds, "selfcontact")
    assert figures["base_position"]["passive_500"] == [500.0, 1500.0]
    assert figures["joint_position"]["actuated_10"] == [10.0, 30.0]
    rows = {
        "body, force": figures,
        "state held": script.figures([_result(script, 0.5)], "baseline"),
    }
    table = script.markdown(rows).splitlines()
    assert len(table) == 2 + len(script.MEASURES) * len(rows)
    body = next(line for line in table if line.startswith("| base position (m) | body, force"))
    held = next(line for line in table if line.startswith("| base position (m) | state held"))
    assert "| 20 (10–30) |" in body and "**" not in body  # mean (smallest–largest)
    assert "| **5** |" in held and "| **50** |" in held and "| **250** |" in held


def test_merge_keeps_every_episode_and_the_first_parts_record(tmp_path):
    pytest.importorskip("mujoco")
    pytest.importorskip("gymnasium")
    from slhub.data import open_dataset
    from slhub.sim import collect

    script = script_module("nerd_ablation")
    parts = [tmp_path / "hopper_smooth", tmp_path / "hopper_zero"]
    kinds = (("smooth", 2, "reset"), ("zero", 1, "random"))
    for part, (actions, episodes, init) in zip(parts, kinds, strict=True):
        collect(part, "gymnasium:Hopper-v5", episodes=episodes, steps=12, actions=actions,
                seed=0, through_termination=True, contacts="force,geometry", init=init)  # fmt: skip
    script.merge(parts, tmp_path / "hopper")
    merged, stores = open_dataset(tmp_path / "hopper"), [open_dataset(p) for p in parts]
    pairs = [(s, i) for s in stores for i in range(s.num_episodes)]
    assert merged.num_episodes == len(pairs) == 3
    for index, (store, source_index) in enumerate(pairs):
        for key in ("qpos", "qvel", "action", "contact", "contact_geometry"):
            got = merged.read(key, index, 0, int(merged.lengths[index]))
            assert np.array_equal(
                got, store.read(key, source_index, 0, int(store.lengths[source_index]))
            )
    assert not merged.read("action", 2, 0, 12).any()  # the zero-action part comes last
    source = json.loads((tmp_path / "hopper" / "meta.json").read_text())["source"]
    first = json.loads((parts[0] / "meta.json").read_text())["source"]
    assert source["env"] == first["env"] == "gymnasium:Hopper-v5"
    assert source["floating_base"] == first["floating_base"] is not None
    assert source["actions"] == "smooth+zero" and source["episodes"] == 3
    assert source["init"] == "reset+random"
    assert [p["actions"] for p in source["parts"]] == ["smooth", "zero"]
