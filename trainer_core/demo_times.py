"""How long a demo takes, as measured (trainer_core/demo_times.json, written by `bench/stages.py --write` on an idle
machine): the one figure the GUI's demo banner, the CLI's `demo` and the README state. A pack without a measurement
gets no figure rather than a guess."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FILE", "measured", "demo_time_sentence", "run_time_sentence"]

FILE = Path(__file__).with_name("demo_times.json")


def measured() -> dict[str, Any]:
    try:
        data = json.loads(FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"packs": {}}
    return data if isinstance(data, dict) and isinstance(data.get("packs"), dict) else {"packs": {}}


def _figures(pack_id: str) -> tuple[dict[str, Any], dict[str, float]] | None:
    data = measured()
    pack = data["packs"].get(pack_id)
    if not isinstance(pack, dict) or not all(isinstance(pack.get(k), (int, float)) for k in ("build_s", "run_s")):
        return None
    return data, pack


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


def _where(data: dict[str, Any]) -> str:
    return f"{data.get('machine', 'an idle machine')} on {data.get('measured', 'an unrecorded date')}"


def demo_time_sentence(pack_id: str) -> str | None:
    """'building it takes about 5 s and running it about 9 s, measured on 2 idle CPU cores (x86_64) on 2026-12-04'."""
    found = _figures(pack_id)
    if found is None:
        return None
    data, pack = found
    return (f"building it takes about {_seconds(pack['build_s'])} and running it about {_seconds(pack['run_s'])}, "
            f"measured on {_where(data)}")


def run_time_sentence(pack_id: str) -> str | None:
    """'the run takes about 9 s, measured on …': what is left once the demo is built."""
    found = _figures(pack_id)
    if found is None:
        return None
    data, pack = found
    return f"the run takes about {_seconds(pack['run_s'])}, measured on {_where(data)}"
