"""The Setup tab's materials table against a local Hub: real statuses, and buttons that obey
the rules (disabled when present or downloading; a second request starts no second job)."""
from __future__ import annotations

import os
import threading
import time

import pytest
from gradio_client import Client

from hub_server import LocalHub, go_online
from trainer_core import materials
from trainer_core.base.procs import run_delays
from trainer_core.project import Project
from trainer_core.packs.lookup import find_material
from ui import materials_panel, setup_tab
from ui.app import serve

from .conftest import free_port

FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
         "merges.txt")


@pytest.fixture
def hub(monkeypatch):
    repos = {"callgg/pig-clip-tokenizer": {f: (f * 40).encode() for f in FILES},
             "callgg/t5-v1_1-xxl-encoder-bf16": {"config.json": b"{}", "generation_config.json": b"{}",
                                                 "model.safetensors": b"w" * (2 << 20),
                                                 "special_tokens_map.json": b"{}", "spiece.model": b"s" * 500,
                                                 "tokenizer_config.json": b"{}"}}
    with LocalHub(repos) as h:
        go_online(monkeypatch, h.url)
        yield h


def _rows(table) -> list[list]:
    """A Dataframe as gradio_client returns it (a plain frame, or an update holding one)."""
    if isinstance(table, dict) and "value" in table:
        table = table["value"]
    return table["data"] if isinstance(table, dict) else table


def test_materials_table_and_download_buttons(ctx, hub):
    app, url = serve(ctx, port=free_port(), open_browser=False, block=False)
    try:
        client = Client(url, verbose=False)
        client.predict("mats", "t5xxl_pixart", str(ctx.projects_root), api_name="/create_project")
        project = Project.open(ctx.projects_root / "mats")
        # (the API returns the table, the picker and the summary; the buttons' states are checked
        # on the handler's own updates, which the page applies)
        table, pick, summary = client.predict("student_tokenizer", api_name="/materials_refresh")
        statuses = {row[0]: row[2] for row in _rows(table)}
        assert set(statuses.values()) == {"missing"} and "missing:" in summary
        _, _, one, every, _ = materials_panel.refresh(str(project.root), "student_tokenizer", online=True)
        assert (one["value"], one["interactive"]) == ("Download", True)
        assert (every["value"], every["interactive"]) == ("Download missing (2)", True)

        key = ("callgg/t5-v1_1-xxl-encoder-bf16", "model.safetensors")
        hub.stall_after[key] = 1000                          # the teacher's download holds until released
        banner, table, pick, summary = client.predict("student_tokenizer", api_name="/download_missing")
        assert "Started" in banner
        assert hub.stalled.wait(60), "the teacher's download never started"
        assert materials.job_running(project, "teacher")
        _, _, one, every, _ = materials_panel.refresh(str(project.root), "teacher", online=False)
        assert (one["value"], one["interactive"]) == ("Downloading…", False)
        assert every["interactive"] is False                      # disabled while downloads run
        again = client.predict("teacher", api_name="/download_material")[0]
        assert "already being downloaded" in again               # the server refuses a second job too
        del hub.stall_after[key]
        hub.release()

        deadline = time.monotonic() + 120
        while not all(materials.material_status(project, find_material(project.pack, i)).status == "ready"
                      for i in ("student_tokenizer", "teacher")):
            assert time.monotonic() < deadline, "the downloads did not finish"
            time.sleep(0.2)
        table, pick, summary = client.predict("teacher", api_name="/materials_refresh")
        statuses = {row[0]: row[2] for row in _rows(table)}
        assert statuses["T5-XXL v1.1 encoder (teacher)"] == "ready"
        assert statuses["pig_clip tokenizer and config"] == "ready"
        assert "pick a file for: pig_clip student GGUF" in summary
        _, _, one, every, _ = materials_panel.refresh(str(project.root), "teacher", online=True)
        assert (one["value"], one["interactive"]) == ("Downloaded ✓", False)
        assert every["interactive"] is False
    finally:
        app.close()


def _queued_s() -> float:
    """Seconds this thread has sat ready to run without a core (0 where the kernel keeps no schedstat)."""
    return run_delays(os.getpid()).get(threading.get_native_id(), 0.0)


@pytest.mark.parametrize("hub_state", ["unreachable", "offline mode"])
def test_opening_a_real_pack_project_without_the_hub_asks_it_once(ctx, monkeypatch, capfd, hub_state):
    """Opening a project whose materials come from the Hub, with nothing downloaded and no Hub: one refused
    request and one line (none in offline mode), then the disk's statuses; not huggingface_hub's five retries
    with back-off per material (~70 s and 33 lines for LLaDA's three). The time is the wall less what this
    thread sat ready without a core (procs.run_delays): the back-off's sleeps count, another process's load
    does not (at a load of 9 on the 2-core VM: 9.0 s of wall, 6.5 s of it waiting for a core, 2.2 s of CPU)."""
    import huggingface_hub.constants as constants
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")       # nothing listens there
    if hub_state == "unreachable":
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    root = Project.create(ctx.projects_root / "real", "llada_image").root
    capfd.readouterr()
    started, queued = time.monotonic(), _queued_s()
    view = setup_tab.open_project(ctx, str(root))
    table, _, _, every, summary = materials_panel.refresh(view[0], None)     # what the page does on opening
    elapsed = time.monotonic() - started - (_queued_s() - queued)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert elapsed < 15, f"opening took {elapsed:.0f} s"
    if hub_state == "unreachable":
        assert len(lines) == 1, lines
        assert "cannot be reached" in lines[0] and "127.0.0.1" in lines[0] and "from the disk" in lines[0]
    else:
        assert lines == []
    assert {row[2] for row in table["value"]} == {"missing"}
    assert every["interactive"] is True and "missing:" in summary
    statuses = materials.all_statuses(Project.open(root), online=True)
    snapshots = [s for s in statuses if s.kind == "hf_snapshot"]
    assert snapshots and all(not s.online and s.hub for s in snapshots)
