"""The train stage on the demo project: bit-exact resume, live step changes, snapshots, learning."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from trainer_core.demo import build_demo
from trainer_core.base.errors import TrainerError
from trainer_core.base.events import ListReport, parse_event
from trainer_core.contract.losses import row_cos
from trainer_core.project import Project
from trainer_core.contract.schedule import lr_at
from trainer_core.contract.shards import load_stats, valid_shards
from trainer_core.stages import corpus, precompute, stage_done, train
from trainer_core.contract.stream import val_batches

STEPS = 120  # log 10, val 50, save 50 (demo settings) → saves at 50, 100, 120


@pytest.fixture(scope="module")
def shards_template(tmp_path_factory):
    """The demo project with corpus and shards (built once; tests work on copies)."""
    root = tmp_path_factory.mktemp("demo") / "t5_adapter"
    project = build_demo(root)
    project.update_settings([f"train.steps={STEPS}"])
    assert corpus.run(project, ListReport()) == "done"
    for split in ("val", "train"):
        assert precompute.run(project, ListReport(), split=split) == "done"
    return root


@pytest.fixture
def demo(shards_template, tmp_path):
    return Project.open(shutil.copytree(shards_template, tmp_path / "t5_adapter"))


@pytest.fixture(scope="module")
def reference(shards_template, tmp_path_factory):
    """An uninterrupted run, as a stage process like the runs it is compared with."""
    root = shutil.copytree(shards_template, tmp_path_factory.mktemp("ref") / "t5_adapter")
    proc = stage(Project.open(root))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    return Project.open(root)


def stage(project: Project) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "trainer_core.stages.train", "--project", str(project.root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def wait_for(proc: subprocess.Popen, predicate) -> dict:
    for line in proc.stdout:
        event = parse_event(line)
        if event and predicate(event):
            return event
    raise AssertionError("the stage ended first: " + proc.stderr.read().decode()[-3000:])


def metric_at(step: int):
    return lambda e: e["type"] == "metric" and e["payload"].get("step", -1) >= step and "loss" in e["payload"]


def finish(proc: subprocess.Popen, code: int = 0) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err.decode()[-3000:]
    return out.decode()


def resume_to_end(project: Project) -> None:
    finish(stage(project))


def assert_same_checkpoint(a: Project, b: Project) -> None:
    ca = torch.load(a.checkpoints_dir / "last.pt", weights_only=False)
    cb = torch.load(b.checkpoints_dir / "last.pt", weights_only=False)
    assert ca["step"] == cb["step"] == STEPS
    assert ca["stream"] == cb["stream"]
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for k in sa[i]:
            assert torch.equal(sa[i][k], sb[i][k]), (i, k)


def series_steps(project: Project) -> list[int]:
    return [p["step"] for p in train.metric_series(project)]


def test_sigterm_then_resume_is_bit_exact(demo, reference):
    proc = stage(demo)
    wait_for(proc, metric_at(30))
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, 4)
    assert "stop requested: saved last.pt at step" in out
    stopped_at = json.loads((demo.checkpoints_dir / "last.json").read_text())["step"]
    assert 30 <= stopped_at < STEPS
    resume_to_end(demo)
    assert_same_checkpoint(demo, reference)
    assert series_steps(demo) == list(range(10, STEPS + 1, 10))


@pytest.mark.parametrize("kill_at", ["between-saves", "during-validation"])
def test_kill_9_then_resume_is_bit_exact(kill_at, demo, reference):
    proc = stage(demo)
    if kill_at == "between-saves":
        wait_for(proc, metric_at(70))            # last saved at 50
    else:
        wait_for(proc, lambda e: e["type"] == "progress" and "validating at step 100" in e["payload"].get("detail", ""))
    proc.kill()
    proc.wait(timeout=60)
    saved = json.loads((demo.checkpoints_dir / "last.json").read_text())["step"]
    assert saved in (50, 100)
    resume_to_end(demo)
    assert_same_checkpoint(demo, reference)
    assert series_steps(demo) == list(range(10, STEPS + 1, 10))   # no repeat, no gap


def _last_logged_step(proc: subprocess.Popen, since: int) -> int:
    """The step of the last metric the stage has written so far (it is stopped: nothing more comes)."""
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        written = proc.stdout.read() or b""
    finally:
        os.set_blocking(proc.stdout.fileno(), True)
    steps = [e["payload"]["step"] for e in map(parse_event, written.splitlines())
             if e and e["type"] == "metric" and "loss" in e["payload"]]
    return max([since, *steps])


def test_lowering_steps_while_running_finishes_at_the_next_log_interval(demo, run_cli):
    """The stage is held (SIGSTOP) while `set` runs: on a loaded machine the CLI's own start took long enough
    for the demo's 120 steps to end first. Lowered below the step it is at, it finishes at the first log
    interval after it goes on (the one it was held at when it had not read the settings there yet)."""
    proc = stage(demo)
    event = wait_for(proc, metric_at(20))
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        logged = _last_logged_step(proc, event["payload"]["step"])
        r = run_cli("set", "--project", str(demo.root), "--steps", "15")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert r.returncode == 0
    out = finish(proc)
    final = json.loads((demo.checkpoints_dir / "last.json").read_text())
    assert "finishing now" in out
    # the next log interval (every 10 steps) after where it was held, one more for a line not flushed yet
    assert final["step"] == final["planned_steps"] and event["payload"]["step"] <= final["step"] <= logged + 20
    assert final["val_cos"] is not None                       # validated at the final step
    assert stage_done(Project.open(demo.root), "train")


def test_raising_steps_while_running_keeps_going(demo, run_cli):
    proc = stage(demo)
    wait_for(proc, metric_at(20))
    assert run_cli("set", "--project", str(demo.root), "--steps", "160").returncode == 0
    out = finish(proc)
    assert "planned steps changed: 120 -> 160" in out and "the lr schedule follows the new count" in out
    assert json.loads((demo.checkpoints_dir / "last.json").read_text())["step"] == 160


def test_raising_steps_after_a_finished_run_continues_with_a_warm_restart(demo, reference):
    shutil.rmtree(demo.checkpoints_dir, ignore_errors=True)
    shutil.copytree(reference.checkpoints_dir, demo.checkpoints_dir)
    assert stage_done(demo, "train")
    demo.update_settings(["train.steps=160"])
    assert not stage_done(demo, "train")                       # un-finished by the higher count
    report = ListReport()
    assert train.run(Project.open(demo.root), report) == "done"
    logs = [e["message"] for e in report.of_type("log")]
    assert any("resumed from last.pt at step 120" in m for m in logs)
    assert any("planned steps changed since the checkpoint: 120 -> 160" in m for m in logs)
    points = {p["step"]: p for p in train.metric_series(demo)}
    t = demo.settings.train
    # the lr logged at step 130 is the lr of optimizer step 129 under the 160-step schedule
    assert points[130]["lr"] == pytest.approx(lr_at(129, t.lr, t.warmup, 160))
    assert points[130]["lr"] > points[120]["lr"]              # warm restart: lifted back up
    assert json.loads((demo.checkpoints_dir / "last.json").read_text())["step"] == 160


def test_a_snapshot_request_saves_within_one_step_and_training_continues(demo):
    proc = stage(demo)
    wait_for(proc, metric_at(20))
    demo.snapshot_file.write_text("snapshot\n")
    event = wait_for(proc, lambda e: e["type"] == "log" and "snapshot request" in e["payload"]["message"])
    assert not demo.snapshot_file.exists()
    saved = json.loads((demo.checkpoints_dir / "last.json").read_text())
    assert saved["val_cos"] is not None and 20 <= saved["step"] < STEPS
    finish(proc)
    assert json.loads((demo.checkpoints_dir / "last.json").read_text())["step"] == STEPS
    assert series_steps(demo) == list(range(10, STEPS + 1, 10))
    assert f"at step {saved['step']}" in event["payload"]["message"]


def test_loss_falls_and_val_cos_beats_the_per_dim_mean(reference):
    series = train.metric_series(reference)
    assert series[-1]["loss"] < series[0]["loss"] * 0.8
    mu, _, _ = load_stats(reference, 0.03)
    base = [float(row_cos(mu.expand_as(b.target), b.target)[b.tmask].mean())
            for b in val_batches(valid_shards(reference, "val"), reference.settings.train.batch_size)]
    baseline = sum(base) / len(base)
    best = json.loads((reference.checkpoints_dir / "best.json").read_text())
    assert best["best_val_cos"] > baseline + 0.03, (best, baseline)


def test_checkpoint_sidecars_are_readable_without_torch(reference):
    last = json.loads((reference.checkpoints_dir / "last.json").read_text())
    assert last["step"] == STEPS and last["planned_steps"] == STEPS and last["val_step"] == STEPS
    assert set(last["val"]) == {"val_cos", "val_rel_mse"}
    best = json.loads((reference.checkpoints_dir / "best.json").read_text())
    assert best["best_val_cos"] == max(best["best_val_cos"], last["val_cos"])
    ck = torch.load(reference.checkpoints_dir / "last.pt", weights_only=False)
    assert ck["pack"] == "t5xxl_pixart" and ck["config"]["kind"] == "seeded_resampler"
    assert ck["train_config"]["steps"] == STEPS and ck["standardized"] is False
    assert set(ck["rng"]) == {"cpu", "cuda"} and ck["mu"].shape == ck["sigma"].shape


def test_a_changed_architecture_is_refused_on_resume(demo, reference):
    shutil.copytree(reference.checkpoints_dir, demo.checkpoints_dir, dirs_exist_ok=True)
    demo.update_settings(["train.width=128", "train.steps=200"])
    with pytest.raises(TrainerError, match=r"width 64 → 128.*reset training"):
        train.run(Project.open(demo.root), ListReport())


def test_kept_steps_on_a_schedule_with_a_keep_limit(demo):
    demo.update_settings(["train.history=true", "train.history_every=40", "train.history_keep=2"])
    assert train.run(Project.open(demo.root), ListReport()) == "done"
    kept = sorted(p.name for p in (demo.checkpoints_dir / "history").glob("*.pt"))
    # the grid gives 40, 80 (120 is forced as the final step); only the newest 2 are kept
    assert kept == ["step120.pt", "step80.pt"]
    ck = torch.load(demo.checkpoints_dir / "history" / "step120.pt", weights_only=False)
    assert "optimizer" not in ck and ck["model"]["blocks.0.self_attn.q.weight"].dtype == torch.float16


def test_token_budget_micro_batches_give_the_same_step(demo):
    """Chunks weighted by their share of supervised rows reproduce the whole batch's gradient."""
    from trainer_core.contract.shards import shard_files
    from trainer_core.contract.stream import ShardStream
    whole = train.Trainer(demo, ListReport())
    demo.update_settings(["train.batch_tokens=300"])
    chunked = train.Trainer(Project.open(demo.root), ListReport())
    batch = ShardStream(shard_files(demo, "train"), 16, 42).next()
    assert len(chunked._chunks(batch)) > 2 and len(whole._chunks(batch)) == 1
    a, b = whole.train_step(batch), chunked.train_step(batch)
    assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
    for (name, p), q in zip(whole.model.named_parameters(), chunked.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)



def test_a_compiled_step_that_fails_falls_back_to_eager_with_a_warning(demo, reference, monkeypatch):
    """train.compile on, where torch.compile cannot run: the first step says so and training goes on
    eagerly, to the weights of the eager reference run."""
    from trainer_core.stages import train

    def broken_compile(model, **kwargs):
        def fails(*args, **kw):
            raise RuntimeError("no C++ compiler found\nmore details")
        return fails
    monkeypatch.setattr(torch, "compile", broken_compile)
    demo.update_settings(["train.compile=on"])
    report = ListReport()
    assert train.run(Project.open(demo.root), report) == "done"
    warnings = [e["message"] for e in report.of_type("log") if e.get("level") == "warning"]
    assert warnings == ["torch.compile failed (RuntimeError: no C++ compiler found); training continues without it "
                        "(train.compile off)"]
    assert "torch.compile" in report.of_type("log")[0]["message"]             # the first line says it was on
    assert_same_checkpoint(demo, reference)


# ---------------------------------------------------------------- damaged checkpoints, stale temps (issue 18)

def test_a_truncated_last_checkpoint_resumes_from_best_with_a_warning(demo, reference):
    proc = stage(demo)
    wait_for(proc, metric_at(30))
    proc.send_signal(signal.SIGTERM)
    finish(proc, 4)
    best_step = json.loads((demo.checkpoints_dir / "best.json").read_text())["step"]
    last = demo.checkpoints_dir / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    report = ListReport()
    assert train.run(Project.open(demo.root), report) == "done"
    warnings = [e["message"] for e in report.of_type("log") if e.get("level") == "warning"]
    assert len(warnings) == 1 and "skipped a damaged checkpoint" in warnings[0] and "last.pt" in warnings[0]
    assert any(f"resumed from best.pt at step {best_step}" in e["message"] for e in report.of_type("log"))
    assert_same_checkpoint(demo, reference)                      # the steps from best on, to the bit
    assert series_steps(demo) == list(range(10, STEPS + 1, 10))


def test_no_readable_checkpoint_starts_over_and_stale_temps_are_removed(demo, reference):
    ck = demo.checkpoints_dir
    (ck / "history").mkdir(parents=True)
    (ck / "last.pt").write_bytes(b"not a checkpoint at all")
    (ck / "best.pt").write_bytes(b"\x00" * 64)
    stale = [ck / ".best.pt.k2j4.tmp", ck / ".last.pt.9x8y.tmp", ck / "history" / ".step40.pt.aaaa.tmp"]
    for tmp in stale:
        tmp.write_bytes(b"\x00" * 1000)
    (ck / "metrics.jsonl").write_text(json.dumps({"step": 500, "loss": 1.0}) + "\n")
    report = ListReport()
    assert train.run(Project.open(demo.root), report) == "done"
    warnings = [e["message"] for e in report.of_type("log") if e.get("level") == "warning"]
    assert [("last.pt" in w, "best.pt" in w) for w in warnings[:2]] == [(True, False), (False, True)]
    assert warnings[2:] == ["no readable checkpoint is left; training starts over from step 0"]
    assert not any(tmp.exists() for tmp in stale)
    assert any("removed 3 temp file(s)" in e["message"] for e in report.of_type("log"))
    assert_same_checkpoint(demo, reference)
    assert series_steps(demo) == list(range(10, STEPS + 1, 10))
