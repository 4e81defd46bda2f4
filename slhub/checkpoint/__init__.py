"""The checkpoint component: the one owner of saving and resuming.

- :mod:`~slhub.checkpoint.schema`: the v2/v1 layouts, their checks, and
  :class:`Checkpoint`, the typed view that the loop, ``slhub inspect`` and every
  exporter read instead of raw keys;
- :mod:`~slhub.checkpoint.files`: file names (``step_N.pt``, ``last.pt``,
  ``best.pt``), safe reads, atomic writes;
- :mod:`~slhub.checkpoint.gather`: every rank's state to rank 0;
- :mod:`~slhub.checkpoint.resume`: the resume plan, resolved once at admission: every
  question a resume asks and every refusal of one;
- :mod:`~slhub.checkpoint.directory`: the run directory the plan starts in (claimed
  fresh or reopened in place) and the identity run.json records;
- :mod:`~slhub.checkpoint.states`: the registry of stateful objects each rank saves;
- :mod:`~slhub.checkpoint.manager`: load, cadence, the boundary (gather, validation,
  write), committed snapshot, retention.
- :mod:`~slhub.checkpoint.summary`: a checkpoint described for people (``slhub inspect``).
"""

from slhub.checkpoint.files import BEST, LAST, load, read_bytes, step_file
from slhub.checkpoint.manager import Boundary, CheckpointManager
from slhub.checkpoint.resume import AUTO, ResumePlan, StartRequest, plan_resume
from slhub.checkpoint.schema import FORMAT_V2, Checkpoint, EmaState, Intent, Retention

__all__ = [
    "AUTO",
    "BEST",
    "FORMAT_V2",
    "LAST",
    "Boundary",
    "Checkpoint",
    "CheckpointManager",
    "EmaState",
    "Intent",
    "ResumePlan",
    "Retention",
    "StartRequest",
    "load",
    "plan_resume",
    "read_bytes",
    "step_file",
]
