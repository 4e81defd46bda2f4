"""Strict JSON for everything slhub writes: log events, run.json, metrics.jsonl, manifests.

JSON has no NaN or infinity; Python's ``json`` writes the bare ``NaN``/``Infinity``
tokens that strict parsers (``jq``, JavaScript, ``json.loads`` with a
``parse_constant`` that refuses them) reject. slhub writes a non-finite float as
one of the strings of :data:`NON_FINITE` instead (``"NaN"``, ``"Infinity"``,
``"-Infinity"``), the encoding metrics.jsonl has always used, and
:func:`slhub.read_metrics` reads them back as floats.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: The strings a non-finite float is written as, and the floats they stand for.
NON_FINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def finite_safe(value: Any) -> Any:
    """``value`` with every non-finite float (in dicts, lists and tuples, at any depth)
    replaced by its :data:`NON_FINITE` name; ``value`` itself is left as it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {key: finite_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_safe(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, **kwargs)`` as strict JSON: non-finite floats as their
    :data:`NON_FINITE` names (the value is walked only when it holds one)."""
    kwargs["allow_nan"] = False
    try:
        return json.dumps(value, **kwargs)
    except ValueError:  # a non-finite float somewhere (or a circular reference: raised again)
        return json.dumps(finite_safe(value), **kwargs)
