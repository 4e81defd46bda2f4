"""Past one node: two torchrun agents on this machine form one job through the c10d
rendezvous (``--nnodes=2 --nproc-per-node=1``), as two SLURM nodes would. Only global
rank 0 writes, each worker's device follows its LOCAL_RANK, the result equals a
single-node two-worker run bit for bit, and a run preempted at update k resumes across
the two "nodes" exactly. docs/launch.md's sbatch script runs the same command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, free_port, load, metrics_of, subprocess_env, write_recipe
from slhub.preemption import EXIT_PREEMPTED
from slhub.testing import STOP_AT_ENV, assert_tree_equal

PLUGINS = ["slhub_testplugins:WhereAmI", "slhub.testing:StopAt"]


def _agents(recipe: Path, *extra: str, env: dict | None = None) -> list[tuple[int, str]]:
    """Two torchrun agents, one worker each, meeting at a c10d rendezvous on loopback."""
    endpoint = f"127.0.0.1:{free_port()}"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={endpoint}",
        "-m", "slhub", "train", "--config", str(recipe), *extra,
    ]  # fmt: skip
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
    assert sum("checkpoint" in err and "path=" in err for _, err in results) == 1  # rank 0 only
    expected = _state(tmp_path / "single" / "last.pt")
    assert_tree_equal(expected, _state(nodes / "last.pt"))
    assert metrics_of(nodes) == metrics_of(tmp_path / "single")

    stopped = _agents(recipe("resumed"), "--resume", "auto", env={STOP_AT_ENV: "6"})
    assert all(rc != 0 for rc, _ in stopped)
    assert any("stop signal at update 6:" in err for _, err in stopped)
    assert any(f"exitcode: {EXIT_PREEMPTED}" in err for _, err in stopped)
    assert load(tmp_path / "resumed" / "last.pt")["step"] == 6
    again = _agents(recipe("resumed"), "--resume", "auto")
    assert [rc for rc, _ in again] == [0, 0], again[0][1][-2000:]
    assert_tree_equal(expected, _state(tmp_path / "resumed" / "last.pt"))
    assert metrics_of(tmp_path / "resumed") == metrics_of(tmp_path / "single")


def test_a_node_that_cannot_see_the_checkpoint_fails_every_rank(tmp_path: Path):
    """Two workers whose working directories differ, as two nodes without a shared
    filesystem: under --resume auto only rank 0 finds last.pt. Both refuse at admission."""
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    node_a.mkdir()
    node_b.mkdir()
    recipe = write_recipe(
        tmp_path / "r.yaml", plugins=["slhub.testing:StopAt"], trainer__steps=6,
        trainer__save_every=0, trainer__output_dir="run",
    )  # fmt: skip

    def workers(cwds: list[Path], env: dict) -> list[tuple[int, str]]:
        port = str(free_port())
        procs = []
        for rank, cwd in enumerate(cwds):
            worker_env = subprocess_env(env)
            worker_env.update(
                RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                PYTHONPATH=f"{REPO}:{worker_env['PYTHONPATH']}",
            )  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "slhub",
                        "train",
                        "--config",
                        str(recipe),
                        "--resume",
                        "auto",
                    ],
                    cwd=cwd,
                    env=worker_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
            )
        return [(p.wait(timeout=120), p.communicate()[1]) for p in procs]

    stopped = workers([node_a, node_a], {STOP_AT_ENV: "4"})
    assert [rc for rc, _ in stopped] == [EXIT_PREEMPTED] * 2, stopped[0][1][-2000:]
    refused = workers([node_a, node_b], {})
    assert [rc for rc, _ in refused] == [2, 2], refused[0][1][-2000:]
    assert "rank 1 failed during admission" in refused[0][1]
    assert "rank 1 starts at update 0 but rank 0 at update 4" in refused[1][1]
    assert load(node_a / "run" / "last.pt")["step"] == 4  # nothing written by the refusal
    assert not (node_b / "run").exists()
