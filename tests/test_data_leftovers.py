"""Data commands clean up after themselves: the ``.DST.tmp-PID`` a SIGKILLed ``slhub data
convert`` or ``collect`` leaves is removed by the next write of DST (never one of a
live process, of another name or of another host), and ``data info``/``check`` refuse,
in one line, a temporary or a dataset missing its format's required metadata.

The kill points are placed from the test: a wrapper replaces a writer's function with
one that ends the process with ``os._exit(137)`` (as a SIGKILL would: no cleanup runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, subprocess_env
from slhub.cli import main
from slhub.data.temporary import WRITER, alive

DATASETS = REPO / "tests" / "data" / "datasets"
ZARR = DATASETS / "replay.zarr"  # 4 episodes, 165 steps, an image; records no fps
PENDULUM = "gymnasium:InvertedPendulum-v5"

#: Runs ``slhub ARGV`` with MODULE.NAME replaced by a kill: after the real call when
#: AFTER is "1" (the temporary is full, only the rename is missing), else instead of it.
KILLER = """
import os, sys, importlib
module, name, after = sys.argv[1:4]
target = importlib.import_module(module)
real = getattr(target, name)
def killed(*args, **kwargs):
    if after == "1":
        real(*args, **kwargs)
    os._exit(137)
setattr(target, name, killed)
from slhub.cli import main
sys.exit(main(sys.argv[4:]))
"""


#: Each kill: the command (DST is ``{out}/data``), where it dies, and whether after the
#: real call. A convert to slhub's store dies with the store full but not renamed; one to
#: LeRobot after info.json, before meta/stats.json (a temporary LeRobot directory); a collect
#: before writing anything into its temporary.
KILLS = {
    "convert-slhub": (["data", "convert", str(ZARR), "{out}/data", "--fps", "125"],
                      "slhub.data.store:_fill", True),
    "convert-lerobot": (["data", "convert", str(ZARR), "{out}/data", "--to", "lerobot",
                         "--fps", "125"], "slhub.data.writers.lerobot:_stats", False),
    "collect": (["data", "collect", "{out}/data", "--env", PENDULUM, "--episodes", "2",
                 "--steps", "20", "--seed", "0"], "slhub.data.store:_fill", False),
}  # fmt: skip


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict[str, tuple[Path, list[str], int]]:
    """Every kill of :data:`KILLS`, run at once: per kill its ``out`` folder, the command
    and the killed process's pid."""
    running = {}
    for case, (template, target, after) in KILLS.items():
        if case == "collect" and not _can_collect():
            continue
        out = tmp_path_factory.mktemp(case) / "out"
        argv = [word.replace("{out}", str(out)) for word in template]
        module, name = target.split(":")
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLER, module, name, "1" if after else "0", *argv],
            cwd=REPO,
            env=subprocess_env({"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running[case] = (out, argv, proc)
    done = {}
    for case, (out, argv, proc) in running.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 137, (case, proc.returncode, err)
        done[case] = (out, argv, proc.pid)  # reaped: no process has the pid now
    return done


def _can_collect() -> bool:
    try:
        import gymnasium  # noqa: F401
        import mujoco  # noqa: F401
    except ImportError:
        return False
    return True


def refusal(capsys, argv: list[str]) -> str:
    """The one stderr line of a refused command (exit 2), after ``slhub: error: ``."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slhub: error: "), captured.err
    assert captured.out == ""
    return lines[0].removeprefix("slhub: error: ")


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------------------ killed writers


@pytest.mark.parametrize(
    ("case", "missing"), [("convert-slhub", None), ("convert-lerobot", "meta/stats.json")]
)
def test_a_killed_convert_leaves_a_temporary_that_the_next_convert_removes(
    killed, capsys, case, missing
):
    out, argv, pid = killed[case]
    stale = out / f".data.tmp-{pid}"
    assert names(out) == [stale.name] and stale.is_dir() and not alive(pid)
    assert (stale / "meta/info.json").is_file() == (case == "convert-lerobot")
    if missing is not None:
        assert not (stale / missing).exists()  # the temporary LeRobot directory

    for command in ("info", "check"):
        line = refusal(capsys, ["data", command, str(stale)])
        assert line == (
            f"{stale}: the temporary of a write of data that did not finish (process "
            f"{pid} is no longer running), not a dataset; write data again (that removes it)"
        )

    assert main(argv) == 0
    assert names(out) == ["data"]  # the stale temporary is gone, and no new one is left
    assert main(["data", "check", str(out / "data")]) == 0


def test_a_killed_collect_leaves_a_temporary_that_the_next_collect_removes(killed):
    if "collect" not in killed:
        pytest.skip("collect needs mujoco and gymnasium")
    out, argv, pid = killed["collect"]
    stale = out / f".data.tmp-{pid}"
    assert names(out) == [stale.name] and stale.is_dir() and not alive(pid)

    assert main(argv) == 0
    assert names(out) == ["data"]
    assert main(["data", "check", str(out / "data")]) == 0


def test_only_this_destinations_temporaries_of_dead_writers_on_this_host_are_removed(
    tmp_path: Path,
):
    out = tmp_path / "out"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        dead_pid = int(dead.stdout)
        assert alive(sleeper.pid) and not alive(dead_pid)
        keep = {
            f".data.tmp-{sleeper.pid}": None,  # a live writer's (this host's)
            f".data.tmp-{os.getpid()}x": None,  # not a temporary's name
            f".other.tmp-{dead_pid}": None,  # another destination's
            f".data.tmp-{dead_pid + 1}": "elsewhere.example\n",  # written on another host
        }
        for name, host in keep.items():
            (out / name).mkdir()
            (out / name / "f000.npy").write_bytes(b"partial")
            if host is not None:
                (out / name / WRITER).write_text(host)
        if alive(dead_pid + 1):
            pytest.skip("the pid after a dead one runs: no foreign-host case to set up")
        (out / f".data.tmp-{dead_pid}").mkdir()  # a dead writer's of this host
        (out / f".data.tmp-{dead_pid}" / "f000.npy").write_bytes(b"partial")

        argv = ["data", "convert", str(ZARR), str(out / "data"), "--fps", "125"]
        assert main(argv) == 0
        assert names(out) == sorted([*keep, "data"])
        assert not (out / "data" / WRITER).exists()  # the marker never reaches a dataset
        for name in keep:
            assert (out / name / "f000.npy").read_bytes() == b"partial"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_live_writers_temporary_is_refused_by_info(tmp_path: Path, capsys):
    folder = tmp_path / f".data.tmp-{os.getpid()}"
    shutil.copytree(DATASETS / "lerobot_v30", folder)
    line = refusal(capsys, ["data", "info", str(folder)])
    assert line == (
        f"{folder}: the temporary of a write of data in progress (process "
        f"{os.getpid()}), not a dataset; open data once it has finished"
    )


# ------------------------------------------------------------------ required metadata


@pytest.mark.parametrize(
    ("source", "required", "version"),
    [
        ("lerobot_v30", "meta/stats.json", "v3.0"),
        ("lerobot_v30_images", "meta/stats.json", "v3.0"),
        ("lerobot_v21", "meta/episodes_stats.jsonl", "v2.1"),
    ],
)
def test_a_lerobot_dataset_without_its_statistics_is_refused(
    tmp_path: Path, capsys, source, required, version
):
    folder = tmp_path / source
    shutil.copytree(DATASETS / source, folder)
    assert main(["data", "info", str(folder)]) == 0
    (folder / required).unlink()
    for command in ("info", "check"):
        line = refusal(capsys, ["data", command, str(folder)])
        assert line == (
            f"{folder}: not a complete LeRobot {version} dataset: {required} is "
            "missing (a convert or recording that did not finish?)"
        )


def test_a_store_without_meta_json_is_refused(tmp_path: Path, capsys):
    folder = tmp_path / "store"
    assert main(["data", "convert", str(ZARR), str(folder), "--fps", "125"]) == 0
    (folder / "meta.json").unlink()
    for argv in (["data", "info", str(folder)], ["data", "check", str(folder)],
                 ["data", "info", str(folder), "--format", "slhub"]):  # fmt: skip
        line = refusal(capsys, argv)
        assert line == (
            f"{folder}: not a complete slhub dataset store: meta.json is missing (a "
            "write that did not finish?)"
        )
