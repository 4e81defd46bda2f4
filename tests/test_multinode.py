"""Past one node: two elastic agents on this machine form one job through the c10d
rendezvous (``--nnodes=2 --nproc-per-node=1``), as two SLURM nodes would, with the
``slhub launch`` command of docs/launch.md's sbatch script (read from the page, so an
edit there changes what runs here). Only global rank 0 writes, each worker's device follows
its LOCAL_RANK, the result equals a single-node two-worker run bit for bit, and a run
preempted at update k resumes across the two "nodes" exactly. Without a shared
filesystem (two workers in different working directories) the rank that cannot see
the checkpoint receives it from rank 0, and one that sees another file is refused."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import (
    REPO,
    assert_same_final_state,
    free_port,
    load,
    metrics_of,
    subprocess_env,
    torchrun_env,
    write_recipe,
)
from slhub.artifacts import is_artifact
from slhub.preemption import EXIT_PREEMPTED
from slhub.testing import STOP_AT_ENV, assert_tree_equal

#: Every test here is slow (cross-process, seconds to minutes): `python -m pytest -m slow`.
pytestmark = pytest.mark.slow

PLUGINS = ["slhub_testplugins:WhereAmI", "slhub.testing:StopAt"]
#: The marker docs/launch.md puts above the sbatch script whose launch command runs here.
MARKER = "<!-- tests/test_multinode.py runs the slhub launch command of this script -->"


def sbatch_launch(values: dict[str, str]) -> list[str]:
    """The ``slhub launch`` command of docs/launch.md's multi-node sbatch script, as an
    argument list, with the script's shell variables replaced by ``values`` (all of them
    must be given) and ``slhub`` by ``python -m slhub``."""
    page = (REPO / "docs" / "launch.md").read_text()
    found = re.search(re.escape(MARKER) + r"\n```bash\n(.*?)```", page, re.S)
    assert found, f"docs/launch.md has no sbatch script below {MARKER}"
    script = found.group(1).replace("\\\n", " ")
    lines = [
        line
        for line in script.splitlines()
        if re.search(r"(^|\s)slhub launch\s", line) and not line.lstrip().startswith("#")
    ]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0], comments=True)
    words = words[words.index("slhub") + 1 :]
    if words[-1] == "&":
        words.pop()

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"docs/launch.md's launch command uses ${name}"
        return values[name]

    expanded = [re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word) for word in words]
    return [sys.executable, "-m", "slhub", *expanded]


def test_the_sbatch_command_is_the_documented_one():
    """What the script's variables stand for here: two agents of one worker each."""
    command = sbatch_launch(
        {"SLURM_JOB_NUM_NODES": "2", "gpus_per_node": "1", "head": "h", "port": "1",
         "SLURM_JOB_ID": "7", "recipe": "r.yaml"}
    )  # fmt: skip
    assert command[3:] == [
        "launch", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=h:1", "--rdzv-id=7", "train", "--config", "r.yaml", "--resume", "auto",
    ]  # fmt: skip


def _agents(recipe: Path, env: dict | None = None) -> list[tuple[int, str]]:
    """Two launchers (elastic agents), one worker each, meeting at a c10d rendezvous on
    loopback, with the sbatch script's command."""
    port = str(free_port())
    command = sbatch_launch(
        {"SLURM_JOB_NUM_NODES": "2", "gpus_per_node": "1", "head": "127.0.0.1", "port": port,
         "SLURM_JOB_ID": f"slhub-test-{port}", "recipe": str(recipe)}
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=subprocess_env(env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(2)
    ]
    return [(p.wait(timeout=180), p.communicate()[1]) for p in procs]


def _state(path: Path) -> dict:
    ckpt = load(path)
    ranks = [{k: v for k, v in entry.items() if k != "where"} for entry in ckpt["ranks"]]
    return {**{k: ckpt[k] for k in ("step", "model", "optimizer", "scheduler")}, "ranks": ranks}


def test_two_nodes_equal_one_node_and_resume_across_nodes(tmp_path: Path):
    def recipe(name: str) -> Path:
        return write_recipe(
            tmp_path / f"{name}.yaml", plugins=PLUGINS, trainer__steps=12,
            trainer__validate_every=4, trainer__save_every=4,
            trainer__output_dir=str(tmp_path / name),
        )  # fmt: skip

    single = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "slhub", "train", "--config", str(recipe("single"))],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-2000:]

    results = _agents(recipe("nodes"))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-2000:]
    nodes = tmp_path / "nodes"
    where = [entry["where"] for entry in load(nodes / "last.pt")["ranks"]]
    assert where == [
        {"rank": 0, "local_rank": 0, "device": "cpu"},
        {"rank": 1, "local_rank": 0, "device": "cpu"},
    ]
    assert sorted(p.name for p in nodes.iterdir() if p.name[0] != ".") == [
        "last.pt", "metrics.jsonl", "run.json", "step_12.pt", "step_4.pt", "step_8.pt",
    ]  # fmt: skip
    assert sum("step_4.pt" in err for _, err in results) == 1  # rank 0 only logs checkpoints
    expected = _state(tmp_path / "single" / "last.pt")
    assert_tree_equal(expected, _state(nodes / "last.pt"))
    assert metrics_of(nodes) == metrics_of(tmp_path / "single")

    stopped = _agents(recipe("resumed"), env={STOP_AT_ENV: "6"})
    assert [rc for rc, _ in stopped] == [EXIT_PREEMPTED] * 2, stopped[0][1][-2000:]
    for _, err in stopped:  # each node's launcher: one line, its workers' preempted line
        lines = [line for line in err.splitlines() if line.startswith("slhub:")]
        assert len(lines) == 1 and "stop signal at update 6:" in lines[0], err[-2000:]
    assert load(tmp_path / "resumed" / "last.pt")["step"] == 6
    again = _agents(recipe("resumed"))
    assert [rc for rc, _ in again] == [0, 0], again[0][1][-2000:]
    assert_tree_equal(expected, _state(tmp_path / "resumed" / "last.pt"))
    assert metrics_of(tmp_path / "resumed") == metrics_of(tmp_path / "single")


def _workers(recipe: Path, cwds: list[Path], env: dict | None = None) -> list[tuple[int, str]]:
    """``slhub train --resume auto`` on two workers (RANK 0 and 1) in the working
    directories ``cwds``: with a relative output_dir, two nodes that share no filesystem
    when the directories differ. Returns ``(exit status, stderr)`` by rank."""
    port = free_port()
    procs = []
    for rank, cwd in enumerate(cwds):
        worker_env = {
            **subprocess_env(env),
            **torchrun_env(rank, 2, port, local_rank=0, per_node=1),
        }
        worker_env["PYTHONPATH"] = f"{REPO}:{worker_env['PYTHONPATH']}"
        command = [sys.executable, "-m", "slhub", "train", "--config", str(recipe)]
        procs.append(
            subprocess.Popen(
                [*command, "--resume", "auto"],
                cwd=cwd,
                env=worker_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return [(p.wait(timeout=120), p.communicate()[1]) for p in procs]


@pytest.fixture(scope="module")
def unshared(tmp_path_factory) -> dict[str, Path]:
    """A recipe with a relative output_dir (``run``), trained uninterrupted in ``full/``
    and, in ``stopped/``, preempted at update 4 (both workers in the same directory)."""
    tmp = tmp_path_factory.mktemp("unshared")
    recipe = write_recipe(
        tmp / "r.yaml", plugins=["slhub.testing:StopAt"], trainer__steps=8,
        trainer__validate_every=4, trainer__save_every=0, trainer__output_dir="run",
    )  # fmt: skip
    for name, stop_at, status in (("full", "", 0), ("stopped", "4", EXIT_PREEMPTED)):
        (tmp / name).mkdir()
        results = _workers(recipe, [tmp / name] * 2, {STOP_AT_ENV: stop_at})
        assert [rc for rc, _ in results] == [status] * 2, results[0][1][-2000:]
    assert load(tmp / "stopped" / "run" / "last.pt")["step"] == 4
    return {"recipe": recipe, "full": tmp / "full" / "run", "stopped": tmp / "stopped"}


def _node(unshared: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """Rank 0's node holding a copy of the stopped run, and an empty second node."""
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(unshared["stopped"], node_a)
    node_b.mkdir()
    return node_a, node_b


def test_a_node_without_the_checkpoint_receives_it_from_rank_0(unshared, tmp_path: Path):
    """Rank 1's working directory has no run/last.pt: it receives rank 0's checkpoint and
    the resumed run ends bit-identical to the uninterrupted one; rank 1 writes nothing."""
    node_a, node_b = _node(unshared, tmp_path)
    results = _workers(unshared["recipe"], [node_a, node_b])
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    assert re.search(r"checkpoint sent .*to_ranks=1\b", results[0][1]), results[0][1][-2000:]
    assert_same_final_state(unshared["full"] / "last.pt", node_a / "run" / "last.pt")
    assert metrics_of(node_a / "run") == metrics_of(unshared["full"])
    assert list(node_b.iterdir()) == []


def test_a_node_with_another_file_at_the_checkpoint_path_is_refused(unshared, tmp_path: Path):
    """Rank 1 sees a file at run/last.pt that is not rank 0's: every rank exits 2 with one
    line; rank 1's names both hosts and both sha256 digests. Nothing is written."""
    node_a, node_b = _node(unshared, tmp_path)
    other = load(node_a / "run" / "last.pt")
    other["step"] = 2
    (node_b / "run").mkdir()
    torch.save(other, node_b / "run" / "last.pt")

    def artifacts_of(folder: Path) -> dict[str, bytes]:  # .slhub.lock records its holder
        return {p.name: p.read_bytes() for p in folder.iterdir() if is_artifact(p.name)}

    before = artifacts_of(node_a / "run")
    results = _workers(unshared["recipe"], [node_a, node_b])
    assert [rc for rc, _ in results] == [2, 2], results[0][1][-2000:] + results[1][1][-2000:]
    lines = [[line for line in err.splitlines() if line.strip()] for _, err in results]
    assert all(len(found) == 1 for found in lines), lines
    assert lines[0][0] == (
        "slhub: error: rank 1 failed during admission (details in that rank's log)"
    )
    digest = [
        hashlib.sha256((n / "run" / "last.pt").read_bytes()).hexdigest() for n in (node_a, node_b)
    ]
    assert lines[1][0].startswith("slhub: error: rank 1 failed during admission: run/last.pt: ")
    assert f"sha256 {digest[1]} here, {digest[0]} on rank 0" in lines[1][0], lines[1][0]
    assert lines[1][0].count(" on host ") == 2
    assert artifacts_of(node_a / "run") == before
