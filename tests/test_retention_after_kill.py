"""Retention is crash-consistent: a kill -9 at any file operation of a boundary that
sets a new best, then ``--resume auto`` to the end, leaves exactly the uninterrupted
run's ``best.pt``, run.json ``best`` and checkpoint files.

The kill points are placed from the test: the extra plugin ``file_op_kills:KillAt``
SIGKILLs rank 0 right before or right after the K-th link, rename or delete in the run
directory. The recipe (ValidationTracker: validate and save every 2 updates,
``keep_last: 1``, ``best`` on ``validation/score``) sets new bests at updates 2, 4 and 10
only, so the boundary of update 4 writes ``last.pt``, ``best.pt`` and ``step_4.pt``,
deletes ``step_2.pt`` and records the best in run.json. Over 8 updates that best is the
run's final one (a best.pt left on update 2 would show); over 10 the last boundary does
the same (a requeue of a finished run must finish it too).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
import warm_processes
from file_op_kills import KILL_AT_ENV, KILL_STEP_ENV, OPS_LOG_ENV

from helpers import (
    REPO,
    assert_same_final_state,
    free_port,
    load,
    subprocess_env,
    torchrun_env,
    write_recipe,
)
from slhub import cli
from slhub.checkpoint import Intent
from slhub.testing import assert_tree_equal

#: ``(update, trainer.steps)``: a boundary that sets the run's final best (the lowest
#: validation/score) and deletes the step_N.pt before it, in the middle and at the end.
NEW_BESTS = ((4, 8), (10, 10))


def _recipe(tmp_path: Path, steps: int) -> Path:
    return write_recipe(
        tmp_path / f"recipe-{steps}.yaml",
        plugin="slhub_testplugins:ValidationTracker",
        plugins=["file_op_kills:KillAt"],
        trainer__steps=steps,
        trainer__validate_every=2,
        trainer__save_every=2,
        trainer__keep_last=1,
        trainer__best={"metric": "validation/score"},
        trainer__batch_size=16,
        trainer__timeout_s=60,
        trainer__output_dir=str(tmp_path / "unused"),
    )


def _args(recipe: Path, out: Path) -> list[str]:
    return ["train", "--config", str(recipe), "--set", f"trainer.output_dir={out}",
            "--resume", "auto", "--log-format", "json"]  # fmt: skip


def _forked(args: list[str], env: dict[str, str]) -> None:
    """A child forked from this (warm) test process: ``env``, then ``slhub ARGS``."""
    os.environ.update(env)
    code = cli.main(args)
    sys.stderr.flush()
    os._exit(code)


def _train(recipe: Path, out: Path, workers: int, env: dict[str, str] | None = None):
    """``slhub train --resume auto`` (the requeue command) on ``workers`` ranks; returns
    each rank's exit status and rank 0's stderr.

    One process runs forked from this test process, which has imported everything
    already (a second each, not the seconds of a fresh interpreter); without ``env`` (a
    resume: no kill plugin armed) it runs in this process itself. Two ranks run as
    processes forked from the warm server (tests/warm_processes.py)."""
    args = _args(recipe, out)
    if workers == 1 and not env:
        return [cli.main(args)], ""
    if workers == 1:
        proc = multiprocessing.get_context("fork").Process(target=_forked, args=(args, env))
        proc.start()
        proc.join(120)
        assert proc.exitcode is not None, "the forked run did not end in 120 s"
        code = proc.exitcode
        return [code if code >= 0 else 128 - code], ""
    port = free_port()
    envs = [
        {**subprocess_env(env), **(torchrun_env(rank, workers, port) if workers > 1 else {})}
        for rank in range(workers)
    ]
    _, results = warm_processes.run(args, envs, REPO, 120)
    return [code for code, _, _ in results], results[0][2]


def _operations(recipe: Path, out: Path, workers: int) -> list[tuple[int, str]]:
    """The uninterrupted run into ``out``; returns its file operations from update 1 on,
    as ``(K, "OP NAME")`` (the K the kill plugin counts)."""
    log = out.parent / f"{out.name}.ops"
    codes, err = _train(recipe, out, workers, {KILL_STEP_ENV: "1", OPS_LOG_ENV: str(log)})
    assert codes == [0] * workers, err[-3000:]
    return list(enumerate(log.read_text().splitlines(), start=1))


def _boundary(operations: list[tuple[int, str]], step: int) -> list[tuple[int, str]]:
    """The operations of the write of update ``step``: every write starts with the link
    it renames onto last.pt."""
    writes: list[list[tuple[int, str]]] = []
    for index, op in operations:
        if op == "link last.pt":
            writes.append([])
        writes[-1].append((index, op))
    (found,) = [w for w in writes if any(op == f"rename step_{step}.pt" for _, op in w)]
    return found


def _kill_points(operations: list[tuple[int, str]], step: int):
    """``(K, when, what)``: right before and right after each operation of the write of
    update ``step``."""
    write = _boundary(operations, step)
    assert [op for _, op in write] == [
        "link last.pt", "rename last.pt", "link best.pt", "rename best.pt",
        f"rename step_{step}.pt", f"delete step_{step - 2}.pt", "rename run.json",
    ]  # fmt: skip
    return [(index, when, op) for index, op in write for when in ("before", "after")]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _assert_same_retention(expected: Path, actual: Path) -> None:
    """best.pt, run.json ``best`` and every file of the run directory are the
    uninterrupted run's; the kept checkpoints hold its state."""
    a, b = load(expected / "best.pt"), load(actual / "best.pt")
    assert b["step"] == a["step"], "best.pt holds another update"
    for key in ("model", "optimizer", "ranks", "retention"):
        assert_tree_equal(a[key], b[key], key)
    best = [json.loads((run / "run.json").read_text())["best"] for run in (expected, actual)]
    assert best[1] == best[0] and best[0]["step"] == a["step"], "run.json best differs"
    assert _files(actual) == _files(expected), "other files in the run directory"
    for name in _files(expected):
        if name.endswith(".pt") and name != "best.pt":
            assert_same_final_state(expected / name, actual / name)


def _check(tmp_path: Path, workers: int) -> None:
    for step, steps in NEW_BESTS:
        recipe = _recipe(tmp_path, steps)
        reference = tmp_path / f"uninterrupted-{steps}"
        operations = _operations(recipe, reference, workers)
        assert json.loads((reference / "run.json").read_text())["best"]["step"] == step
        for index, when, what in _kill_points(operations, step):
            out = tmp_path / f"killed-{step}-{index}-{when}"
            env = {KILL_STEP_ENV: "1", KILL_AT_ENV: f"{index}:{when}"}
            codes, err = _train(recipe, out, workers, env)
            assert codes[0] == 137, (step, when, what, err[-3000:])  # SIGKILL, as placed
            codes, err = _train(recipe, out, workers)
            assert codes == [0] * workers, (step, when, what, err[-3000:])
            try:
                _assert_same_retention(reference, out)
            except AssertionError as exc:
                raise AssertionError(f"kill {when} {what} of update {step}: {exc}") from None


def test_a_kill_at_any_file_operation_of_a_new_best_leaves_the_uninterrupted_retention(
    tmp_path: Path,
):
    _check(tmp_path, workers=1)


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_the_same_on_two_gloo_workers(tmp_path: Path):
    _check(tmp_path, workers=2)


@pytest.mark.parametrize(
    "intent",
    [
        {"names": ["../x.pt"], "removes": []},
        {"names": ["/tmp/x.pt"], "removes": []},
        {"names": [".slhub.lock"], "removes": []},
        {"names": "last.pt", "removes": []},
        {"names": ["last.pt"], "removes": [-1]},
        {"names": ["last.pt"], "removes": [True]},
    ],
)
def test_an_intent_naming_a_path_out_of_the_run_directory_is_refused(intent):
    """A resume writes the names a checkpoint's intent lists: only plain file names."""
    with pytest.raises((ValueError, TypeError)):
        Intent.from_dict(intent)
    assert Intent.from_dict({"names": ["last.pt", "best.pt"], "removes": [2]}) == Intent(
        ("last.pt", "best.pt"), (2,)
    )
