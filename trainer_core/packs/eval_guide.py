"""How to read a pack's eval.json (`TrainerPack.judge`): the metric to judge a run by, what good looks like,
and the figures published for the pack with where they come from. The Output tab, `gguf-trainer status` and
the eval stage's summary line show them beside the run's values, and mark a run on the mock teacher (synthetic
targets) or in a demo project (tiny random stand-in models) as a machinery check: its numbers say nothing about
quality, and the figures are what a real run reaches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

__all__ = ["EvalGuide", "MOCK_NOTE", "DEMO_NOTE", "NO_FIGURE", "machinery_note", "eval_lines"]

MOCK_NOTE = "mock teacher: a machinery check, not a score"
DEMO_NOTE = "demo project: a machinery check, not a score"
NO_FIGURE = "no reference figure is published for this pack"


def machinery_note(mock: bool, demo: bool = False) -> str | None:
    """The line that says the numbers are no score, with why; None for a real run."""
    if mock:
        return f"{MOCK_NOTE} (synthetic targets: these numbers say nothing about quality)"
    return f"{DEMO_NOTE} (tiny random stand-in models: these numbers say nothing about quality)" if demo else None


def _five(value: float) -> str:
    return f"{value:.5f}"


@dataclass(frozen=True)
class EvalGuide:
    headline: str                                  # the eval.json key to judge a run by
    good: str                                      # one line: what good looks like
    also: tuple[str, ...] = ()                     # keys shown with it (its splits, rel_mse)
    references: tuple[tuple[str, str], ...] = ()   # (eval.json key, the figure as published: "0.965", "0.80–0.83")
    source: str = ""                               # where the figures come from, or that none is published

    def keys(self) -> tuple[str, ...]:
        """Every key the guide names, each once: the headline, `also`, then those with a figure."""
        return tuple(dict.fromkeys((self.headline, *self.also, *(k for k, _ in self.references))))

    def rows(self, metrics: Mapping[str, Any]) -> list[tuple[str, float | None, str | None]]:
        """(key, the run's value or None where eval.json lacks it, the published figure or None) per key."""
        figures = dict(self.references)
        return [(k, v if isinstance(v := metrics.get(k), (int, float)) and not isinstance(v, bool) else None,
                 figures.get(k)) for k in self.keys()]

    def _row_text(self, i: int, key: str, value: float | None, figure: str | None,
                  fmt: Callable[[float], str]) -> str:
        shown = "not in this eval" if value is None else fmt(value)
        beside = f" (reference {figure})" if figure else f" ({NO_FIGURE})" if i == 0 and not self.references else ""
        return f"{'judge by ' if i == 0 else ''}{key} {shown}{beside}"

    def summary(self, metrics: Mapping[str, Any], mock: bool, fmt: Callable[[float], str] = _five) -> str:
        """One line: the mock marker where it applies, then the judged metric and the others the guide names,
        each with its published figure."""
        shown = "; ".join(self._row_text(i, *row, fmt) for i, row in enumerate(self.rows(metrics)))
        return f"{MOCK_NOTE} — {shown}" if mock else shown

    def lines(self, metrics: Mapping[str, Any], mock: bool, demo: bool = False,
              fmt: Callable[[float], str] = _five) -> list[str]:
        """The guide as lines: the mock / demo marker, one line per key, what good looks like, the source."""
        note = machinery_note(mock, demo)
        return [*([note] if note else []), *(self._row_text(i, *row, fmt) for i, row in enumerate(self.rows(metrics))),
                f"good: {self.good}", f"source: {self.source}"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eval_lines(guide: EvalGuide | None, metrics: Mapping[str, Any], names: Sequence[str], mock: bool,
               demo: bool = False, fmt: Callable[[float], str] = _five) -> list[str]:
    """`guide.lines`, then the pack's other metrics (`names`, its metric_names) on one line, "others: …";
    without a guide, the mock / demo marker where it applies and every metric."""
    named = guide.keys() if guide else ()
    rest = ", ".join(f"{k} {fmt(metrics[k])}" for k in names if k not in named and isinstance(metrics.get(k), float))
    note = machinery_note(mock, demo)
    head = guide.lines(metrics, mock, demo, fmt) if guide else [note] if note else []
    return [*head, *([f"{'others: ' if guide else ''}{rest}"] if rest else [])]
