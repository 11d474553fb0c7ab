"""The second hardening pass (issue 43): each probe that found a silent skip, a traceback or a raw OS error,
repeated on a demo project. Every refusal is one sentence naming the file or the setting and what to do,
exit 2 on the CLI (bad input), no traceback where a user looks, and nothing changed on disk by it.
(The login throttle and the GUI's long paths have their own files: tests/gui/test_login_guard.py,
tests/gui/test_long_paths.py.)"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import demo_cache
from conftest import cli
from trainer_core.base import diskspace
from trainer_core.base.events import EventWriter, parse_record
from trainer_core.project import Project

PACK = "qwen3_zimage"          # the fastest demo with three train shards


@pytest.fixture
def trained(tmp_path):
    return demo_cache.copy_trained(PACK, tmp_path / "p")


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and mtime: what a refusal must leave as it was."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".settings.lock"}


def one_sentence(r: subprocess.CompletedProcess, *needles: str) -> str:
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-3000:]
    for needle in needles:
        assert needle in out, (needle, out[-3000:])
    return out


# ---------------------------------------------------------------- 1: a damaged shard is never skipped

def _flip_data_byte(shard: Path) -> None:
    """One byte of the data section changed in place: size and header intact."""
    import struct
    with open(shard, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        middle = 8 + n + (shard.stat().st_size - 8 - n) // 2
        f.seek(middle)
        byte = f.read(1)
        f.seek(middle)
        f.write(bytes([byte[0] ^ 0x5A]))


def test_shards_that_are_not_what_precompute_wrote_are_refused_by_name_and_a_run_recomputes_them(trained, tmp_path):
    """Issue 55 items 1-2: a truncated shard, a copy of another shard under a shard's name, flipped data bytes, a
    shard missing and a copy saved under a name the corpus does not need. Train refuses naming each (exit 2,
    nothing trained); a full run recomputes exactly those and ends on the GGUF of an undamaged run."""
    more = ("set", "--set", f"train.steps={demo_cache.STEPS + 20}")
    reference = demo_cache.copy_trained(PACK, tmp_path / "reference")
    assert cli(more[0], "--project", str(reference), *more[1:]).returncode == 0
    assert cli("run", "--project", str(reference), timeout=300).returncode == 0
    want = Project.open(reference).gguf_path().read_bytes()

    folder = trained / "shards" / "train"
    shards = [folder / f"train-{i:05d}.safetensors" for i in range(3)]
    original = {p.name: p.read_bytes() for p in shards}
    assert cli(more[0], "--project", str(trained), *more[1:]).returncode == 0
    before = tree(trained / "checkpoints")

    os.truncate(shards[2], shards[2].stat().st_size // 2)
    r = cli("run", "--project", str(trained), "--only", "train")
    assert r.returncode == 2
    one_sentence(r, "train-00002.safetensors: damaged, shorter than its header says", "--only precompute_train")

    shards[2].write_bytes(original[shards[2].name])
    _flip_data_byte(shards[2])
    shutil.copyfile(shards[0], shards[1])
    r = cli("run", "--project", str(trained), "--only", "train")
    assert r.returncode == 2
    one_sentence(r, "train-00001.safetensors: damaged, it holds train shard 0's data",
                 "train-00002.safetensors: damaged, its data changed since precompute wrote it")

    shards[1].unlink()
    shutil.copyfile(shards[0], folder / "train-00005.safetensors")
    r = cli("run", "--project", str(trained), "--only", "train")
    assert r.returncode == 2
    out = one_sentence(r, "train-00001.safetensors: missing", "train-00002.safetensors: damaged")
    assert "train-00000" not in out and "train-00005" not in out
    assert tree(trained / "checkpoints") == before                # nothing trained on the wrong data

    r = cli("run", "--project", str(trained), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    assert {p.name: p.read_bytes() for p in shards} == original   # recomputed, byte for byte
    assert not (folder / "train-00005.safetensors").exists()
    assert Project.open(trained).gguf_path().read_bytes() == want


# ---------------------------------------------------------------- 2: tracebacks on odd paths

def test_an_event_log_replaced_by_a_folder_is_one_sentence(trained):
    (trained / "events.jsonl").unlink(missing_ok=True)
    (trained / "events.jsonl").mkdir()
    before = tree(trained)
    for command in ("run", "start"):
        r = cli(command, "--project", str(trained))
        assert r.returncode == 2
        one_sentence(r, f"{trained / 'events.jsonl'} is a folder where gguf-trainer keeps its event log")
    assert tree(trained) == before


def test_a_name_too_long_for_a_file_name_is_refused_at_set(trained):
    before = (trained / "project.json").read_bytes()
    r = cli("set", "--project", str(trained), "--set", "name=" + "x" * 300)
    assert r.returncode == 2
    one_sentence(r, "name is 300 characters long", "at most 128")
    assert (trained / "project.json").read_bytes() == before
    # the longest name allowed still names files the filesystem takes (the longest: a step's sigvq temp)
    assert cli("set", "--project", str(trained), "--set", "name=" + "x" * 128).returncode == 0
    longest = f".{'x' * 128}-step999999999_sigvq-f16.gguf.abcdefgh.tmp"
    assert len(longest) <= os.pathconf(trained, "PC_NAME_MAX")


def test_status_of_a_project_whose_file_holds_an_over_long_name_is_one_sentence(trained):
    raw = json.loads((trained / "project.json").read_text())
    raw["name"] = "y" * 300                                         # an older version accepted it
    (trained / "project.json").write_text(json.dumps(raw))
    for extra in ((), ("--json",)):
        r = cli("status", "--project", str(trained), *extra)
        assert r.returncode == 2
        one_sentence(r, "project.json: name is 300 characters long")


@pytest.mark.parametrize("key", ["export.copy_to", "export.output_dir", "materials.teacher.path"])
def test_paths_longer_than_the_filesystem_allows_are_refused_at_set(trained, key):
    before = (trained / "project.json").read_bytes()
    long_name = "/tmp/" + "z" * 300
    r = cli("set", "--project", str(trained), "--set", f"{key}={long_name}", "--force")
    assert r.returncode == 2
    one_sentence(r, f"{key} has a name of 300 bytes", f"at most {os.pathconf('/tmp', 'PC_NAME_MAX')}")
    long_path = "/tmp/" + "/".join(["w" * 250] * 30)
    r = cli("set", "--project", str(trained), "--set", f"{key}={long_path}", "--force")
    assert r.returncode == 2
    one_sentence(r, f"{key} is a path of", f"at most {os.pathconf('/tmp', 'PC_PATH_MAX') - 1}")
    assert (trained / "project.json").read_bytes() == before
    assert (trained / "shards").is_dir() and (trained / "checkpoints").is_dir()     # --force moved nothing aside


# ---------------------------------------------------------------- 3: raw OS errors

@pytest.mark.parametrize("folder", ["checkpoints", "data"])
def test_a_file_where_the_project_keeps_a_folder_is_one_sentence(trained, folder):
    import shutil
    shutil.rmtree(trained / folder)
    (trained / folder).write_text("in the way")
    before = tree(trained)
    r = cli("run", "--project", str(trained))
    assert r.returncode == 2
    one_sentence(r, f"{trained / folder} is a file where gguf-trainer keeps")
    assert tree(trained) == before


@pytest.mark.parametrize("key", ["export.output_dir", "export.copy_to"])
def test_an_export_folder_setting_that_names_a_file_is_one_sentence(trained, tmp_path, key):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    assert cli("set", "--project", str(trained), "--set", f"{key}={blocker}").returncode == 0
    r = cli("run", "--project", str(trained), "--only", "export", "--force")
    assert r.returncode == 2
    one_sentence(r, f"{key} names {blocker}, which is a file", f"--set {key}=DIR")
    assert blocker.read_text() == "in the way"


def test_a_folder_where_the_gguf_goes_is_one_sentence(trained):
    project = Project.open(trained)
    gguf = project.gguf_path()
    gguf.unlink()
    gguf.mkdir()
    r = cli("run", "--project", str(trained), "--only", "export", "--force")
    assert r.returncode == 2
    one_sentence(r, f"{gguf} is a folder where gguf-trainer keeps the exported adapter")
    assert gguf.is_dir() and not any(gguf.iterdir())


def test_an_absurd_batch_size_is_refused_at_set_and_a_resume_under_a_larger_batch_trains(trained):
    before = (trained / "project.json").read_bytes()
    r = cli("set", "--project", str(trained), "--set", "train.batch_size=100000000")
    assert r.returncode == 2
    one_sentence(r, "train.batch_size must be at most 65,536")
    assert (trained / "project.json").read_bytes() == before
    # a batch larger than a shard, on resume from a checkpoint taken mid-shard under the small batch: the
    # stream goes on with the next shard instead of an empty batch (the RuntimeError the probe got)
    r = cli("set", "--project", str(trained), "--set", "train.batch_size=5000",
            "--set", f"train.steps={demo_cache.STEPS + 10}")
    assert r.returncode == 0
    r = cli("run", "--project", str(trained), "--only", "train", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert f"done at step {demo_cache.STEPS + 10}" in r.stdout


# ---------------------------------------------------------------- 4: a full disk, said clearly

def test_the_stage_pid_write_on_a_full_disk_is_the_sentence(trained, monkeypatch, capsys):
    from trainer_core.stages import base

    def full(path, pid):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(base, "write_pid_file", full)
    code = base.stage_main("train", lambda project, report, stop: "done", ["--project", str(trained)])
    assert code == base.EXIT_FAILED
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    events = [json.loads(line) for line in out.out.splitlines() if line.startswith("{")]
    message = next(e["payload"]["message"] for e in events if e["type"] == "error")
    assert message.startswith("No space left on ") and "while writing stage.pid" in message


def test_a_disk_full_error_without_a_file_name_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sentence = str(diskspace.disk_error(OSError(errno.ENOSPC, "No space left on device")))
    assert f"while writing into {tmp_path}" in sentence and "  (.)" not in sentence


def test_an_event_write_cut_short_by_a_full_disk_leaves_no_half_line(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    writer.write({"type": "log", "n": 1})
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        writer.write({"type": "log", "n": 2, "text": "x" * 200})
    monkeypatch.setattr(os, "write", real_write)
    writer.write({"type": "log", "n": 3})
    writer.close()
    lines = path.read_bytes().splitlines()
    assert [parse_record(line)["n"] for line in lines] == [1, 3]          # every line parses, none half


def test_a_stage_done_before_whose_result_is_gone_shows_stale_not_done(trained):
    assert cli("run", "--project", str(trained), "--only", "export", "eval", "--force").returncode == 0
    gguf = Project.open(trained).gguf_path()
    gguf.unlink()                       # the export it evaluated is gone (a failed re-export, a clean-up)
    report = json.loads(cli("status", "--project", str(trained), "--json").stdout)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["train"]["status"] == "done"
    assert stages["export"]["done"] is False and stages["eval"]["done"] is False
    assert stages["eval"]["status"] == "stale" and stages["export"]["status"] == "stale"


# ---------------------------------------------------------------- 5: the read-only mount is the project's own

def test_a_read_only_bind_mount_of_the_project_is_named(trained):
    assert os.geteuid() == 0, "this test mounts (CI runs as root)"
    subprocess.run(["mount", "--bind", str(trained), str(trained)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(trained)], check=True)
        r = cli("set", "--project", str(trained), "--set", "train.steps=99")
        assert r.returncode == 2
        out = one_sentence(r, f"(mounted at {trained}) is read-only")
        assert "(mounted at /)" not in out
    finally:
        subprocess.run(["umount", "-l", str(trained)], capture_output=True)


# ---------------------------------------------------------------- 6: the plan warns about its own memory figure

def test_the_plan_warns_when_its_peak_ram_exceeds_the_machine_and_names_a_depth_that_fits(trained):
    from trainer_core.plan import adapter_params, make_plan, sample_counts, shard_disk_estimate, student_width
    from trainer_core.plan.estimate import train_ram
    project = Project.open(trained)
    project.update_settings(["train.depth=100000"])
    project = Project.open(trained)
    hw = {"cpus": 2, "ram_available_bytes": 8 << 30, "ram_total_bytes": 16 << 30, "gpus": []}
    plan = make_plan(project, hw)
    assert plan["peak_ram_bytes"] > 16 << 30
    (warning,) = [w for w in plan["warnings"] if "of RAM" in w]
    assert "train stage would need" in warning and "this machine has 16.0 GB" in warning
    depth = int(warning.split("train.depth=")[1].split(" ")[0])
    # the suggested depth fits the estimate's rule (plan.estimate.train_ram: the process, 16 bytes a trained
    # parameter, the shard pages read, a batch's rows) and one more layer does not
    dims = project.pack.teacher_dims(project)
    config = project.pack.adapter_config(project, student_width(project), dims)
    count = config.spec.parameter_count
    per, samples = shard_disk_estimate(project)["per_sample"], sample_counts(project)
    def ram(d: int) -> float:
        return train_ram(project, dataclasses.replace(config, depth=d), per, samples, False)
    assert ram(depth) <= 0.9 * (16 << 30) < ram(depth + 1)
    assert ram(depth + 1) - ram(depth) == 16 * (count(dataclasses.replace(config, depth=depth + 1))
                                                - count(dataclasses.replace(config, depth=depth)))
    # within the machine: no such warning
    project.update_settings([f"train.depth={depth}"])
    assert not [w for w in make_plan(Project.open(trained), hw)["warnings"] if "of RAM" in w]
    assert adapter_params(Project.open(trained)) == count(dataclasses.replace(config, depth=depth))


# ---------------------------------------------------------------- the GUI says the same sentence

def test_the_gui_start_shows_the_layout_sentence_in_its_banner(trained, tmp_path, monkeypatch):
    from ui.app import make_context
    from ui import setup_tab
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-tmp"))
    ctx = make_context(tmp_path / "projects", demo_root=tmp_path / "demo", tick_s=0.3)
    try:
        import shutil
        shutil.rmtree(trained / "checkpoints")
        (trained / "checkpoints").write_text("in the way")
        before = tree(trained)
        message, _ = setup_tab.start_run(ctx, str(trained), anyway=True)
        assert f"{trained / 'checkpoints'} is a file where gguf-trainer keeps the checkpoints" in message
        assert "Pipeline started" not in message and tree(trained) == before
    finally:
        ctx.supervisor.close()
