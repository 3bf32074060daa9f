"""The one seam between tenure's tools and what the library does not make public.

The CLI and the demos (:mod:`tenure._tools`) and the clone's benchmarks
(``benchmarks/``, not in the wheel) use the library through ``tenure``'s
public names and, for the few things a tool needs that a user does not,
through this module only: they never import
``tenure._async``, ``tenure._sync`` or ``tenure._core`` themselves. A name here
is kept working for the tools when the internals behind it move. The
library's own public modules (``tenure.inspection``) never import it: the
seam serves the tools alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tenure._async._wakeups import LINGER
from tenure._backends import telemetry as telemetry_seam
from tenure._backends.telemetry import paused as metrics_paused
from tenure._backends.telemetry import unhanded as metrics_unhanded
from tenure._core import telemetry as telemetry_table
from tenure._core.ingest import IngestKeys, Plan, parse_sink
from tenure._core.leased import IDLE_TTL, base_key, check_name, name_from_key
from tenure._core.rows import encode_row
from tenure._core.scripts import load_script
from tenure._core.values import check_seconds, to_text
from tenure._sync._ingest import read_status
from tenure._sync._scripting import registry_for
from tenure.server._ports import PORTS_FOLDER_VARIABLE, ports_folder, sweep_ports

if TYPE_CHECKING:  # the id sets need numpy and pyroaring (the idsets extra): loaded on use
    from tenure._backends.local_copies import LOCAL_COPIES
    from tenure._core.idset import bitmap_of

__all__ = [
    "IDLE_TTL",
    "LINGER",
    "LOCAL_COPIES",
    "PORTS_FOLDER_VARIABLE",
    "IngestKeys",
    "Plan",
    "base_key",
    "bitmap_of",
    "check_name",
    "check_seconds",
    "encode_row",
    "load_script",
    "metrics_paused",
    "metrics_unhanded",
    "name_from_key",
    "parse_sink",
    "ports_folder",
    "read_status",
    "registry_for",
    "sweep_ports",
    "telemetry_seam",
    "telemetry_table",
    "to_text",
]


def __getattr__(name: str) -> Any:
    """Load the id sets' names on first use, so a tool without the extra still starts."""
    if name == "LOCAL_COPIES":
        from tenure._backends.local_copies import LOCAL_COPIES

        return LOCAL_COPIES
    if name == "bitmap_of":
        from tenure._core.idset import bitmap_of

        return bitmap_of
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
