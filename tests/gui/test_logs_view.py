"""The Logs tab shows progress bars as a terminal leaves them: tqdm's `\r` updates and runs of
one bar's lines collapse to the bar's last state; other lines are kept as they are."""
from __future__ import annotations

import io

from tqdm import tqdm

from ui.logs_tab import bar_key, collapse_progress


def _bar(desc: str | None, total: int | None, **kw) -> str:
    out = io.StringIO()
    with tqdm(total=total, desc=desc, file=out, mininterval=0, **kw) as bar:
        for _ in range(total or 7):
            bar.update(1)
    return out.getvalue()


def test_tqdm_written_to_a_file_collapses_to_its_last_state():
    raw = ("[teacher] loading\n" + _bar("Loading weights", 20) + _bar(None, 3) + _bar("Reading", None)
           + _bar("eval", 4, postfix={"loss": 0.5}) + "[train] step 10 loss 0.5\n")
    assert raw.count("Loading weights") == 22 and "\r" in raw          # realistic: every update is in the file
    lines = collapse_progress(raw).split("\n")
    assert lines[0] == "[teacher] loading" and lines[-2:] == ["[train] step 10 loss 0.5", ""]
    bars = lines[1:-2]
    assert len(bars) == 4 and all("\r" not in line for line in bars)
    assert bars[0].startswith("Loading weights: 100%|") and "20/20" in bars[0]
    assert bars[1].startswith("100%|") and "3/3" in bars[1]
    assert bars[2].startswith("Reading: 7it [")
    assert bars[3].startswith("eval: 100%|") and bars[3].endswith("loss=0.5]")


def test_a_run_of_one_bars_lines_keeps_its_last_and_other_bars_and_lines_stay():
    text = ("Loading weights:   0%|          | 0/20 [00:00<?, ?it/s]\n"
            "Loading weights:  45%|████▌     | 9/20 [00:01<00:02, 5.20it/s]\n"
            "Loading weights: 100%|██████████| 20/20 [00:02<00:00, 5.20it/s]\n"
            "Writing model shards:  50%|█████     | 1.05M/2.10M [00:00<00:00, 119MB/s]\n"
            "Writing model shards: 100%|██████████| 2.10M/2.10M [00:00<00:00, 120MB/s]\n"
            "[export] wrote adapter.gguf\n"
            "Loading weights: 100%|██████████| 20/20 [00:02<00:00, 5.20it/s]\n")
    assert collapse_progress(text).split("\n") == [
        "Loading weights: 100%|██████████| 20/20 [00:02<00:00, 5.20it/s]",
        "Writing model shards: 100%|██████████| 2.10M/2.10M [00:00<00:00, 120MB/s]",
        "[export] wrote adapter.gguf",
        "Loading weights: 100%|██████████| 20/20 [00:02<00:00, 5.20it/s]",     # a later run of the bar
        ""]


def test_a_bar_still_running_shows_its_current_state_and_crlf_is_a_line_end():
    partial = "[train] start\r\n" + _bar("Loading weights", 10).rsplit("\r", 3)[0]     # cut mid-bar, no newline
    out = collapse_progress(partial).split("\n")
    assert out[0] == "[train] start" and len(out) == 2
    assert out[1].startswith("Loading weights:") and "|" in out[1] and "\r" not in out[1]


def test_ordinary_lines_are_never_taken_for_bars():
    lines = ["[train] step 5 [00:01, 3]", "time [12:00, today]", "step 10/20 loss 0.5", "45%| done |",
             "[train] step 6 [00:02, 3]", "", "  indented"]
    assert all(bar_key(line) is None for line in lines)
    assert collapse_progress("\n".join(lines)) == "\n".join(lines)
    assert bar_key("x: 12%|█▏ | 3/25 [01:02<07:40, 20.93s/it]") == "x"
    assert bar_key("Fetching 3 files: 100%|██████████| 3/3 [00:00<00:00, 1.2kB/s]") == "Fetching 3 files"
