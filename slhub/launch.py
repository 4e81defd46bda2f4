"""``slhub launch``: torch's elastic agent (what torchrun runs), in this process, ending
with slhub's exit statuses and one line.

torchrun ends every failed or preempted job with its own status 1 and pages of agent
tracebacks, so a batch script cannot tell a bad recipe from a preemption. Here the
same agent runs the workers (``python -m slhub train ...``, torchrun's options and
environment unchanged), and each worker reports how it ended in a record of its own
(:func:`report`: its exit status, the one line it would have printed and, for an
agreed failure, the rank it started on) instead of printing that line. The launcher
prints one line and exits with:

- 0: every worker finished;
- 75: a worker was preempted (the checkpoint of its last update is written);
- 2: every worker that failed refused bad input or an agreed failure;
- 130: interrupted (Ctrl-C); 128+N: the launcher got signal N and the workers did
  not checkpoint (a signal during startup);
- 1: anything else: a worker died or hit a bug, or the rendezvous failed.

Stop signals that reach the launcher are forwarded to the workers by the agent
(SIGUSR1 and SIGUSR2 too, unless ``--signals-to-handle`` says otherwise), so a
preempted launcher ends with the workers' checkpoint and 75. torch is imported only
when a launch starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from slhub.errors import SlhubError, one_line, shown

#: The directory where workers of ``slhub launch`` leave their records.
STATUS_ENV = "SLHUB_LAUNCH_STATUS"
#: The launch command (``slhub launch`` and its torchrun options) for the resume hint.
COMMAND_ENV = "SLHUB_LAUNCH_COMMAND"

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75  # as slhub.preemption.EXIT_PREEMPTED, without importing it here
EXIT_INTERRUPTED = 130

#: torchrun's default signals to forward, plus slhub's other stop signals.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"

USAGE = "slhub launch [torchrun options] train --config RECIPE.yaml [train options]"
DESCRIPTION = """\
Run `slhub train` on this node's workers under torch's elastic agent (the program
behind torchrun: every torchrun option and PET_* variable works the same), and end
with slhub's exit status and one line on stderr."""
EXAMPLES = """exit status:
  0    done
  2    bad input or a failure every worker agreed on (the line names it)
  75   preempted by a stop signal: the checkpoint is written; rerun with --resume auto
  130  interrupted (Ctrl-C); 128+N: signal N before the workers could checkpoint
  1    a worker died or hit a bug, or the rendezvous failed

examples:
  slhub launch --standalone --nproc-per-node=2 train --config examples/sl_ddp/cpu.yaml
  slhub launch --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
      --rdzv-endpoint=HOST:29500 --rdzv-id=JOB train --config R.yaml --resume auto
"""


# --- the worker's side --------------------------------------------------------------


def report(code: int, line: str, origin_rank: int | None = None) -> bool:
    """Under ``slhub launch``, record how this worker ends instead of printing its line.

    :param code: the worker's exit status.
    :param line: the final line the worker would print.
    :param origin_rank: for an agreed failure, the rank it started on.
    :returns: False outside ``slhub launch`` (the caller prints the line itself), or
        when the record cannot be written (then the line must still be seen).
    """
    folder = os.environ.get(STATUS_ENV)
    if not folder or "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    rank = os.environ.get("RANK", "0")
    record = {
        "rank": int(rank),
        "code": code,
        "line": line,
        "origin": origin_rank,
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    }
    path = Path(folder) / f"{rank}.json"
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temporary.write_text(json.dumps(record))
        os.replace(temporary, path)  # the launcher never reads half a record
    except OSError:
        return False
    return True


def resume_launcher() -> str | None:
    """The launch command a worker of ``slhub launch`` names in its resume hint."""
    return os.environ.get(COMMAND_ENV) if STATUS_ENV in os.environ else None


# --- the launcher's side ------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How a launch ended: the exit status and what the one line says (or nothing):
    a worker's own ``line``, printed as it is, or the launcher's ``message``, printed in
    the train command's log format."""

    code: int
    line: str | None = None
    message: str | None = None

    def final_line(self, log_format: str) -> str | None:
        if self.message is None:
            return self.line
        from slhub.log import final_line

        return final_line(self.message, log_format)


def launch(
    argv: list[str],
    owns_process: bool = True,
    parse: Callable[[list[str]], argparse.Namespace] | None = None,
) -> int:
    """``slhub launch ARGV``: run the workers, print at most one line, return the status.

    :param argv: torchrun's options, ``train`` and the train command's arguments.
    :param owns_process: this command is the process (the console script): a stop
        signal after the workers ended is then ignored, so it cannot change the status.
    :param parse: the command line's parser (``slhub.cli``'s, which calls this module:
        passed in rather than imported, so the two modules do not import each other).
    """
    if parse is None:
        raise TypeError("launch needs the command line's parser")
    try:
        args, prefix = _parse(argv)
        # the train command's usage errors and --help, here once instead of on every worker
        train = parse(args.training_script_args)
    except SlhubError as exc:
        _final_line(f"slhub: error: {exc}")
        return EXIT_USAGE
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    outcome = _run(args, prefix, owns_process)
    line = outcome.final_line(train.log_format)
    if line:
        _final_line(line)
    return outcome.code


def _final_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


#: torchrun's options that choose the program it runs: ``slhub train`` here.
_PROGRAM_OPTIONS = ("module", "no_python", "run_path")


def _usage_error(message: str) -> NoReturn:
    """torchrun's parser prints its usage and a message; a launch says it in one line."""
    raise SlhubError(f"launch: {message} (see `slhub launch --help`)")


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """torchrun's options, checked by torchrun's own parser, and the ``train`` arguments.

    Returns the namespace (set to run ``python -m slhub train ...``) and the words of
    the launch command before ``train``.
    """
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.error = _usage_error  # type: ignore[method-assign]
    parser.prog = "slhub launch"
    parser.usage = USAGE
    parser.description = DESCRIPTION
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:  # what torchrun runs is not the user's to choose here
        if action.dest in ("training_script", "training_script_args", *_PROGRAM_OPTIONS):
            action.help = argparse.SUPPRESS
    args = parser.parse_args(argv)
    if args.training_script != "train":
        raise SlhubError(
            f"launch: expected `train` after the torchrun options, got "
            f"{args.training_script!r:.60} (usage: {USAGE})"
        )
    if any(getattr(args, name) for name in _PROGRAM_OPTIONS):
        raise SlhubError(
            "launch: --module, --no-python and --run-path choose the program torchrun "
            "runs; slhub launch always runs `slhub train`"
        )
    _check_nproc(args.nproc_per_node)
    prefix = argv[: len(argv) - 1 - len(args.training_script_args)]
    if not any(w.startswith(("--signals-to-handle", "--signals_to_handle")) for w in prefix):
        if "PET_SIGNALS_TO_HANDLE" not in os.environ:
            args.signals_to_handle = SIGNALS_TO_HANDLE
    args.module = True
    args.training_script = "slhub"
    args.training_script_args = ["train", *args.training_script_args]
    return args, prefix


#: The words ``--nproc-per-node`` takes besides a count (torchrun's device kinds).
_NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


def _check_nproc(value: Any) -> None:
    """Refuse a ``--nproc-per-node`` (or ``PET_NPROC_PER_NODE``) below 1 by name: torchrun
    would fail deep in its agent with a bare ``AssertionError``."""
    text = str(value).strip()
    try:
        count = int(text)
    except ValueError:
        import torch

        if text in _NPROC_WORDS or text == torch._C._get_privateuse1_backend_name():
            return
        raise SlhubError(
            f"launch: --nproc-per-node must be a count >= 1 or one of {', '.join(_NPROC_WORDS)} "
            f"(got {shown(text, quote=True)})"
        ) from None
    if count < 1:
        raise SlhubError(f"launch: --nproc-per-node must be >= 1 (got {count})")


def _run(args: argparse.Namespace, prefix: list[str], owns_process: bool) -> Outcome:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import launch_agent

    _quiet_torch_logging()
    try:
        _rendezvous_defaults(args, torchrun)
        config, entrypoint, entry_args = torchrun.config_from_args(args)
    except (ValueError, AssertionError, RuntimeError) as exc:
        return Outcome(EXIT_USAGE, message=f"launch: {one_line(exc)}")
    folder = tempfile.mkdtemp(prefix="slhub-launch-")
    saved = {name: os.environ.get(name) for name in (STATUS_ENV, COMMAND_ENV)}
    os.environ[STATUS_ENV] = folder  # the workers inherit the agent's environment
    os.environ[COMMAND_ENV] = shlex.join(["slhub", "launch", *prefix])
    handled = _signals(getattr(config, "signals_to_handle", SIGNALS_TO_HANDLE))
    previous = {signum: signal.getsignal(signum) for signum in handled}
    try:
        try:
            launch_agent(config, entrypoint, list(entry_args))
        finally:
            # the agent's handlers stay installed and would raise into the exit; the
            # outcome is decided now, so a late stop signal is ignored (or the caller's
            # handlers come back when it owns the process)
            for signum in handled:
                signal.signal(signum, signal.SIG_IGN if owns_process else previous[signum])
    except ChildFailedError as exc:
        return _failed(exc.failures, _records(folder))
    except SignalException as exc:
        return _signalled(exc.sigval, _records(folder))
    except Exception as exc:  # noqa: BLE001 - the rendezvous or the agent itself
        return Outcome(EXIT_FAILED, message=f"launch failed: {one_line(exc)}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return Outcome(0)


def _rendezvous_defaults(args: argparse.Namespace, torchrun: Any) -> None:
    """What torchrun's ``run()`` does to the options before ``config_from_args``:
    ``--standalone`` is a c10d rendezvous on a free local port, and one node without
    an endpoint gets the same."""
    import uuid

    if args.standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        _, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
        if max_nodes == 1:
            args.rdzv_backend = "c10d"
            args.rdzv_endpoint = "localhost:0"
            args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def _quiet_torch_logging() -> None:
    """Keep the agent's log (closing signals, failure summaries) off the console: the
    launcher's one line says how the run ended. ``LOGLEVEL`` set in the environment
    (torch elastic's own switch) keeps it."""
    if "LOGLEVEL" in os.environ:
        return
    silent = logging.CRITICAL + 1
    for name in list(logging.Logger.manager.loggerDict):
        if name == "torch.distributed" or name.startswith("torch.distributed."):
            logging.getLogger(name).setLevel(silent)
    # loggers made later (the rendezvous backends load on demand) set their own level:
    # their records are dropped where they would be written
    logger: logging.Logger | None = logging.getLogger("torch.distributed")
    while logger is not None:
        for handler in logger.handlers:
            handler.addFilter(_not_torch_distributed)
        logger = logger.parent if logger.propagate else None


def _not_torch_distributed(record: logging.LogRecord) -> bool:
    return not record.name.startswith("torch.distributed")


def _signals(names: str) -> list[int]:
    """The signal numbers in a ``--signals-to-handle`` list (unknown names skipped)."""
    found = (getattr(signal, name.strip(), None) for name in names.split(","))
    return [signum for signum in found if isinstance(signum, signal.Signals)]


def _records(folder: str) -> dict[int, dict[str, Any]]:
    """The workers' records of the last attempt (``--max-restarts`` reruns them), by rank."""
    found: dict[int, dict[str, Any]] = {}
    for path in Path(folder).glob("[0-9]*.json"):
        try:
            record = json.loads(path.read_text())
            found[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    last = max((r.get("attempt", 0) for r in found.values()), default=0)
    return {rank: r for rank, r in found.items() if r.get("attempt", 0) == last}


#: How the agent ends the workers it stops after the first failure.
_TEARDOWN = (-signal.SIGTERM, -signal.SIGKILL)


def _failed(failures: dict[int, Any], records: dict[int, dict[str, Any]]) -> Outcome:
    """The status and line of a run whose workers failed.

    ``failures`` (by global rank) are the workers the agent saw fail, and those it then
    stopped: a worker whose record says how it ended counts with the record's status
    (the agent's SIGTERM may have met it on its way out); one without a record died
    (a signal, ``os._exit``, a bug's traceback), and unless the agent's teardown killed
    it, it is the cause and the others' records are consequences.
    """
    died = {rank: f for rank, f in failures.items() if rank not in records}
    codes = {r["code"] for rank, r in records.items() if rank in failures}
    if EXIT_PREEMPTED in codes:
        return Outcome(EXIT_PREEMPTED, _chosen_line(records, EXIT_PREEMPTED))
    if codes == {EXIT_USAGE} and all(f.exitcode in _TEARDOWN for f in died.values()):
        return Outcome(EXIT_USAGE, _chosen_line(records, EXIT_USAGE))
    causes = sorted(died.items(), key=lambda item: (_cause_order(item[1]), item[0]))
    if causes and causes[0][1].exitcode not in _TEARDOWN:
        return Outcome(EXIT_FAILED, message=_death(*causes[0]))
    own = [r["line"] for rank, r in sorted(records.items()) if r["code"] == EXIT_FAILED]
    if own:  # a worker that lost the others (its peer died on another node)
        return Outcome(EXIT_FAILED, own[0])
    rank, failure = causes[0] if causes else min(failures.items())
    return Outcome(EXIT_FAILED, message=_death(rank, failure))


def _cause_order(failure: Any) -> tuple[int, int]:
    """Which dead worker to name: an exit status before a signal, any signal before the
    SIGTERM the agent sends when it stops the others, then the earliest."""
    code = failure.exitcode
    kind = 0 if code >= 0 else 2 if code == -signal.SIGTERM else 1
    return kind, failure.timestamp


def _signalled(sigval: int, records: dict[int, dict[str, Any]]) -> Outcome:
    """The launcher got a stop signal; the agent forwarded it and waited for the workers."""
    codes = {r["code"] for r in records.values()}
    if EXIT_PREEMPTED in codes:
        return Outcome(EXIT_PREEMPTED, _chosen_line(records, EXIT_PREEMPTED))
    if codes == {EXIT_INTERRUPTED}:
        return Outcome(EXIT_INTERRUPTED, _chosen_line(records, EXIT_INTERRUPTED))
    name = signal.Signals(sigval).name
    return Outcome(
        128 + int(sigval),
        message=f"{name}: the workers stopped without a checkpoint of this attempt "
        "(before their first update, or without stop_signals); --resume auto continues "
        "from the last checkpoint",
    )


def _chosen_line(records: dict[int, dict[str, Any]], code: int) -> str | None:
    """One worker's line for ``code``: an agreed failure's origin rank names its cause,
    the others point to it; otherwise the lowest rank's."""
    same = {rank: r for rank, r in records.items() if r["code"] == code}
    for rank, record in sorted(same.items()):
        if record.get("origin") == rank:
            return record["line"]
    return same[min(same)]["line"] if same else None


def _death(rank: int, failure: Any) -> str:
    """A worker that ended without slhub's line, in one line."""
    code = failure.exitcode
    how = f"was killed by {failure.signal_name()}" if code < 0 else f"exited with status {code}"
    where = "its traceback is above" if code == EXIT_FAILED else "the others were stopped"
    return (
        f"worker rank {rank} (pid {failure.pid}) {how} ({where}); --resume auto continues "
        "from the last checkpoint"
    )
