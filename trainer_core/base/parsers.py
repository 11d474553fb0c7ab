"""Value parsers of the project settings: each takes what the user wrote (a JSON value, or a string
from the CLI / GUI) and returns the typed value, or raises ValueError whose text completes
"<key> ..." (config.py names the key)."""
from __future__ import annotations

import json
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Mapping, Protocol

__all__ = ["PackInfo", "parse_count", "count", "number", "boolean", "text", "choice", "device", "text_list",
           "subset", "area_weights", "name", "pack_id"]


class PackInfo(Protocol):
    """What the settings need of a pack (a TrainerPack has it)."""

    id: str
    title: str
    defaults: Mapping[str, Any]
    default_folder: str
    corpus_kind: Any               # contract/corpus_kinds.CorpusKind: what the corpus settings mean for it
    settings: tuple[Any, ...]      # config.PackSetting: the settings only this pack has


_COUNT_RE = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+(_\d+)*)?(\.\d+)?([kKmM]?)$")


def parse_count(value: Any, minimum: int = 1) -> int:
    """A whole number written as `12000`, `12k`, `1.5k`, `12,000`, `12_000` or `12000.0`."""
    what = "a positive whole number" if minimum == 1 else f"a whole number of at least {minimum}"
    if isinstance(value, bool):
        raise ValueError(f"must be {what}")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"must be {what}")
        number = Decimal(repr(value))
    elif isinstance(value, str):
        text = value.strip()
        match = _COUNT_RE.match(text)
        if not text or not match or not (match.group(1) or match.group(4)):
            raise ValueError(f"must be {what}")
        scale = {"": 1, "k": 1000, "m": 1_000_000}[match.group(5).lower()]
        try:
            number = Decimal(text[: len(text) - len(match.group(5))].replace(",", "").replace("_", ""))
        except InvalidOperation:
            raise ValueError(f"must be {what}") from None
        number *= scale
    else:
        raise ValueError(f"must be {what}")
    if number != number.to_integral_value() or number < minimum:
        raise ValueError(f"must be {what}")
    return int(number)


def count(minimum: int = 1, multiple_of: int = 1, maximum: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        n = parse_count(value, minimum)
        if n % multiple_of:
            raise ValueError(f"must be a multiple of {multiple_of}")
        if maximum is not None and n > maximum:
            raise ValueError(f"must be at most {maximum:,}" + (f" ({maximum // 1_000_000}M)" if maximum >= 1_000_000
                                                               else ""))
        return n
    return parse


def number(low: float = 0.0, high: float = math.inf, low_open: bool = False) -> Callable[[Any], float]:
    if high == math.inf:
        what = f"a number greater than {low:g}" if low_open else f"a number of at least {low:g}"
    else:
        what = f"a number from {low:g} to {high:g}"

    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(f"must be {what}")
        try:
            x = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(f"must be {what}") from None
        if not math.isfinite(x) or x < low or x > high or (low_open and x == low):
            raise ValueError(f"must be {what}")
        return x
    return parse


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"):
        return False
    raise ValueError("must be true or false")


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be text")
    return value


def choice(*options: str) -> Callable[[Any], str]:
    quoted = ", ".join(f'"{o}"' for o in options)

    def parse(value: Any) -> str:
        if isinstance(value, str) and value.strip() in options:
            return value.strip()
        raise ValueError(f"must be one of {quoted}")
    parse.options = options          # type: ignore[attr-defined]  # the GUI's drop-down
    return parse


def device(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", value.strip()):
        return value.strip()
    raise ValueError('must be "auto", "cpu", "cuda" or "cuda:N"')


def _as_list(value: Any) -> list:
    """A JSON list, or a string holding a JSON list or comma-separated items."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = json.loads(text)
        else:
            return [item.strip() for item in text.split(",") if item.strip()]
    if not isinstance(value, list):
        raise ValueError
    return value


def text_list(value: Any) -> list[str]:
    try:
        items = _as_list(value)
    except ValueError:
        raise ValueError("must be a list of paths") from None
    if not all(isinstance(i, str) for i in items):
        raise ValueError("must be a list of paths")
    return items


def subset(*options: str) -> Callable[[Any], list[str]]:
    quoted = ", ".join(f'"{o}"' for o in options)

    def parse(value: Any) -> list[str]:
        try:
            items = _as_list(value)
        except ValueError:
            items = None
        if items is None or not all(isinstance(i, str) and i in options for i in items):
            raise ValueError(f"must be a list drawn from {quoted}")
        return list(dict.fromkeys(items))
    parse.options = options          # type: ignore[attr-defined]  # the GUI's check boxes
    return parse


def area_weights(value: Any) -> list[list]:
    what = "must be a list of [area_px, weight] pairs with positive weights (area 0 = the image's own size)"
    try:
        items = _as_list(value)
    except ValueError:
        raise ValueError(what) from None
    out = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise ValueError(what)
        try:
            area, weight = parse_count(item[0], 0), number(0.0, low_open=True)(item[1])
        except ValueError:
            raise ValueError(what) from None
        out.append([area, weight])
    if not out:
        raise ValueError(what)
    return out


NAME_MAX = 128     # the export's longest file name (a temp of <name>-step<N>_sigvq-f16.gguf) adds < 60 to it: < 255


def name(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        if len(value) > NAME_MAX:
            raise ValueError(f"is {len(value)} characters long; the files named after it must fit the 255 bytes a "
                             f"file name may have, so use at most {NAME_MAX}")
        return value
    raise ValueError('must be a file name made of letters, digits, ".", "_" and "-"')


def pack_id(packs: Mapping[str, PackInfo]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if isinstance(value, str) and value in packs:
            return value
        raise ValueError("must be one of " + ", ".join(f'"{p}"' for p in packs))
    return parse
