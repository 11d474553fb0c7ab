"""The Train tab's loss chart: its step axis (no label flush against its neighbour at the end), the order its
updates go out in (a new axis alone, then the points), and every series named in every frame it gets."""
from __future__ import annotations

import gradio as gr
import pandas as pd

from trainer_core.supervisor import CHART_SERIES
from ui import train_tab


def _frame(last: int) -> pd.DataFrame:
    steps = [*range(10, last, 10), last]
    return pd.DataFrame({"step": steps, "value": [1.0] * len(steps), "series": ["loss"] * len(steps)})


def test_the_step_axis_ends_just_past_a_round_step_that_no_tick_sits_on():
    assert train_tab.chart_x_lim(train_tab.EMPTY_CHART) is None
    assert train_tab.chart_x_lim(_frame(200)) == [0.0, 206.0]
    for last in (37, 200, 201, 413, 20_000, 98_765):
        low, high = train_tab.chart_x_lim(_frame(last))
        assert low == 0.0 and last < high <= 2.6 * last
        # whatever round tick spacing Vega picks (4 to 60 ticks over the axis), no tick lands on its end
        spacings = [m * 10 ** k for k in range(-1, 6) for m in (1, 2, 2.5, 5) if high / 60 <= m * 10 ** k <= high / 4]
        assert spacings and all(abs(high / d - round(high / d)) > 1e-6 for d in spacings), (last, high)
    # the axis stays put while the run moves within a round stretch: no rebuild of the plot per point
    assert train_tab.chart_x_lim(_frame(160)) == train_tab.chart_x_lim(_frame(200))


def test_a_new_axis_goes_out_alone_and_the_points_on_the_next_tick():
    snap = {"chart": _frame(200).to_dict("records"), "chart_version": 4}
    update, seen, axis = train_tab.chart_update(snap, -1, None)
    assert update == {"__type__": "update", "x_lim": [0.0, 206.0]} and seen == -1 and axis == [0.0, 206.0]
    update, seen, axis = train_tab.chart_update(snap, seen, axis)
    assert isinstance(update, pd.DataFrame) and len(update) == len(CHART_SERIES) + 20 and seen == 4
    update, seen, axis = train_tab.chart_update(snap, seen, axis)
    assert isinstance(update, type(gr.skip())) and seen == 4
    # past the round stretch: the wider axis first, alone, then the points
    snap = {"chart": _frame(230).to_dict("records"), "chart_version": 5}
    update, seen, axis = train_tab.chart_update(snap, seen, axis)
    assert update == {"__type__": "update", "x_lim": [0.0, 257.5]} and seen == 4
    update, seen, axis = train_tab.chart_update(snap, seen, axis)
    assert update["step"].max() == 230 and seen == 5
    # within the stretch: the points alone, the axis as it was
    snap = {"chart": _frame(240).to_dict("records"), "chart_version": 6}
    update, seen, axis = train_tab.chart_update(snap, seen, axis)
    assert update["step"].max() == 240 and seen == 6 and axis == [0.0, 257.5]


def test_every_frame_names_every_series_first_with_no_value():
    """Gradio's plot colours only the series in the value it built its view with: each frame, the empty one too,
    begins with one value-less row per series, in one order (the colours), left of the axis."""
    for snap in ({"chart": [], "chart_version": 0}, {"chart": _frame(30).to_dict("records"), "chart_version": 1}):
        frame = train_tab.chart_frame(snap)
        head = frame.iloc[:len(CHART_SERIES)]
        assert list(head["series"]) == list(CHART_SERIES) and head["value"].isna().all() and (head["step"] < 0).all()
        assert len(frame) == len(CHART_SERIES) + len(snap["chart"])
        assert str(frame["series"].dtype) != "int64" and frame["value"].dtype == "float64"
    assert train_tab.chart_x_lim(train_tab.chart_frame({"chart": []})) is None      # the rows are no points
    # as the page gets it: the series' rows carry no value (null), so Vega draws nothing for them
    sent = gr.LinePlot(x="step", y="value", color="series").postprocess(train_tab.EMPTY_CHART)
    assert sent.datatypes["series"] == "nominal" and [row[1] for row in sent.data] == [None] * len(CHART_SERIES)
