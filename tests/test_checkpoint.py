"""Checkpoint files: atomic writes, safe loads, v1 compatibility and resume refusals."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import SL_DDP, cli_error, load, run_cli
from slhub import checkpoint, cli, rng, train
from slhub.atomic import atomic_write
from slhub.checkpoint import files
from slhub.checkpoint.gather import snapshot
from slhub.errors import ArtifactError, CheckpointError

SHORT = ["trainer.steps=4", "trainer.validate_every=0", "trainer.save_every=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "run"
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"])
    return out


def test_failure_mid_write_leaves_previous_last_intact(run_dir: Path, tmp_path: Path, monkeypatch):
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    before = (folder / "last.pt").read_bytes()
    real_fsync = os.fsync

    def torn_write(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", torn_write)
    with pytest.raises(OSError, match="No space left"):
        files.write(files.serialize(checkpoint.load(folder / "step_2.pt")), folder / "last.pt")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert (folder / "last.pt").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in run_dir.iterdir())


def test_truncated_checkpoint_is_refused_with_one_line(capsys, run_dir: Path, tmp_path: Path):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((run_dir / "last.pt").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="damaged or not a checkpoint"):
        checkpoint.load(damaged)
    out = tmp_path / "resumed"
    line = cli_error(
        capsys,
        "train",
        "--config",
        str(SL_DDP),
        "--set",
        f"trainer.output_dir={out}",
        "--resume",
        str(damaged),
    )
    assert "damaged.pt: damaged or not a checkpoint" in line
    assert not out.exists()


def test_checkpoint_that_needs_pickle_is_refused(tmp_path: Path):
    evil = tmp_path / "evil.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}, "rng": Path("/")}, evil)
    with pytest.raises(CheckpointError, match="needs pickle to load"):
        checkpoint.load(evil)


def test_foreign_and_unknown_layouts_are_refused(tmp_path: Path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "other.checkpoint/9", "state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="foreign checkpoint format 'other.checkpoint/9'"):
        checkpoint.load(foreign)
    bare = tmp_path / "bare.pt"
    torch.save({"state_dict": {}}, bare)
    with pytest.raises(CheckpointError, match=r"not a slhub checkpoint \(keys: state_dict\)"):
        checkpoint.load(bare)
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        checkpoint.load(tmp_path / "absent.pt")


def test_v1_resumes_into_a_fresh_directory_only(run_dir: Path, tmp_path: Path):
    v1 = tmp_path / "v1.pt"
    torch.save(checkpoint.load(run_dir / "step_2.pt").to_v1(), v1)
    assert checkpoint.load(v1).version == 1
    out = tmp_path / "from_v1"
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"], resume=str(v1))
    resumed = load(out / "last.pt")
    assert resumed["step"] == 4 and resumed["format"] == "slhub.checkpoint/2"
    assert resumed["run"]["resumed_from"] == {
        "run_id": None,
        "step": 2,
        "checkpoint": str(v1),
        "sha256": files.sha256_file(v1),
    }
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]
    with pytest.raises(ArtifactError, match="v1 checkpoint has no run identity"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"], resume=str(v1))


def test_resume_in_place_refuses_another_runs_directory(run_dir: Path, tmp_path: Path):
    other = tmp_path / "other"
    train(str(SL_DDP), [*SHORT, "trainer.steps=2", f"trainer.output_dir={other}"])
    artifacts = lambda: {p.name: p.read_bytes() for p in other.iterdir() if p.name[0] != "."}  # noqa: E731
    before = artifacts()
    with pytest.raises(ArtifactError, match="run.json belongs to run"):
        train(
            str(SL_DDP), [*SHORT, f"trainer.output_dir={other}"], resume=str(run_dir / "step_2.pt")
        )
    assert artifacts() == before


def test_resume_in_place_from_latest_checkpoint_continues_the_run(run_dir: Path, tmp_path: Path):
    folder = tmp_path / "inplace"
    shutil.copytree(run_dir, folder)
    train(
        str(SL_DDP),
        [
            "trainer.steps=6",
            "trainer.validate_every=0",
            "trainer.save_every=2",
            f"trainer.output_dir={folder}",
        ],
        resume=str(folder / "last.pt"),
    )
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("event") != "resume"] == [1, 2, 3, 4, 5, 6]
    assert [(r["step"], r["event"]) for r in records if "event" in r] == [(4, "resume")]
    assert (
        load(folder / "last.pt")["run"]["run_id"]
        == json.loads((folder / "run.json").read_text())["run_id"]
    )


def test_resume_refuses_another_plugin_source(run_dir: Path, tmp_path: Path):
    with pytest.raises(CheckpointError, match="plugins differ.*HookProbe"):
        train(
            str(SL_DDP),
            [*SHORT, "plugin=slhub_testplugins:HookProbe", f"trainer.output_dir={tmp_path / 'p'}"],
            resume=str(run_dir / "step_2.pt"),
        )
    ckpt = load(run_dir / "step_2.pt")
    ckpt["run"]["source"]["plugins"][0]["version"] = "9.9"
    forged = tmp_path / "forged.pt"
    torch.save(ckpt, forged)
    with pytest.raises(CheckpointError, match=r"code differs.*version 9\.9 -> None"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={tmp_path / 'q'}"], resume=str(forged))


def test_inspect_describes_a_checkpoint(capsys, run_dir: Path):
    code = cli.main(["inspect", str(run_dir / "last.pt")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "format:     slhub.checkpoint/2" in out
    assert "step:       4" in out and "world size: 1" in out
    assert "ranks:      1 entries holding buffers, rng, sampler" in out


def test_json_logs_carry_run_identity(tmp_path: Path):
    """In a separate process (helpers.run_cli): every line it writes to stderr is checked."""
    out = tmp_path / "logged"
    proc = run_cli(
        "train",
        "--config",
        str(SL_DDP),
        "--log-format",
        "json",
        "--set",
        f"trainer.output_dir={out}",
        "--set",
        "trainer.steps=3",
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines()]
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    updates = [e for e in events if e["event"] == "progress"]
    assert updates and all(
        e["run_id"] == run_id and e["rank"] == 0 and e["world_size"] == 1 and "step" in e
        for e in updates
    )


@pytest.mark.parametrize("legacy", [False, True], ids=["tensor", "tuple-of-ints"])
def test_rng_state_survives_a_weights_only_checkpoint(tmp_path: Path, legacy: bool):
    """Every stream continues exactly from a captured state after a weights-only save and
    load; python's state words as a tensor, or as the tuple of ints older checkpoints hold."""
    rng.seed_everything(7)
    state = rng.random_state(torch.device("cpu"))
    assert isinstance(state["python"][1], torch.Tensor) and state["python"][1].numel() == 625
    if legacy:
        version, words, gauss = state["python"]
        state["python"] = (version, tuple(words.tolist()), gauss)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    torch.save({"rng": state}, tmp_path / "s.pt")
    random.random(), np.random.rand(), torch.rand(3)  # move every stream on
    saved = torch.load(tmp_path / "s.pt", weights_only=True)["rng"]
    rng.set_random_state(saved, torch.device("cpu"))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def test_preserved_leaves_every_stream_where_it_was():
    rng.seed_everything(3)
    with rng.preserved_random_state(torch.device("cpu")):
        random.random(), np.random.rand(), torch.rand(5)
    after = (random.random(), np.random.rand(), torch.rand(5))
    rng.seed_everything(3)
    fresh = (random.random(), np.random.rand(), torch.rand(5))
    assert after[:2] == fresh[:2] and torch.equal(after[2], fresh[2])


class _Counter:
    def __init__(self) -> None:
        self.seen = [1, 2]


def test_rank_state_snapshot_is_untouched_by_later_changes_to_the_live_state():
    """Rank 0 keeps a snapshot of its own state instead of a pickle round trip: what
    validation changes in place between the gather and the write must not reach it."""
    live = {
        "weights": torch.arange(4.0),
        "nested": [torch.ones(2, dtype=torch.int64), ("keep", 3, {"x": torch.zeros(1)})],
        "object": _Counter(),
        "dtype": torch.float16,
        "computed": torch.ones(2, requires_grad=True) * 2,  # a non-leaf: deepcopy refuses it
        "ordered": OrderedDict(grad=torch.ones(1, requires_grad=True) * 3),
    }
    copy = snapshot(live)
    assert copy["computed"].is_leaf and copy["computed"].requires_grad
    assert torch.equal(copy["computed"].detach(), torch.full((2,), 2.0))
    live["weights"].add_(10)
    live["nested"][0].fill_(7)
    live["nested"][1][2]["x"].fill_(5)
    live["nested"].append("late")
    live["object"].seen.append(3)
    assert torch.equal(copy["weights"], torch.arange(4.0))
    assert torch.equal(copy["nested"][0], torch.ones(2, dtype=torch.int64))
    assert copy["nested"][1][:2] == ("keep", 3) and isinstance(copy["nested"][1], tuple)
    assert torch.equal(copy["nested"][1][2]["x"], torch.zeros(1)) and len(copy["nested"]) == 2
    assert copy["object"].seen == [1, 2] and copy["dtype"] is torch.float16
    assert type(copy["ordered"]) is OrderedDict and copy["ordered"]["grad"].is_leaf


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "no-hard-links"])
def test_one_write_gives_every_name_the_bytes_and_a_later_write_replaces_one_name(
    tmp_path: Path, monkeypatch, links: bool
):
    """last.pt and step_N.pt come from one write (a hard link where the file system has
    them, a copy where it has not); the next checkpoint replaces last.pt with a new file
    and leaves step_N.pt's bytes alone."""
    if not links:

        def no_links(src, dst):
            raise OSError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
    first, second = b"step two bytes", b"step four bytes"
    atomic_write(first, tmp_path / "last.pt", tmp_path / "step_2.pt")
    assert (tmp_path / "last.pt").read_bytes() == first == (tmp_path / "step_2.pt").read_bytes()
    shared = (tmp_path / "last.pt").stat().st_ino == (tmp_path / "step_2.pt").stat().st_ino
    assert shared is links
    atomic_write(second, tmp_path / "last.pt", tmp_path / "step_4.pt")
    assert (tmp_path / "step_2.pt").read_bytes() == first
    assert (tmp_path / "last.pt").read_bytes() == second == (tmp_path / "step_4.pt").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_2.pt", "step_4.pt"]


def test_failed_rename_leaves_no_temporary_and_the_previous_files(tmp_path: Path, monkeypatch):
    atomic_write(b"old", tmp_path / "last.pt", tmp_path / "step_2.pt")
    real_replace = os.replace

    def fail_on_step(src, dst):
        if Path(dst).name == "step_4.pt":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_step)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(b"new", tmp_path / "last.pt", tmp_path / "step_4.pt")
    # last.pt was replaced first (what --resume auto reads); nothing half-written remains
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_2.pt"]
    assert (tmp_path / "step_2.pt").read_bytes() == b"old"
    assert (tmp_path / "last.pt").read_bytes() == b"new"


def test_a_killed_writers_temporary_is_unlinked_never_written_into(tmp_path: Path, monkeypatch):
    """A writer killed between its two renames leaves ``.step_N.pt.tmp-PID``, a hard link to
    last.pt. A later writer with the same pid must not open that name for writing: it would
    change last.pt (and the checkpoint it shares its bytes with) in place."""
    last, step_5 = tmp_path / "last.pt", tmp_path / "step_5.pt"
    atomic_write(b"step five", last, step_5)
    pid = os.getpid()
    os.link(last, tmp_path / f".step_7.pt.tmp-{pid}")  # what the killed writer left
    os.link(last, tmp_path / f".last.pt.tmp-{pid}")
    atomic_write(b"step seven", last, tmp_path / "step_7.pt")
    assert step_5.read_bytes() == b"step five"
    assert last.read_bytes() == b"step seven" == (tmp_path / "step_7.pt").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_5.pt", "step_7.pt"]


def test_a_link_failure_other_than_no_hard_links_fails_the_write(tmp_path: Path, monkeypatch):
    atomic_write(b"old", tmp_path / "last.pt", tmp_path / "step_2.pt")

    def broken_disk(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "link", broken_disk)
    with pytest.raises(OSError, match="Input/output error"):
        atomic_write(b"new", tmp_path / "last.pt", tmp_path / "step_4.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_2.pt"]
    assert (tmp_path / "last.pt").read_bytes() == b"old"


def _resume_error(capsys, checkpoint_path: Path, out: Path) -> str:
    """The one line ``slhub train --resume`` ends with; nothing was written for the run."""
    settings = [arg for item in [*SHORT[1:], "trainer.steps=6"] for arg in ("--set", item)]
    line = cli_error(
        capsys, "train", "--config", str(SL_DDP), *settings, "--set", f"trainer.output_dir={out}",
        "--resume", str(checkpoint_path),
    )  # fmt: skip
    assert not out.exists()
    return line


def test_a_flipped_byte_in_a_tensor_fails_its_crc_check(capsys, run_dir: Path, tmp_path: Path):
    """torch.load does not check the CRC-32 that torch.save records: without slhub's check
    the damaged file loads, with one weight silently changed."""
    data = bytearray((run_dir / "last.pt").read_bytes())
    weight = load(run_dir / "last.pt")["model"]["0.weight"]
    at = bytes(data).find(weight.numpy().tobytes())
    assert at > 0 and bytes(data).count(weight.numpy().tobytes()) == 1
    data[at + 17] ^= 0x40
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(data))
    silently = torch.load(flipped, weights_only=True)["model"]["0.weight"]
    assert not torch.equal(silently, weight)  # what the check prevents
    with pytest.raises(CheckpointError, match=r"/data/\d+ fails its CRC-32 check"):
        checkpoint.load(flipped)
    assert "damaged checkpoint" in cli_error(capsys, "inspect", str(flipped))
    assert "fails its CRC-32 check" in _resume_error(capsys, flipped, tmp_path / "resumed")


def _mutated(run_dir: Path, tmp_path: Path, change) -> Path:
    ckpt = load(run_dir / "last.pt")
    change(ckpt)
    path = tmp_path / "mutated.pt"
    torch.save(ckpt, path)
    return path


def _set_lr(ckpt):
    ckpt["optimizer"]["param_groups"][0]["lr"] = "fast"


def _set_step(ckpt):
    ckpt["optimizer"]["state"][0]["step"] = "x"


def _shrink_moment(ckpt):
    ckpt["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3)


def _widen_moment(ckpt):
    state = ckpt["optimizer"]["state"][0]
    state["exp_avg_sq"] = state["exp_avg_sq"].double()


def _widen_weight(ckpt):
    ckpt["model"]["0.weight"] = ckpt["model"]["0.weight"].double()


def _nest_recipe(ckpt):
    deep: list = []
    for _ in range(300):
        deep = [deep]
    ckpt["run"]["recipe"]["model"]["hidden"] = deep


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_set_lr, "optimizer param group 0: lr is 'fast', expected a number"),
        (_set_step, "optimizer state 'step' of parameter 0 is a str, expected a tensor"),
        (_shrink_moment, "optimizer state exp_avg of parameter 0.weight is float32 [3], "
                         "the parameter is float32 [32, 4]"),
        (_widen_moment, "exp_avg_sq of parameter 0.weight is float64 [32, 4]"),
        (_widen_weight, "model tensor 0.weight is float64, this recipe's model has float32"),
        (_nest_recipe, "run identity is nested more than 100 levels deep"),
    ],
    ids=["lr-not-a-number", "step-not-a-number", "moment-shape", "moment-dtype",
         "weight-dtype", "deep-recipe"],
)  # fmt: skip
def test_state_torch_would_cast_or_trip_over_later_is_refused_at_resume(
    capsys, run_dir: Path, tmp_path: Path, change, expected: str
):
    """Each loaded before (a cast, or a traceback at the first update, or a RecursionError);
    now one line before anything is written."""
    line = _resume_error(capsys, _mutated(run_dir, tmp_path, change), tmp_path / "resumed")
    assert expected in line, line


def test_a_path_that_is_no_regular_file_is_refused_with_one_line(capsys, tmp_path: Path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)  # reading it would block forever
    assert "fifo.pt: not a regular file" in cli_error(capsys, "inspect", str(fifo))
    long = tmp_path / ("a" * 300 + ".pt")
    assert "cannot read checkpoint (File name too long)" in cli_error(capsys, "inspect", str(long))
    assert "NUL byte" in cli_error(capsys, "inspect", str(tmp_path / "a\0b.pt"))
    assert "fifo.pt: not a regular file" in _resume_error(capsys, fifo, tmp_path / "resumed")


def test_a_rank_state_packs_empty_tensors_made_from_numpy():
    """An empty array from numpy has stride 0 (no byte view); a rank's state holding one
    (a stream with no windows drawn ahead) must still reach rank 0 whole."""
    import pickle

    from slhub.checkpoint.gather import pack_state

    empty = torch.from_numpy(np.zeros((0, 0, 2), dtype=np.int64))
    flat = torch.from_numpy(np.zeros((0,), dtype=np.float32))
    assert flat.stride() == (0,)
    state = {"pending": empty, "flat": flat, "other": torch.arange(3)}
    back = pickle.loads(pack_state(state))
    assert back["pending"].shape == (0, 0, 2) and back["pending"].dtype == torch.int64
    assert back["flat"].shape == (0,) and back["flat"].dtype == torch.float32
    assert torch.equal(back["other"], torch.arange(3))
