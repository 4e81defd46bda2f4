"""scripts/nerd_ablation.py's table: per configuration and measure the mean over seeds
with the smallest and largest, the best mean of each column in bold."""

from __future__ import annotations

from helpers import script_module


def _result(script, value: float) -> dict:
    """One run's actuated validation line and passive evaluation, every figure ``value``."""
    out: dict = {"actuated": {}, "passive": {}}
    for setting, horizons in (("passive", script.PASSIVE_HORIZONS),
                              ("actuated", script.ACTUATED_HORIZONS)):  # fmt: skip
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
