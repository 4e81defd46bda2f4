"""``python -m slhub_mlflow.sync RUN_DIR``: fill a run's MLflow run from its metrics.jsonl.

For a run that lost its tracking server (the plugin warned once and named this
command), or any slhub run never logged to MLflow. The MLflow run is found by its
``slhub.run_id`` tag (or created, as the plugin would), and every value of the
effective history the server does not hold yet is sent: the steps after the last
one the server holds of each metric. Run it once the training process stopped.
The server and experiment are the recipe's ``mlflow`` section (run.json), unless
``--tracking-uri`` names another; ``--status`` also ends the MLflow run, as the
plugin would have.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from slhub import SlhubError, one_line

from slhub_mlflow.section import SECTION, MlflowSection, tracking_uri

PROG = "python -m slhub_mlflow.sync"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the slhub run directory (holds run.json)")
    parser.add_argument("--tracking-uri", help="the MLflow server (default: the recipe's)")
    parser.add_argument(
        "--status",
        choices=["done", "preempted", "failed"],
        help="also end the MLflow run with this status",
    )
    return parser.parse_args(argv)


def sync(run_dir: Path, uri: str | None = None, status: str | None = None) -> str:
    """Fill the MLflow run of ``run_dir``; returns what was done, in one line."""
    identity_path = run_dir / "run.json"
    try:
        identity = json.loads(identity_path.read_text(encoding="utf-8"))
        section = MlflowSection.model_validate(identity["recipe"].get(SECTION) or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SlhubError(f"{identity_path}: not a readable slhub run ({one_line(exc)})") from None
    server = tracking_uri(section, uri)
    from slhub_mlflow import tracker

    tracker.check_server(server, section.experiment)
    name = section.run_name or run_dir.resolve().name
    link, rows = tracker.attach(server, section, run_dir, name, until=math.inf)
    sent = link.send(rows)
    if status is not None:
        last = max((step for step, _, _ in rows), default=0)
        link.end(status, last)
    verb = "created" if link.created else "continued"
    return (
        f"{verb} MLflow run {link.run_id} of slhub run {identity.get('run_id')} on {server} "
        f"(experiment {section.experiment!r}): {sent} values sent"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        print(sync(args.run_dir, args.tracking_uri, args.status))
    except SlhubError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a lost server mid-sync: one line, not a traceback
        print(f"{PROG}: error: {one_line(exc)}; run it again", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
