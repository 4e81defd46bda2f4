"""``slhub launch``: torch's elastic agent (what torchrun runs), in this process, ending
with slhub's exit statuses and one line.

torchrun ends every failed or preempted job with its own status 1 and pages of agent
tracebacks, so a batch script cannot tell a bad recipe from a preemption. Here the
same agent runs the workers (``python -m slhub train ...``, torchrun's options and
environment unchanged), and each worker reports how it ended in a record of its own
(:func:`report`: its exit status, the one line it would have printed and, for an
agreed failure, the rank it started on) instead of printing that line. The launcher
prints one line and exits with:

- 0: every worker finished (each leaves a done record: a stop signal that reaches
  the launcher on the last update or after it leaves the status 0);
- 75: a worker was preempted (the checkpoint of its last update is written);
- 2: every worker that failed refused bad input or an agreed failure;
- 130: interrupted (Ctrl-C); 128+N: the launcher got signal N and the workers did
  not checkpoint (a signal during startup);
- 1: anything else: a worker died (one killed by SIGKILL is named as such: the
  out-of-memory killer's signal, never the SIGTERM of the agent's own teardown) or
  hit a bug, or the rendezvous failed.

The records live in a temporary folder, ``slhub-launch-PID-*`` (PID: the launcher's),
removed on every exit that runs code; a launcher killed by SIGKILL leaves its folder,
and the next launch removes it (never the folder of a launcher still running).

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
import re
import shlex
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from slhub.errors import SlhubError, one_line, shown, write_final_line

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


def report_done() -> bool:
    """Under ``slhub launch``, record that this worker finished (status 0, no line): a
    stop signal that reaches the launcher after it cannot turn a completed run into a
    failure. False outside ``slhub launch``."""
    return report(0, "")


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
        write_final_line(f"slhub: error: {exc}")
        return EXIT_USAGE
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    outcome = _run(args, prefix, owns_process)
    line = outcome.final_line(train.log_format)
    if line:
        write_final_line(line)
    return outcome.code


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
    # What torchrun runs is not the user's to choose here: hide those options from --help.
    # argparse has no public way to reach or change an action another module added (its
    # _actions list is unchanged since Python 3.2; requires-python >=3.10).
    for action in parser._actions:
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

        # torchrun compares with the same private name (torch has no public getter for the
        # privateuse1 backend's name); relied on since torch 2.4, tested on 2.13.0
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
    handled = _signals(getattr(config, "signals_to_handle", SIGNALS_TO_HANDLE))
    previous = {signum: signal.getsignal(signum) for signum in handled}
    # after the handlers: nothing comes back here
    after = {signum: signal.SIG_IGN if owns_process else previous[signum] for signum in handled}
    saved = {name: os.environ.get(name) for name in (STATUS_ENV, COMMAND_ENV)}
    folder: Path | None = None
    try:
        try:
            # a stop signal before the agent installs its handlers (the rendezvous) ends
            # the launch as one during the run does: with its line, the folder removed
            _set_handlers(dict.fromkeys(handled, _raise_signal))
            folder = _status_folder()
            os.environ[STATUS_ENV] = str(folder)  # the workers inherit the agent's environment
            os.environ[COMMAND_ENV] = shlex.join(["slhub", "launch", *prefix])
            launch_agent(config, entrypoint, list(entry_args))
        finally:
            # the agent's handlers stay installed and would raise into the exit; the
            # outcome is decided now, so a late stop signal is ignored (or the caller's
            # handlers come back when it owns the process)
            _set_handlers(after)
    except ChildFailedError as exc:
        records = _records(folder)
        return _completed(records, config.nproc_per_node) or _failed(exc.failures, records)
    except SignalException as exc:
        return _signalled(exc.sigval, _records(folder))
    except KeyboardInterrupt:  # SIGINT left out of --signals-to-handle
        return _signalled(signal.SIGINT, _records(folder))
    except Exception as exc:  # noqa: BLE001 - the rendezvous or the agent itself
        return Outcome(EXIT_FAILED, message=f"launch failed: {one_line(exc)}")
    finally:
        _set_handlers(after)  # again: a signal may have cut the first one short
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return Outcome(0)


def _raise_signal(signum: int, frame: Any) -> NoReturn:
    """Until the agent installs its own: a stop signal raises what the agent's raises."""
    from torch.distributed.elastic.multiprocessing import SignalException

    raise SignalException(f"slhub launch got {signal.Signals(signum).name}", signal.Signals(signum))


def _set_handlers(handlers: dict[int, Any]) -> None:
    """Install ``handlers`` (by signal number) with those signals blocked meanwhile: one
    that arrives in between waits and then meets the new handler, never a half-set one."""
    if threading.current_thread() is not threading.main_thread():
        return
    block = hasattr(signal, "pthread_sigmask")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, handlers) if block else None
    try:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# --- the status folder: /tmp/slhub-launch-PID-* ---------------------------------------

#: The status folders' names: ``slhub-launch-PID-RANDOM`` (PID: the launcher's).
_FOLDER_PREFIX = "slhub-launch-"
_FOLDER_NAME = re.compile(rf"{_FOLDER_PREFIX}(\d+)-")
#: The file in a status folder that says which process made it: its host and start time.
_OWNER_FILE = "launcher"
#: A folder without that file (its launcher was between the two) is judged after this.
_OWNERLESS_AFTER_S = 60


def _status_folder() -> Path:
    """A new status folder, after removing those of launchers that are gone (a launcher
    killed by SIGKILL, which runs no code, leaves its own)."""
    parent = Path(tempfile.gettempdir())
    remove_stale_folders(parent)
    folder = Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-", dir=parent))
    try:
        (folder / _OWNER_FILE).write_text(_owner(os.getpid()))
    except BaseException:  # a stop signal, or the disk
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _owner(pid: int) -> str:
    """What a status folder's owner file says of the launcher ``pid``: this host's name
    and the process's start time (``?`` where it is not known)."""
    return f"{socket.gethostname()} {_process_start(pid) or '?'}"


def remove_stale_folders(parent: Path) -> list[Path]:
    """Remove the status folders in ``parent`` whose launcher is gone: its pid is not
    a live process, or (on Linux) the live process of that pid started at another time
    than the one that made the folder. A live launcher's folder, one made on another
    host (a shared TMPDIR), and one of another user are kept. Returns those removed."""
    removed = []
    for path in parent.glob(f"{_FOLDER_PREFIX}*"):
        match = _FOLDER_NAME.match(path.name)
        try:
            info = path.lstat()
        except OSError:
            continue
        if match is None or not stat.S_ISDIR(info.st_mode):
            continue
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            continue
        if _launcher_alive(int(match.group(1)), path, info.st_mtime):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _launcher_alive(pid: int, folder: Path, changed: float) -> bool:
    """Whether the launcher that made ``folder`` may still run (then it is kept)."""
    try:
        host, started = (folder / _OWNER_FILE).read_text().split()
    except (OSError, ValueError):  # no owner file: its launcher was killed, or is starting
        host = started = None
        if time.time() - changed < _OWNERLESS_AFTER_S:
            return True
    if host is not None and host != socket.gethostname():
        return True  # its pid means nothing here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # a process of another user: not ours to judge
    now = _process_start(pid)
    return started in (None, "?") or now is None or now == started


def _process_start(pid: int) -> str | None:
    """A process's start time in clock ticks after boot (``/proc/PID/stat``, field 22),
    which tells a process from a later one given the same pid; None off Linux."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


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


def _records(folder: str | Path | None) -> dict[int, dict[str, Any]]:
    """The workers' records of the last attempt (``--max-restarts`` reruns them), by rank."""
    found: dict[int, dict[str, Any]] = {}
    if folder is None:
        return found
    for path in Path(folder).glob("[0-9]*.json"):
        try:
            record = json.loads(path.read_text())
            found[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    last = max((r.get("attempt", 0) for r in found.values()), default=0)
    return {rank: r for rank, r in found.items() if r.get("attempt", 0) == last}


#: How long the agent waits for the workers it stops with SIGTERM before it sends
#: SIGKILL (torch's ``PContext.close`` timeout after a failure).
_KILL_AFTER_S = 30


def _completed(records: dict[int, dict[str, Any]], workers: int) -> Outcome | None:
    """Status 0 when every worker of this node left its done record: whatever ended
    them afterwards (a stop signal, the agent's teardown) came after the run's end."""
    done = [rank for rank, record in records.items() if record["code"] == 0]
    return Outcome(0) if done and len(done) >= workers else None


def _teardown(failure: Any, first: int) -> bool:
    """Whether the agent's teardown ended this worker: the SIGTERM it sends the others
    after the first failure, or the SIGKILL that follows for a worker that ignored it
    for ``_KILL_AFTER_S``. A SIGKILL before that came from elsewhere (``kill -9``, the
    out-of-memory killer)."""
    code = failure.exitcode
    if code == -signal.SIGKILL:
        return failure.timestamp >= first + _KILL_AFTER_S - 1  # whole seconds
    return code == -signal.SIGTERM


def _failed(failures: dict[int, Any], records: dict[int, dict[str, Any]]) -> Outcome:
    """The status and line of a run whose workers failed.

    ``failures`` (by global rank) are the workers the agent saw fail, and those it then
    stopped: a worker whose record says how it ended counts with the record's status
    (the agent's SIGTERM may have met it on its way out); one without a record died
    (a signal, ``os._exit``, a bug's traceback), and unless the agent's teardown killed
    it, it is the cause and the others' records are consequences.
    """
    first = min((f.timestamp for f in failures.values()), default=0)
    died = {rank: f for rank, f in failures.items() if rank not in records}
    codes = {r["code"] for rank, r in records.items() if rank in failures and r["code"] != 0}
    if EXIT_PREEMPTED in codes:
        return Outcome(EXIT_PREEMPTED, _chosen_line(records, EXIT_PREEMPTED))
    if codes == {EXIT_USAGE} and all(_teardown(f, first) for f in died.values()):
        return Outcome(EXIT_USAGE, _chosen_line(records, EXIT_USAGE))
    causes = sorted(died.items(), key=lambda item: (_cause_order(item[1], first), item[0]))
    if causes and not _teardown(causes[0][1], first):
        return Outcome(EXIT_FAILED, message=_death(*causes[0]))
    own = [r["line"] for rank, r in sorted(records.items()) if r["code"] == EXIT_FAILED]
    if own:  # a worker that lost the others (its peer died on another node)
        return Outcome(EXIT_FAILED, own[0])
    rank, failure = causes[0] if causes else min(failures.items())
    return Outcome(EXIT_FAILED, message=_death(rank, failure))


def _cause_order(failure: Any, first: int) -> tuple[int, int]:
    """Which dead worker to name: an exit status before a signal, any signal (a SIGKILL
    from elsewhere included) before the agent's teardown, then the earliest."""
    code = failure.exitcode
    kind = 0 if code >= 0 else 2 if _teardown(failure, first) else 1
    return kind, failure.timestamp


def _signalled(sigval: int, records: dict[int, dict[str, Any]]) -> Outcome:
    """The launcher got a stop signal; the agent forwarded it and waited for the workers.

    Workers that all left done records completed the run (a done record of any rank
    means every rank passed the final agreement after the last update): status 0, as
    ``slhub train`` gives for a signal on or after its last update.
    """
    codes = {r["code"] for r in records.values()}
    if codes == {0}:
        return Outcome(0)
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
    if code == -signal.SIGKILL:  # the kernel's out-of-memory killer sends SIGKILL
        how = "was killed (SIGKILL: out of memory?)"
    elif code < 0:
        how = f"was killed by {failure.signal_name()}"
    else:
        how = f"exited with status {code}"
    where = "its traceback is above" if code == EXIT_FAILED else "the others were stopped"
    return (
        f"worker rank {rank} (pid {failure.pid}) {how}; {where}; --resume auto continues "
        "from the last checkpoint"
    )
