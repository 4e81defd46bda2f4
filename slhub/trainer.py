"""The training loop. Its whole protocol, on every rank, is this:

    (bootstrap, in slhub.run: recipe, plugins, resume plan, model, optimizer,
     checkpoint loaded (checkpoints.load(plan)), agreed on by every rank; rank 0
     opens the run directory)
    for step in start+1 .. steps:
        err = None
        try:    for each of `accumulate` micro-batches:                     # inside DDP
                    batch = sample(generator, step); result = objective(batch, step)
                    all but the last: backward(scale_loss(result, world_size)) under no_sync
        except: err = (phase, exception)
        agreed = agree(sum w, sum w*loss, err or held, stop-signal received)
                          # ONE all_reduce per update (+1 only on a failure or a stop request)
        if agreed.failed: raise the same RankFailure on every rank (origin rank, phase)
        last micro-batch: weight 0 -> backward(exact zero)               # contributes nothing
                          else backward(scale_loss(result, total))  # DDP mean is exact
                          (accumulating: scale_loss(result, world_size), then grad *= N/total)
        if agreed.total_weight > 0: clip the gradient norm; optimizer.step()  # else skipped
        schedule.step()                                   # every update, skipped ones too
        ema.update()                        # recipe `ema`: every update, every rank alike
        on_commit(...); rank 0 appends the metrics line (train/loss, train/lr, ...), on_log
        checkpoints.boundary(step, ...)                # one call per update; at a boundary:
          committed = gather every rank's state_dict() and registered state  # collective
          if validation step and rank 0: validate(...), metrics line, on_log  # errors held
                          (with the EMA weights swapped in, and the trained ones back after)
                          then rank 0's own entry of committed = its state again
          if save step (or a new best) and rank 0: write committed, apply keep_last
                          # even if validation failed; errors held (slhub.checkpoint)
        if agreed.stop: save this update (as at a save step) and leave the loop
    final agree(): surfaces an error held from the last boundary
    if stopped before the last update: every rank raises Preempted (exit status 75;
                                       resume with --resume auto); at the last one: done
    on_fit_end(status)                         # every rank: "done", "preempted" or "failed"
    close every registered object (streams, readers)      # however the run ended

DDP wraps the objective computation (model + loss), never ``loop.model``, which
stays the original module for validation, saving and export. Hooks receive the
loop's :attr:`Loop.view` as ``trainer``: the :class:`slhub.hookspecs.Trainer`
members of the loop, and nothing else of it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from slhub import distributed, log, rng
from slhub.artifacts import MetricsLog
from slhub.checkpoint import CheckpointManager, ResumePlan, files
from slhub.ema import Ema
from slhub.errors import PluginError, SlhubError, one_line, raised_by
from slhub.hookspecs import LossResult
from slhub.optim import MixedPrecision
from slhub.preemption import Preempted, StopSignals
from slhub.rank_state import ModelBuffers, RandomStreams, SamplerState
from slhub.recipe import Recipe, TrainerConfig
from slhub.registry import Plugins, direct_caller
from slhub.view import TrainerView

LOG = log.get_logger()


def sampler_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s sampler generator (tests rebuild batches with it)."""
    return rng.derived_seed(seed, rank, "sampler")


class _Objective(nn.Module):
    """The module DDP wraps: the model plus the objective hook, so DDP sees the loss graph."""

    def __init__(self, model: nn.Module, loop: Loop) -> None:
        super().__init__()
        self.model = model
        # a tuple keeps the loop out of the module tree, and reading the model from it
        # skips nn.Module's attribute lookup on the hot path
        self._plain = (loop, model)

    def forward(self, batch: Any, step: int) -> LossResult:
        loop, model = self._plain
        result = loop._calls.objective(trainer=loop.view, model=model, batch=batch, step=step)
        if not isinstance(result, LossResult):
            raise PluginError(
                f"objective returned {type(result).__name__}, expected slhub.LossResult"
                if result is not None
                else "objective returned None (the model plugin's objective must return a "
                "LossResult)"
            )
        return result


class TrainerBase:
    """The :class:`slhub.Trainer` protocol's accessors, derived from ``rank``, ``config``
    and ``_sections`` (validated recipe sections by name): shared by the loop and
    :class:`slhub.standalone.Standalone` (``slhub eval``, :mod:`slhub.testing`), so a
    plugin sees the same answers from both."""

    rank: int
    config: TrainerConfig
    _sections: Mapping[str, Any]
    #: What :meth:`record_dataset` recorded, by name (the run identity's ``datasets``).
    datasets: dict[str, dict[str, Any]]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def section(self, name: str) -> Any:
        """The validated recipe section ``name`` owned by a plugin."""
        try:
            return self._sections[name]
        except KeyError:
            raise PluginError(f"recipe has no validated section {name!r}") from None

    def record_dataset(self, name: str, dataset: Any, split: Any = None) -> dict[str, Any]:
        """Record ``dataset`` (and its ``split``) in the run identity: its fingerprint
        is compared on resume (:meth:`slhub.checkpoint.ResumePlan.check_datasets`)."""
        from slhub.data import fingerprint

        entry: dict[str, Any] = {"fingerprint": fingerprint(dataset), "path": str(dataset.path)}
        if split is not None:
            entry["split"] = split.to_dict() if hasattr(split, "to_dict") else split
        if name in self.datasets:
            raise PluginError(f"dataset {name!r} is recorded twice")
        self.datasets[name] = entry
        return entry


class Loop(TrainerBase):
    """One rank's training loop; every hook receives its :attr:`view` as ``trainer``."""

    def __init__(
        self,
        recipe: Recipe,
        plugins: Plugins,
        device: torch.device,
        plan: ResumePlan | None = None,
    ) -> None:
        """Build the model, optimizer and schedule, then continue from ``plan``'s
        checkpoint (every rank). A failure closes what the plugins registered."""
        self._recipe = recipe
        self.config = recipe.trainer
        self._plugins = plugins
        self._hook = plugins.hook
        self.device = device
        self.rank = distributed.rank()
        self.world_size = distributed.world_size()
        self.output_dir = Path(self.config.output_dir)
        self.step = 0
        #: The run's id, the metrics log (rank 0) and the stop signals: set by :meth:`fit`.
        self.run_id: str | None = None
        self._metrics: MetricsLog | None = None
        self._stop_signals: StopSignals | None = None
        self.datasets: dict[str, dict[str, Any]] = {}
        self._in_commit = False
        self._held: tuple[str, BaseException] | None = None
        #: What every hook receives as ``trainer``: the protocol's members of this loop.
        self.view = TrainerView(self)
        #: Owns the boundary cadence, the gather, the registered state and every
        #: checkpoint write and load.
        self._checkpoints = CheckpointManager(self, self.config, self._hook.load_state_dict)
        try:
            self._build(recipe, plugins, device)
            if plan is not None:
                self._checkpoints.load(plan)
        except BaseException:
            self.close()
            raise

    def _build(self, recipe: Recipe, plugins: Plugins, device: torch.device) -> None:
        rng.seed_everything(self.config.seed)  # identical model init on every rank
        model = self._hook.build_model(trainer=self.view)
        if not isinstance(model, nn.Module):
            raise PluginError(
                f"{plugins.model.describe()} build_model returned "
                f"{type(model).__name__}, expected torch.nn.Module"
            )
        self.model: nn.Module = model.to(device)
        self.model.train()
        self._precision = MixedPrecision(self.config.precision, device)
        self.optimizer, self.scheduler = self._configure_optimizers()
        #: The moving average of the recipe's ``ema`` section (None without one).
        self.ema = Ema(self.model, recipe.ema) if recipe.ema is not None else None
        self.generator = torch.Generator().manual_seed(sampler_seed(self.config.seed, self.rank))
        rng.seed_everything(rng.derived_seed(self.config.seed, self.rank, "process"))
        self._objective = _Objective(self.model, self)
        self.register_state("rng", RandomStreams(device))
        self.register_state("sampler", SamplerState(self.generator))
        self.register_state("buffers", ModelBuffers(self.model))
        self._ddp: DistributedDataParallel | None = None
        self._buckets_rebuilt = True  # nothing to rebuild until fit() wraps the model in DDP
        #: The per-update hooks, resolved at :meth:`fit` for the plugins registered then.
        self._calls: _Calls | None = None

    def _configure_optimizers(self):
        built = self._hook.configure_optimizers(trainer=self.view, model=self.model)
        if isinstance(built, tuple) and len(built) != 2:
            raise PluginError(
                f"configure_optimizers returned a tuple of {len(built)}, expected an optimizer "
                "or (optimizer, lr scheduler or None)"
            )
        optimizer, scheduler = built if isinstance(built, tuple) else (built, None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise PluginError(
                f"configure_optimizers returned {type(optimizer).__name__}, expected a "
                "torch.optim.Optimizer or (optimizer, lr scheduler or None)"
            )
        if scheduler is not None and not hasattr(scheduler, "state_dict"):
            raise PluginError("configure_optimizers returned a scheduler without state_dict()")
        return optimizer, scheduler

    @property
    def _sections(self) -> Mapping[str, Any]:
        return self._recipe.sections

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler, or None."""
        return self._precision.scaler

    @property
    def dataset_changes(self) -> list[str]:
        """The dataset differences the resume accepted (``--allow-dataset-change``)."""
        return self._checkpoints.dataset_changes

    def code_identity(self) -> dict[str, Any]:
        """The code this loop runs (slhub, torch, plugins), as run.json records it."""
        return self._plugins.code_identity()

    def admit(self) -> None:
        """Every plugin's ``admit`` hook: the plugins' last word before any artifact."""
        self._hook.admit(trainer=self.view)

    def register_state(self, name: str, obj: Any) -> None:
        """Checkpoint ``obj`` (``state_dict()``/``load_state_dict(state)``) under ``name`` in
        this rank's entry, restore it on resume, and ``close()`` it when the run ends."""
        self._checkpoints.register(name, obj)

    def close(self) -> None:
        """Close every registered object that has ``close()`` (decode threads, readers);
        once, however the run ended."""
        self._checkpoints.close()

    # ------------------------------------------------------------------- loop

    def fit(self, run: RunContext) -> None:
        """Run updates ``step + 1 .. steps`` under the step protocol."""
        self.run_id, self._metrics, self._stop_signals = run.run_id, run.metrics, run.stop_signals
        self._checkpoints.bind(run.identity, run.metrics)
        if self.world_size > 1:
            with warnings.catch_warnings():
                # torch 2.13 deprecates broadcast_buffers, but its replacement still
                # broadcasts rank 0's buffers at construction, which would overwrite the
                # per-rank buffers just restored; torch's own warning says to keep it.
                warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")
                try:
                    self._ddp = DistributedDataParallel(
                        self._objective,
                        device_ids=[self.device.index] if self.device.type == "cuda" else None,
                        broadcast_buffers=False,
                    )
                except RuntimeError as exc:  # DDP compares the ranks' parameters (a collective)
                    raise PluginError(
                        f"the ranks' models differ (build_model must build the same model on "
                        f"every rank): DistributedDataParallel: {one_line(exc)}"
                    ) from None
                self._buckets_rebuilt = False
        self._calls = _Calls(self._plugins)  # the plugins registered now, for the whole run
        stopped_at = None
        status = "failed"
        try:
            for step in range(self.step + 1, self.config.steps + 1):
                stop = self._update(step)
                self._held = self._checkpoints.boundary(
                    step,
                    stop=stop,
                    held=self._held,
                    local_state=self._local_state,
                    validate=self._validate,
                    state_failure=self._state_failure,
                )
                if stop and step < self.config.steps:  # at the last update the run is done
                    stopped_at = step
                    break
            self._agree_final()
            status = "done" if stopped_at is None else "preempted"
        finally:
            self._ddp = None  # drop the wrapper before the process group goes away
            self._end(status)
            self.close()
        if stopped_at is not None:
            if self._stop_signals is not None:
                self._stop_signals.done = True
            raise Preempted(
                f"preempted by a stop signal at update {stopped_at}: wrote "
                f"{files.step_file(stopped_at)} and {files.LAST} in {self.output_dir}",
                step=stopped_at,
            )

    def _end(self, status: str) -> None:
        try:
            self._hook.on_fit_end(trainer=self.view, status=status)
        except Exception as exc:  # noqa: BLE001 - the run's outcome is already decided
            log.failure("on_fit_end failed", exc)

    def _update(self, step: int) -> bool:
        """One update under the protocol; True when the run was asked to stop after it."""
        log.set_step(step)
        last, weight, weighted_loss, failure = self._compute(step)
        stop = self._stop_signals is not None and self._stop_signals.requested
        agreed = distributed.agree(
            weight, weighted_loss, failure[0] if failure else None, self.device, stop
        )
        if agreed.failed:
            distributed.raise_agreed_failure(agreed, failure[1] if failure else None)
        assert last is not None
        self._backward(*last, agreed.total_weight)
        lr = self.optimizer.param_groups[0]["lr"]  # this update's rate, before the schedule steps
        grad_norm = self._step_optimizer(agreed.total_weight)
        if self.ema is not None:
            self.ema.update()
        if not self._buckets_rebuilt:
            self._rebuild_buckets_once()
        self.step = step
        self._commit(step, last[0], agreed, lr, grad_norm)
        return agreed.stop

    def _compute(self, step: int):
        """Sample and run the objective for each micro-batch, back-propagating all but the
        last locally (no collective). Returns ``(last, weight, weighted loss, failure)``:
        the last micro-batch's (result, weight), back-propagated after the agreement, and
        this rank's sums over its micro-batches; a failure is returned, to be agreed on."""
        failure, self._held = self._held, None
        self.optimizer.zero_grad(set_to_none=True)
        if failure is not None:
            return None, 0.0, 0.0, failure
        count = self.config.accumulate
        weight_sum = loss_sum = 0.0
        last = None
        phase = "sampling"
        try:
            for micro in range(count):
                final = micro == count - 1
                phase = "sampling"
                batch = self._calls.sample(trainer=self.view, generator=self.generator, step=step)
                if batch is None:
                    raise PluginError(
                        "sample returned None (the model plugin's sample must return the batch)"
                    )
                phase = "objective"
                if self._ddp is None and self._precision.dtype is None:
                    # one process in fp32: no wrapper, no context to enter on the hot path
                    result = self._objective.forward(batch, step)
                else:
                    with self._sync(final), self._precision.autocast():
                        wrapped = self._ddp if self._ddp is not None else self._objective
                        result = wrapped(batch, step)
                if isinstance(result.weight, (str, bytes, bool)):  # float() would take "5"
                    raise PluginError(
                        f"LossResult.weight must be a number or a tensor, got {result.weight!r}"
                    )
                weight = float(result.weight)
                if not math.isfinite(weight) or weight < 0:
                    raise PluginError(f"LossResult.weight must be finite and >= 0, got {weight}")
                # read once (a host sync on a GPU): scale_loss and the metrics see the float
                result.weight = weight
                if weight > 0:
                    loss = result.loss
                    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
                        raise PluginError(_not_differentiable(loss))
                    loss_value = float(loss.detach())
                    if not math.isfinite(loss_value):
                        phase = "non-finite loss"
                        raise SlhubError(f"loss is {loss_value} at update {step}")
                    weight_sum, loss_sum = weight_sum + weight, loss_sum + weight * loss_value
                if final:
                    last = (result, weight)
                else:
                    with self._sync(False):
                        self._backward(result, weight, None)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - every rank-local failure is agreed
            # on; sys.exit() in plugin code too, which would end this rank alone, silently
            if not isinstance(exc, SlhubError):
                log.failure(f"{phase} failed", exc)
            return None, 0.0, 0.0, (phase, exc)
        return last, weight_sum, loss_sum, None

    def _sync(self, final: bool) -> AbstractContextManager:
        """DDP reduces gradients only in the last micro-batch's backward."""
        return self._ddp.no_sync() if self._ddp is not None and not final else nullcontext()

    def _backward(self, result: LossResult, weight: float, total: float | None) -> None:
        """Back-propagate one micro-batch's share of ``sum(w * L) / sum(w)``.

        With one micro-batch ``total`` is the agreed total weight and ``scale_loss``
        makes the DDP mean exact. With several, the total is unknown until every
        micro-batch ran: each is scaled as if the total were ``world_size`` (``L * w``
        for the built-in weighting) and :meth:`_step_optimizer` divides the reduced
        sum by the total. A zero-weight micro-batch back-propagates an exact zero.
        """
        accumulating = self.config.accumulate > 1
        share = float(self.world_size) if accumulating else total
        if weight > 0 and (accumulating or (total or 0.0) > 0):
            scaled = self._calls.scale_loss(trainer=self.view, result=result, total_weight=share)
        else:
            scaled = self._exact_zero()
        if self._precision.scaler is not None:
            scaled = self._precision.scaler.scale(scaled)
        scaled.backward()

    def _step_optimizer(self, total: float) -> float | None:
        """Finish the gradient, clip it, step the optimizer (not on a zero-weight update)
        and the schedule (always). Returns the gradient norm when clipping is on."""
        grad_norm = None
        if total > 0:
            if self.config.accumulate > 1:
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                # torch's foreach ops have no public name (documented, beta, as torch._foreach_*;
                # clip_grad_norm_ and the optimizers use them); one fused kernel on a GPU.
                # Relied on since torch 2.4 (pyproject's floor), tested on 2.13.0.
                torch._foreach_mul_(grads, self.world_size / total)
            scaler = self._precision.scaler
            if self.config.grad_clip_norm is not None:
                params = [p for p in self.model.parameters() if p.grad is not None]
                if scaler is not None:
                    scaler.unscale_(self.optimizer)
                norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip_norm))
                grad_norm = norm if math.isfinite(norm) else None  # fp16 overflow: step skipped
            if scaler is not None:
                scaler.step(self.optimizer)  # skipped on every rank alike when grads overflow
                scaler.update()
            else:
                self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return grad_norm

    def _rebuild_buckets_once(self) -> None:
        """DDP rebuilds its gradient buckets with a broadcast inside the forward after its
        first backward. Doing it here, where every rank is known healthy, keeps a rank
        that fails before its next forward from leaving the others waiting."""
        assert self._ddp is not None
        # DDP has no public way to rebuild its buckets now; without the private method (tested
        # on torch 2.13.0, present since 1.x) DDP rebuilds them in its next forward, as usual.
        rebuild = getattr(self._ddp.reducer, "_rebuild_buckets", None)
        if rebuild is not None:
            rebuild()
        self._buckets_rebuilt = True

    def _commit(
        self,
        step: int,
        result: LossResult,
        agreed: distributed.Agreement,
        lr: float,
        grad_norm: float | None,
    ) -> None:
        """on_commit and the metrics line; a failure is held for the next agreement."""
        total = agreed.total_weight
        metrics: dict[str, Any] = {
            "step": step,
            "train/loss": agreed.weighted_loss_sum / total if total > 0 else None,
            "train/weight": total,
            "train/lr": lr,
        }
        if grad_norm is not None:
            metrics["train/grad_norm"] = grad_norm
        try:
            for key, value in result.metrics.items():
                metrics[f"train/{key}"] = _scalar(f"train/{key}", value)
            if self._calls.on_commit is not None:
                self._in_commit = True
                try:
                    self._calls.on_commit(
                        trainer=self.view, step=step, result=result, metrics=metrics
                    )
                finally:
                    self._in_commit = False
                metrics["step"] = step  # the one key a plugin may not change
            if self.is_main:
                self._log_line(metrics)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - held for the next agreement
            log.failure("commit failed", exc)
            self._held = ("commit", exc)

    def _exact_zero(self) -> torch.Tensor:
        """A zero loss touching every parameter: DDP still reduces, gradients are exactly 0."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.stack([p.reshape(-1)[:1].sum() for p in params]).sum() * 0.0

    def _validate(self, step: int) -> dict[str, Any]:
        """Rank 0: every plugin's ``validate``, logged; returns the metrics line."""
        with self.ema.swapped_in() if self.ema is not None else nullcontext():
            results = self._hook.validate(trainer=self.view, model=self.model, step=step)
        merged: dict[str, Any] = {}
        for part in results:
            for key, value in (part or {}).items():
                merged[f"validation/{key}"] = _scalar(f"validation/{key}", value)
        if merged:
            LOG.info("validation", **{k.split("/", 1)[1]: v for k, v in merged.items()})
            self._log_line({"step": step, **merged})
        return merged

    def _log_line(self, line: dict[str, Any]) -> None:
        """Rank 0: append a metrics line, then hand it to the loggers (``on_log``)."""
        assert self._metrics is not None
        self._metrics.append(line)
        if self._calls.on_log is not None:
            self._calls.on_log(trainer=self.view, step=line["step"], metrics=line)

    def _agree_final(self) -> None:
        failure, self._held = self._held, None
        agreed = distributed.agree(0.0, 0.0, failure[0] if failure else None, self.device)
        if agreed.failed:
            distributed.raise_agreed_failure(agreed, failure[1] if failure else None)

    # ------------------------------------------------------------------ saving

    def _state_failure(self, exc: BaseException) -> BaseException:
        """A plugin's plain exception in ``state_dict`` (its traceback is logged), for the
        run's one line: named after the plugin, not left as the checkpoint's I/O."""
        name = raised_by(exc, self._hook.state_dict)
        if isinstance(exc, SlhubError) or name == "a plugin":
            return exc
        return PluginError(f"{name} failed in state_dict: {one_line(exc)}")

    def _local_state(self) -> dict[str, Any]:
        """This rank's ``state_dict`` hook contributions, every plugin's merged (the
        manager adds the registered objects' state)."""
        local: dict[str, Any] = {}
        for part in self._calls.state_dict(trainer=self.view):
            for key, value in (part or {}).items():
                if key in local:
                    raise PluginError(f"two plugins contribute checkpoint key {key!r}")
                local[key] = value
        return local

    def save(self, name: str | None = None) -> Path | None:
        """Write a checkpoint of the committed state (``step_N.pt`` by default) and last.pt.

        From a ``validate`` implementation (rank 0) this writes the state gathered
        at the boundary, before validation, and issues no collective. Anywhere
        else every rank must call it: it gathers every rank's state first. Returns
        the path on rank 0, None elsewhere.
        """
        if self._in_commit:  # ranks reach on_commit at different times: it would hang
            raise PluginError(
                "trainer.save() from on_commit: it is a collective and on_commit must not "
                "call collectives; call it from validate (rank 0) or at the same point on "
                "every rank"
            )
        return self._checkpoints.save(self._local_state, name)


@dataclass(frozen=True)
class RunContext:
    """What the bootstrap hands the loop once the run directory is open: the identity
    checkpoints carry and the metrics log (rank 0; None elsewhere), the run id (every
    rank) and the stop signals installed for the run."""

    run_id: str | None
    identity: dict[str, Any] | None
    metrics: MetricsLog | None
    stop_signals: StopSignals | None


class _Calls:
    """The hooks the loop calls every update (and at boundaries), resolved once per run
    (:func:`slhub.registry.direct_caller`); a hook that no plugin implements is None
    (``on_commit``, ``on_log``) and is not called."""

    def __init__(self, plugins: Plugins) -> None:
        pm = plugins.manager
        self.sample = direct_caller(pm, "sample")
        self.objective = direct_caller(pm, "objective")
        self.scale_loss = direct_caller(pm, "scale_loss")
        self.state_dict = direct_caller(pm, "state_dict")
        implemented = {
            name for name in ("on_commit", "on_log") if getattr(pm.hook, name).get_hookimpls()
        }
        self.on_commit = direct_caller(pm, "on_commit") if "on_commit" in implemented else None
        self.on_log = direct_caller(pm, "on_log") if "on_log" in implemented else None


def _not_differentiable(loss: Any) -> str:
    """Why ``LossResult.loss`` cannot be back-propagated (its backward would fail after
    the agreement, outside the protocol, on this rank alone)."""
    if not isinstance(loss, torch.Tensor):
        return f"LossResult.loss must be a tensor, got {type(loss).__name__}"
    return (
        "LossResult.loss does not require grad (detached, or computed without the model's "
        "parameters, or under torch.no_grad): nothing to back-propagate"
    )


def _scalar(name: str, value: Any) -> Any:
    """A metric (``LossResult.metrics``, ``validate``) as a number: a tensor is detached
    first (``float()`` of one that requires grad prints torch's warning) and must hold
    one element."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise SlhubError(
                f"metric {name} is a tensor of shape {list(value.shape)}; a metric is one "
                "number (a float or a one-element tensor)"
            )
        return value.detach().item()
    return value
