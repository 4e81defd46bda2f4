"""``slhub data convert SRC DST --to lerobot`` from every format of the reference pack:
read back through slhub's LeRobot reader, every vector equals the source's element for
element and every frame is close (H.264); the fps is the source's or ``--fps``; each
step keeps its task (LeRobot's own files, with two tasks); a missing or bad fps is one
line, exit 2, and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, cli_error
from slhub import cli
from slhub.data import open_dataset
from slhub.data.episodes import ArrayEpisodes, EpisodeDataset
from slhub.data.writers.lerobot import BOOKKEEPING, write_lerobot

REFERENCE = REPO / "tests" / "data" / "datasets"
#: The reference pack's formats that record no fps (converted with ``--fps 125``).
NO_FPS = ("minari_hdf5", "minari_arrow", "robomimic.hdf5", "replay.zarr", "replay_v3.zarr",
          "nerd_trajectories.hdf5")  # fmt: skip
LEROBOT = ("lerobot_v30", "lerobot_v30_images", "lerobot_v21")
#: slhub stores made from the pack: one without an fps, one with LeRobot's fps and tasks.
STORES = {"store_of_robomimic": "robomimic.hdf5", "store_of_lerobot_v30": "lerobot_v30"}
FPS = 125
TASK = "hop forward with uniform random torques"


def convert(*args: str) -> None:
    assert cli.main(["data", "convert", *map(str, args)]) == 0


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stores")
    for name, source in STORES.items():
        convert(REFERENCE / source, folder / name)
    return {name: folder / name for name in STORES}


def source_of(name: str, stores: dict[str, Path]) -> Path:
    return stores[name] if name in STORES else REFERENCE / name


def tasks_of(dataset: EpisodeDataset, episode: int) -> list[str]:
    """Each step's task; a source without tasks gets its folder name from the writer."""
    tasks = dataset.episode_tasks(episode)
    if tasks is None:
        return [Path(dataset.path).name] * int(dataset.lengths[episode])
    return [str(t) for t in tasks]


def assert_reads_back_equal(source: EpisodeDataset, back: EpisodeDataset) -> None:
    assert back.format == "lerobot" and back.fps == FPS
    assert json.loads((back.path / "meta" / "info.json").read_text())["fps"] == FPS
    assert back.lengths.tolist() == source.lengths.tolist()
    for split, episodes in source.splits.items():
        assert back.splits[split] == episodes, split
    assert set(source.features) | set(BOOKKEEPING) == set(back.features)
    start = 0
    for episode, length in enumerate(int(n) for n in source.lengths):
        mine, theirs = source.episode(episode), back.episode(episode)
        for name, values in mine.items():
            spec = source.features[name]
            if spec.is_image:  # through H.264 video: close, as the writer's own tests hold it
                error = np.abs(values.astype(np.int64) - theirs[name].astype(np.int64))
                assert theirs[name].shape == values.shape and error.mean() < 3.0, name
                continue
            assert theirs[name].dtype == values.dtype, name
            assert np.array_equal(theirs[name].reshape(values.shape), values), name
            if name not in BOOKKEEPING:
                assert back.features[name].names == spec.names, name
        steps = np.arange(length)
        assert np.array_equal(theirs["frame_index"].reshape(-1), steps)
        assert np.array_equal(theirs["episode_index"].reshape(-1), np.full(length, episode))
        assert np.array_equal(theirs["index"].reshape(-1), start + steps)
        assert np.array_equal(theirs["timestamp"].reshape(-1), (steps / FPS).astype(np.float32))
        assert tasks_of(back, episode) == tasks_of(source, episode)
        start += length


@pytest.mark.parametrize("name", [*LEROBOT, *NO_FPS, *STORES])
def test_every_reference_format_converts_to_lerobot_equal_to_its_source(
    name: str, stores: dict[str, Path], tmp_path: Path
):
    source = open_dataset(source_of(name, stores))
    assert (source.fps is None) == (name in (*NO_FPS, "store_of_robomimic"))
    given = ["--fps", str(FPS)] if source.fps is None or name == "lerobot_v21" else []
    convert(source.path, tmp_path / "out", "--to", "lerobot", *given)  # an equal --fps is fine
    assert_reads_back_equal(source, open_dataset(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_tasks_of_lerobots_own_files_survive_conversion_to_lerobot(tmp_path: Path):
    """LeRobot's reference files edited to hold two tasks: converted to LeRobot (and through
    slhub's store), each episode keeps its own, written as LeRobot writes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "two_tasks"
    shutil.copytree(REFERENCE / "lerobot_v30", source)
    per_episode = [0, 1, 1, 0]
    tasks = [TASK, "stand still"]
    lengths = [50, 47, 23, 45]

    def edit(path: Path, **columns) -> None:
        """Columns replaced, in LeRobot's own schema (its metadata kept)."""
        table = pq.read_table(path)
        kept = {name: columns.get(name, table.column(name)) for name in table.column_names}
        pq.write_table(pa.table(kept, schema=table.schema), path)

    edit(source / "meta/tasks.parquet", task_index=[0, 1], __index_level_0__=tasks)
    edit(source / "meta/episodes/chunk-000/file-000.parquet",
         tasks=[[tasks[t]] for t in per_episode])  # fmt: skip
    edit(source / "data/chunk-000/file-000.parquet",
         task_index=np.repeat(per_episode, lengths).astype(np.int64))  # fmt: skip
    info = json.loads((source / "meta/info.json").read_text())
    (source / "meta/info.json").write_text(json.dumps({**info, "total_tasks": 2}, indent=4))

    convert(source, tmp_path / "store")  # and slhub's store keeps them for a later convert
    assert json.loads((tmp_path / "store/meta.json").read_text())["tasks"] == tasks
    for start, out in ((source, "out"), (tmp_path / "store", "out_of_store")):
        convert(start, tmp_path / out, "--to", "lerobot")
        written = tmp_path / out / "meta"
        assert json.loads((written / "info.json").read_text())["total_tasks"] == 2
        mine = pq.read_table(written / "tasks.parquet")
        theirs = pq.read_table(REFERENCE / "lerobot_v30/meta/tasks.parquet")
        assert mine.to_pydict() == {"task_index": [0, 1], "__index_level_0__": tasks}
        assert mine.schema.remove_metadata() == theirs.schema.remove_metadata()
        meta = {k: v for k, v in json.loads(mine.schema.metadata[b"pandas"]).items()
                if k != "creator"}  # fmt: skip
        assert meta == {k: v for k, v in json.loads(theirs.schema.metadata[b"pandas"]).items()
                        if k != "creator"}  # fmt: skip
        episodes = pq.read_table(written / "episodes/chunk-000/file-000.parquet")
        assert episodes.schema.field("tasks").type == theirs_tasks_type()
        assert episodes.column("tasks").to_pylist() == [[tasks[t]] for t in per_episode]
        data = pq.read_table(tmp_path / out / "data/chunk-000/file-000.parquet")
        assert data.column("task_index").to_pylist() == np.repeat(per_episode, lengths).tolist()
        back = open_dataset(tmp_path / out)
        for episode, task in enumerate(per_episode):
            assert tasks_of(back, episode) == [tasks[task]] * lengths[episode]


def theirs_tasks_type():
    import pyarrow.parquet as pq

    episodes = REFERENCE / "lerobot_v30/meta/episodes/chunk-000/file-000.parquet"
    return pq.read_schema(episodes).field("tasks").type


class TaskEpisodes(ArrayEpisodes):
    """Episodes in memory with a task per step (one changes task halfway)."""

    def __init__(self, episodes, tasks, **kwargs) -> None:
        super().__init__(episodes, **kwargs)
        self.tasks = tasks

    def episode_tasks(self, episode: int) -> np.ndarray:
        return np.asarray(self.tasks[episode], dtype=object)


def test_tasks_are_numbered_by_first_appearance_and_listed_per_episode(tmp_path: Path):
    rng = np.random.default_rng(0)
    episodes = [{"action": rng.normal(size=(n, 2))} for n in (4, 6, 3)]
    steps = [["b"] * 4, ["a"] * 3 + ["b"] * 3, ["c"] * 3]
    write_lerobot(TaskEpisodes(episodes, steps, fps=10), tmp_path / "first")
    convert(tmp_path / "first", tmp_path / "again", "--to", "lerobot")  # LeRobot to LeRobot
    import pyarrow.parquet as pq

    for out in ("first", "again"):
        folder = tmp_path / out
        assert pq.read_table(folder / "meta/tasks.parquet").to_pydict() == {
            "task_index": [0, 1, 2], "__index_level_0__": ["b", "a", "c"]}  # fmt: skip
        listed = pq.read_table(folder / "meta/episodes/chunk-000/file-000.parquet")
        assert listed.column("tasks").to_pylist() == [["b"], ["a", "b"], ["c"]]
        data = pq.read_table(folder / "data/chunk-000/file-000.parquet")
        assert data.column("task_index").to_pylist() == [0] * 4 + [1] * 3 + [0] * 3 + [2] * 3
        back = open_dataset(folder)
        assert [tasks_of(back, e) for e in range(3)] == steps


def test_fps_goes_into_the_store_and_a_store_without_one_keeps_none(tmp_path: Path):
    convert(REFERENCE / "robomimic.hdf5", tmp_path / "with", "--fps", "12.5")
    assert json.loads((tmp_path / "with/meta.json").read_text())["fps"] == 12.5
    assert open_dataset(tmp_path / "with").fps == 12.5
    convert(REFERENCE / "robomimic.hdf5", tmp_path / "without")
    assert open_dataset(tmp_path / "without").fps is None
    convert(REFERENCE / "lerobot_v21", tmp_path / "same", "--fps", "125.0")  # equal: accepted
    assert open_dataset(tmp_path / "same").fps == FPS


@pytest.mark.parametrize("name", [*NO_FPS, "store_of_robomimic"])
def test_a_source_without_fps_to_lerobot_without_fps_is_one_line(
    name: str, stores: dict[str, Path], tmp_path: Path, capsys
):
    source = source_of(name, stores)
    line = cli_error(capsys, "data", "convert", str(source), str(tmp_path / "dst"), "--to",
                     "lerobot")  # fmt: skip
    assert "records no fps" in line and "--fps HZ" in line and str(source) in line, line
    assert list(tmp_path.iterdir()) == []  # no DST, no .dst.tmp-*


@pytest.mark.parametrize(
    ("source", "to", "fps", "expected"),
    [
        ("robomimic.hdf5", "lerobot", "0", "--fps 0: give a finite rate above 0"),
        ("robomimic.hdf5", "lerobot", "-5", "--fps -5: give a finite rate above 0"),
        ("robomimic.hdf5", "lerobot", "nan", "--fps nan: give a finite rate above 0"),
        ("replay.zarr", "lerobot", "inf", "--fps inf: give a finite rate above 0"),
        ("replay.zarr", "slhub", "-inf", "--fps -inf: give a finite rate above 0"),
        ("replay.zarr", "slhub", "0", "--fps 0: give a finite rate above 0"),
        ("lerobot_v30", "lerobot", "30", "records fps 125; leave --fps out or give 125"),
        ("lerobot_v21", "slhub", "124.9", "records fps 125; leave --fps out or give 125"),
    ],
)
def test_a_bad_fps_is_one_line_and_writes_nothing(
    source: str, to: str, fps: str, expected: str, tmp_path: Path, capsys
):
    line = cli_error(capsys, "data", "convert", str(REFERENCE / source),
                     str(tmp_path / "sub" / "dst"), "--to", to, f"--fps={fps}")  # fmt: skip
    assert expected in line, line
    assert list(tmp_path.iterdir()) == []  # not even DST's parent
