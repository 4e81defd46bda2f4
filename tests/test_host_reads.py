"""Host reads of tensor values per update: each is a host-device synchronization on a GPU.

Counted on the CPU with a ``TorchFunctionMode`` (it sees every ``float(t)``,
``t.item()``, ``t.tolist()`` ... whatever the device), so the claim in
docs/performance.md ("the sl_ddp update reads the device twice, as a hand-written
loop does") is checked on every machine, not only read off the code.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from torch.overrides import TorchFunctionMode

from examples.sl_ddp.plugin import SlDdpPlugin, masked_mse
from helpers import SL_DDP
from slhub import LossResult, hookimpl, train

#: Tensor methods that bring a value to the host (on a GPU: wait for the device).
HOST_READS = frozenset(
    {"__float__", "__int__", "__bool__", "__index__", "item", "tolist", "numpy", "cpu"}
)


class HostReads(TorchFunctionMode):
    """Counts host reads by method name while active, except reads of ``host_side``
    tensors (ids): torch.optim keeps Adam's ``step`` counters on the host by design and
    reads them with ``.item()`` on every device, which is no device read."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.host_side: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS and not (args and id(args[0]) in self.host_side):
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


class CountBetween:
    """A plugin: counts host reads from the end of update ``first`` to the end of ``last``
    (entered and left in ``on_log``, so whole updates, without boundaries, are counted)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.mode = first, last, HostReads()
        self.active = False

    @hookimpl
    def on_log(self, trainer, step, metrics) -> None:
        if step == self.first:
            state = trainer.optimizer.state.values()
            self.mode.host_side = {id(entry["step"]) for entry in state}
            assert all(not entry["step"].is_cuda for entry in state)  # host-side indeed
            self.mode.__enter__()
            self.active = True
        elif step == self.last:
            self.mode.__exit__(None, None, None)
            self.active = False


class TensorWeight(SlDdpPlugin):
    """sl_ddp, but the weight is returned as a tensor and no metric reads it."""

    @hookimpl
    def objective(self, trainer, model, batch) -> LossResult:
        x, y, mask = batch
        loss, count = masked_mse(model(x), y, mask)
        return LossResult(loss=loss, weight=count)


def _reads_per_update(tmp_path: Path, *overrides: str) -> dict[str, float]:
    first, last = 2, 12
    counter = CountBetween(first, last)
    try:
        train(
            str(SL_DDP),
            [
                f"trainer.output_dir={tmp_path / 'out'}",
                f"trainer.steps={last + 1}",
                "trainer.validate_every=0",
                "trainer.save_every=0",
                *overrides,
            ],
            plugins=[counter],
        )
    finally:  # a run that failed while counting must not leave the mode on for later tests
        if counter.active:
            counter.mode.__exit__(None, None, None)
    return {name: n / (last - first) for name, n in counter.mode.calls.items()}


def test_sl_ddp_update_reads_the_weight_and_the_loss_once_each(tmp_path: Path):
    # float(count) for the weight and its metric, float(loss) for the agreement
    assert _reads_per_update(tmp_path) == {"__float__": 2}


def test_a_tensor_weight_is_read_once_and_scale_loss_reuses_the_float(tmp_path: Path):
    reads = _reads_per_update(tmp_path, "plugin=test_host_reads:TensorWeight")
    assert reads == {"__float__": 2}


def test_gradient_clipping_adds_one_read_for_the_logged_norm(tmp_path: Path):
    assert _reads_per_update(tmp_path, "trainer.grad_clip_norm=1.0") == {"__float__": 3}
