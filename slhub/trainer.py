"""The training loop. Its whole protocol, on every rank, is this:

    admission:  load recipe, plugins, model, optimizer, checkpoint   (errors caught)
                agree()                                    # everyone built, or all fail
                rank 0 claims output_dir (or checks it for an in-place resume)
                agree()                                    # everyone may start, or all fail
    for step in start+1 .. steps:
        err = None
        try:    batch = sample(generator); result = objective(batch)   # inside DDP
        except: err = (phase, exception)
        agreed = agree(result.weight, weight*loss, err or held)   # ONE all_reduce per update
                                                   # (+1 naming the origin, only on failure)
        if agreed.failed: raise the same RankFailure on every rank (origin rank, phase)
        if agreed.total_weight == 0: backward(exact zero); no optimizer step (skipped update)
        elif result.weight == 0:     backward(exact zero)               # contributes nothing
        else: backward(scale_loss(result, total))  # DDP mean -> sum(w_r L_r) / sum(w_r)
        optimizer.step(); on_commit(...); rank 0 appends the metrics line
        if boundary: committed = gather every rank's save() state      # collective, all ranks
        if validation step and rank 0: validate(...)       # errors held for the next agree
        if save step and rank 0: write committed            # errors held for the next agree
    final agree(): surfaces an error held from the last boundary

DDP wraps the objective computation (model + loss), never ``trainer.model``,
which stays the original module for validation, saving and export.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pluggy
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from slhub import artifacts, checkpoint, distributed, log, registry, rng
from slhub.errors import CheckpointError, PluginError, SlhubError
from slhub.hookspecs import LossResult
from slhub.recipe import Recipe, load_recipe

LOG = log.get_logger()


def sampler_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s sampler generator (tests rebuild batches with it)."""
    return rng.derived_seed(seed, rank, "sampler")


class _Objective(nn.Module):
    """The module DDP wraps: the model plus the objective hook, so DDP sees the loss graph."""

    def __init__(self, model: nn.Module, trainer: Trainer) -> None:
        super().__init__()
        self.model = model
        self._trainer = [trainer]  # a list keeps the trainer out of the module tree

    def forward(self, batch: Any) -> LossResult:
        trainer = self._trainer[0]
        result = trainer.hook.objective(trainer=trainer, model=self.model, batch=batch)
        if not isinstance(result, LossResult):
            raise PluginError(
                f"objective returned {type(result).__name__}, expected slhub.LossResult"
                if result is not None
                else "no plugin implements objective"
            )
        return result


class Trainer:
    """One rank's training state; passed to every hook as ``trainer``."""

    def __init__(
        self,
        recipe: Recipe,
        pm: pluggy.PluginManager,
        plugin_source: registry.PluginSource,
        device: torch.device,
    ) -> None:
        self.recipe = recipe
        self.config = recipe.trainer
        self.pm = pm
        self.hook = pm.hook
        self.plugin_source = plugin_source
        self.device = device
        self.rank = distributed.rank()
        self.world_size = distributed.world_size()
        self.is_main = self.rank == 0
        self.output_dir = Path(self.config.output_dir)
        self.step = 0
        self.identity: dict[str, Any] | None = None
        self.metrics: artifacts.MetricsLog | None = None
        self._committed: list[dict[str, Any]] | None = None
        self._committed_step = -1
        self._in_validation = False
        self._held: tuple[str, BaseException] | None = None

        rng.seed_everything(self.config.seed)  # identical model init on every rank
        model = self.hook.build_model(trainer=self)
        if not isinstance(model, nn.Module):
            raise PluginError(
                f'slhub plugin "{plugin_source.name}" build_model returned '
                f"{type(model).__name__}, expected torch.nn.Module"
            )
        self.model: nn.Module = model.to(device)
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.config.lr)
        self.generator = torch.Generator().manual_seed(sampler_seed(self.config.seed, self.rank))
        rng.seed_everything(rng.derived_seed(self.config.seed, self.rank, "process"))
        self._objective = _Objective(self.model, self)
        self._ddp: DistributedDataParallel | None = None
        self._buckets_rebuilt = False

    # ------------------------------------------------------------------ access

    def section(self, name: str) -> Any:
        """The validated recipe section ``name`` owned by a plugin."""
        try:
            return self.recipe.sections[name]
        except KeyError:
            raise PluginError(f"recipe has no validated section {name!r}") from None

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    # ----------------------------------------------------------------- resume

    def load(self, ckpt: dict[str, Any]) -> None:
        """Load model, optimizer and this rank's state from a checkpoint (every rank)."""
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            reason = " ".join(str(exc).split())[:300]
            raise CheckpointError(
                f"checkpoint does not fit this recipe's model: {reason}"
            ) from None
        self.step = int(ckpt["step"])
        try:
            self.hook.restore(trainer=self, state=checkpoint.rank_state(ckpt, self.rank))
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            reason = " ".join(str(exc).split())[:200] or exc.__class__.__name__
            raise CheckpointError(
                f"checkpoint's state for rank {self.rank} cannot be restored "
                f"({exc.__class__.__name__}: {reason})"
            ) from None
        if self.step >= self.config.steps:
            raise CheckpointError(
                f"checkpoint is at update {self.step} and trainer.steps is {self.config.steps}: "
                "nothing to train; raise trainer.steps to continue"
            )

    # ------------------------------------------------------------------- loop

    def fit(self) -> None:
        """Run updates ``step + 1 .. steps`` under the step protocol."""
        if distributed.world_size() > 1:
            with warnings.catch_warnings():
                # torch 2.13 deprecates broadcast_buffers, but its replacement still
                # broadcasts rank 0's buffers at construction, which would overwrite the
                # per-rank buffers just restored; torch's own warning says to keep it.
                warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")
                self._ddp = DistributedDataParallel(
                    self._objective,
                    device_ids=[self.device.index] if self.device.type == "cuda" else None,
                    broadcast_buffers=False,
                )
        try:
            for step in range(self.step + 1, self.config.steps + 1):
                self._update(step)
                self._boundary(step)
            self._agree_final()
        finally:
            self._ddp = None  # drop the wrapper before the process group goes away

    def _update(self, step: int) -> None:
        log.bind(step=step)
        result: LossResult | None = None
        failure: tuple[str, BaseException] | None = self._held
        self._held = None
        weight = loss_value = 0.0
        if failure is None:
            phase = "sampling"
            try:
                batch = self.hook.sample(trainer=self, generator=self.generator)
                if batch is None:
                    raise PluginError("no plugin implements sample")
                phase = "objective"
                result = (self._ddp or self._objective)(batch)
                weight = float(result.weight)
                if not distributed.finite(weight) or weight < 0:
                    raise ValueError(f"LossResult.weight must be finite and >= 0, got {weight}")
                if weight > 0:
                    loss_value = float(result.loss.detach())
                    if not distributed.finite(loss_value):
                        phase = "non-finite loss"
                        raise FloatingPointError(f"loss is {loss_value} at update {step}")
            except Exception as exc:  # noqa: BLE001 - every rank-local failure is agreed on
                failure = (phase, exc)
        agreed = distributed.agree(
            weight, weight * loss_value, failure[0] if failure else None, self.device
        )
        if agreed.failed:
            distributed.raise_agreed_failure(agreed, failure[1] if failure else None)
        assert result is not None
        self.optimizer.zero_grad(set_to_none=True)
        if agreed.total_weight > 0 and weight > 0:
            scaled = self.hook.scale_loss(
                trainer=self, result=result, total_weight=agreed.total_weight
            )
        else:
            scaled = self._exact_zero()
        scaled.backward()
        if agreed.total_weight > 0:
            self.optimizer.step()
        if self._ddp is not None and not self._buckets_rebuilt:
            # DDP rebuilds its gradient buckets with a broadcast inside the forward after
            # its first backward. Doing it here, where every rank is known healthy, keeps
            # a rank that fails before its next forward from leaving the others waiting.
            rebuild = getattr(self._ddp.reducer, "_rebuild_buckets", None)
            if rebuild is not None:
                rebuild()
            self._buckets_rebuilt = True
        self.step = step
        metrics: dict[str, Any] = {
            "step": step,
            "train/loss": (
                agreed.weighted_loss_sum / agreed.total_weight if agreed.total_weight > 0 else None
            ),
            "train/weight": agreed.total_weight,
        }
        try:
            metrics.update({f"train/{k}": _scalar(v) for k, v in result.metrics.items()})
            self.hook.on_commit(trainer=self, step=step, result=result, metrics=metrics)
            if self.is_main:
                assert self.metrics is not None
                self.metrics.append(metrics)
                if step == 1 or step % max(1, self.config.steps // 10) == 0:
                    LOG.info("update", loss=metrics["train/loss"], weight=agreed.total_weight)
        except Exception as exc:  # noqa: BLE001 - held for the next agreement
            LOG.error("commit failed", error=str(exc))
            self._held = ("commit", exc)

    def _exact_zero(self) -> torch.Tensor:
        """A zero loss touching every parameter: DDP still reduces, gradients are exactly 0."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.stack([p.reshape(-1)[:1].sum() for p in params]).sum() * 0.0

    def _boundary(self, step: int) -> None:
        cfg = self.config
        validate_now = cfg.validate_every > 0 and step % cfg.validate_every == 0
        save_now = (cfg.save_every > 0 and step % cfg.save_every == 0) or step == cfg.steps
        if not (validate_now or save_now):
            return
        self._committed = self._gather_committed()
        self._committed_step = step
        if not self.is_main or self._held is not None:
            return
        if validate_now:
            try:
                self._validate(step)
            except Exception as exc:  # noqa: BLE001 - held for the next agreement
                LOG.error("validation failed", error=str(exc))
                self._held = ("validation", exc)
                return
        if save_now and self._committed is not None:  # None: another rank failed to gather
            try:
                self._write(f"step_{step}.pt")
            except Exception as exc:  # noqa: BLE001 - held for the next agreement
                LOG.error("checkpoint write failed", error=str(exc))
                self._held = ("checkpoint I/O", exc)

    def _validate(self, step: int) -> None:
        self._in_validation = True
        try:
            results = self.hook.validate(trainer=self, model=self.model, step=step)
        finally:
            self._in_validation = False
        merged: dict[str, Any] = {}
        for part in results:
            if part:
                merged.update({f"validation/{k}": _scalar(v) for k, v in part.items()})
        if merged:
            assert self.metrics is not None
            self.metrics.append({"step": step, **merged})
            LOG.info("validation", **{k.split("/", 1)[1]: v for k, v in merged.items()})

    def _agree_final(self) -> None:
        failure, self._held = self._held, None
        agreed = distributed.agree(0.0, 0.0, failure[0] if failure else None, self.device)
        if agreed.failed:
            distributed.raise_agreed_failure(agreed, failure[1] if failure else None)

    # ------------------------------------------------------------------ saving

    def _gather_committed(self) -> list[dict[str, Any]] | None:
        """Every rank's ``save`` contributions, gathered to rank 0 (a collective).

        Each rank pickles its state itself, once, and sends the bytes: a state
        that cannot be pickled fails on its own rank, outside the collective. A
        rank whose contributions fail still joins the gather, sending None, so
        no rank is left waiting; the error is held for the next agreement and
        rank 0 writes nothing from this boundary.
        """
        payload: bytes | None
        try:
            payload = pickle.dumps(self._local_state())
        except Exception as exc:  # noqa: BLE001 - held for the next agreement
            LOG.error("checkpoint state failed", error=str(exc))
            self._held = self._held or ("checkpoint I/O", exc)
            payload = None
        gathered = distributed.gather_to_rank0(payload)
        if gathered is None or any(entry is None for entry in gathered):
            return None
        return [pickle.loads(entry) for entry in gathered]

    def _local_state(self) -> dict[str, Any]:
        local: dict[str, Any] = {}
        for part in self.hook.save(trainer=self):
            for key, value in (part or {}).items():
                if key in local:
                    raise PluginError(f"two plugins contribute checkpoint key {key!r}")
                local[key] = value
        return local

    def save(self, name: str | None = None) -> Path | None:
        """Write a checkpoint of the committed state (``step_N.pt`` by default) and last.pt.

        From a ``validate`` implementation (rank 0) this writes the state gathered
        at the boundary before validation and issues no collective. Anywhere else
        every rank must call it: it gathers every rank's state first. Returns the
        path on rank 0, None elsewhere.
        """
        if not self._in_validation:
            self._committed = self._gather_committed()
            self._committed_step = self.step
        if not self.is_main:
            return None
        return self._write(name or f"step_{self._committed_step}.pt")

    def _write(self, name: str) -> Path:
        if self._committed is None:
            raise SlhubError(f"no committed state to write to {name}: a rank failed to gather")
        assert self.identity is not None
        ckpt = {
            "format": checkpoint.FORMAT_V2,
            "step": self._committed_step,
            "run": self.identity,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None,
            "ranks": self._committed,
            "plugins": {self.plugin_source.name: self.plugin_source.to_dict()},
        }
        path = self.output_dir / name
        checkpoint.save_checkpoint(ckpt, path, self.output_dir / "last.pt")
        if self.metrics is not None:
            self.metrics.sync()
        LOG.info("checkpoint", path=str(path))
        return path


def _scalar(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().item()
    return value


# ---------------------------------------------------------------------- entry


def _admit(config: str, overrides: list[str], resume: str | None, device: torch.device):
    """Everything a rank builds before training, with no side effects; raises on bad input."""
    recipe = load_recipe(config, overrides)
    pm, source = registry.build_manager(recipe.plugin)
    sections: dict[str, Any] = {}
    for part in pm.hook.recipe_sections():
        for name, model in (part or {}).items():
            if name in sections or name in ("plugin", "trainer"):
                raise PluginError(f"recipe section {name!r} is claimed twice")
            sections[name] = model
    recipe.validate_sections(sections)
    ckpt = None
    if resume is not None:
        ckpt = checkpoint.load_checkpoint(resume)
        checkpoint.check_resume_compatible(
            ckpt,
            resume,
            recipe=recipe.to_dict(),
            plugin_source=source.to_dict(),
            world_size=distributed.world_size(),
        )
    trainer = Trainer(recipe, pm, source, device)
    if ckpt is not None:
        trainer.load(ckpt)
    return trainer, ckpt


def _agree_or_raise(error: BaseException | None, device: torch.device) -> None:
    """Admission agreement: every rank fails together, naming the origin rank.

    On one process a bad-input error is raised as it is (its message is the
    whole story); anything else is reported like a rank failure.
    """
    if distributed.world_size() == 1 and (error is None or isinstance(error, SlhubError)):
        if error is not None:
            raise error
        return
    agreed = distributed.agree(0.0, 0.0, "admission" if error else None, device)
    if agreed.failed:
        distributed.raise_agreed_failure(agreed, error)


def _open_artifacts(trainer: Trainer, ckpt: dict[str, Any] | None, resume: str | None) -> None:
    """Rank 0: claim a fresh output dir, or reopen the checkpoint's own run in place."""
    folder = trainer.output_dir
    ckpt_run = ckpt.get("run") if ckpt is not None else None
    in_place = False
    if ckpt is not None:
        in_place = artifacts.check_resume_destination(folder, ckpt_run, int(ckpt["step"]))
    if in_place:
        trainer.identity = ckpt_run
    else:
        from slhub import __version__

        resumed_from = None
        if ckpt is not None:
            resumed_from = {
                "run_id": ckpt_run.get("run_id") if ckpt_run else None,
                "step": int(ckpt["step"]),
                "checkpoint": str(resume),
                "sha256": checkpoint.sha256_file(resume),
            }
        trainer.identity = artifacts.new_identity(
            recipe=trainer.recipe.to_dict(),
            recipe_digest=trainer.recipe.digest(),
            world_size=trainer.world_size,
            source={
                "slhub": __version__,
                "torch": str(torch.__version__),
                "plugin": trainer.plugin_source.to_dict(),
            },
            resumed_from=resumed_from,
        )
        artifacts.claim(folder, trainer.identity)
    trainer.metrics = artifacts.MetricsLog(folder / artifacts.METRICS_FILE)


def _peek_launch_settings(config: str, overrides: list[str]) -> tuple[str, float]:
    """Device choice and timeout for the process group, read before admission.

    A recipe that does not load yields the defaults here; admission then fails
    on every rank together through the process group.
    """
    try:
        recipe = load_recipe(config, overrides)
    except SlhubError:
        return "auto", 600.0
    return recipe.trainer.device, recipe.trainer.timeout_s


def train(
    config: str,
    overrides: list[str] | None = None,
    resume: str | None = None,
    log_format: str = "console",
) -> Path:
    """Run a recipe on this process (one rank of a torchrun job, or alone).

    Returns the output directory. Every rank-local error is agreed on, so all
    ranks raise the same :class:`~slhub.errors.SlhubError` together.
    """
    overrides = list(overrides or [])
    log.configure(log_format, distributed.env_rank(), distributed.env_world_size())
    device_choice, timeout_s = _peek_launch_settings(config, overrides)
    with distributed.distributed_run(device_choice, timeout_s) as device:
        trainer: Trainer | None = None
        error: BaseException | None = None
        ckpt: dict[str, Any] | None = None
        try:
            trainer, ckpt = _admit(config, overrides, resume, device)
        except Exception as exc:  # noqa: BLE001 - agreed on below
            error = _logged(exc)
        _agree_or_raise(error, device)
        assert trainer is not None
        if trainer.is_main:
            try:
                _open_artifacts(trainer, ckpt, resume)
            except Exception as exc:  # noqa: BLE001 - agreed on below
                error = _logged(exc)
        _agree_or_raise(error, device)
        del ckpt
        run_id = distributed.broadcast_from_rank0(
            trainer.identity["run_id"] if trainer.identity else None
        )
        log.bind(run_id=run_id)
        LOG.info(
            "start",
            recipe=config,
            plugin=trainer.plugin_source.name,
            device=str(device),
            start_step=trainer.step,
            steps=trainer.config.steps,
            output_dir=str(trainer.output_dir),
        )
        try:
            trainer.fit()
        except Exception as exc:
            _logged(exc)
            raise
        finally:
            if trainer.metrics is not None:
                trainer.metrics.close()
        LOG.info("done", step=trainer.step)
        return trainer.output_dir


def _logged(exc: BaseException) -> BaseException:
    """Log a traceback for errors that are bugs rather than bad input."""
    if not isinstance(exc, SlhubError):
        LOG.error("unexpected error", exc_info=exc)
    return exc
