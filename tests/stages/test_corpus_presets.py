"""Prompt-dataset presets read from a local Hub (tests/hub_server.py) serving parquet, mixed
with a local file, filtered and de-duplicated by the real corpus stage in its own process."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from hub_server import LocalHub, parquet_bytes
from trainer_core.project import Project


def test_presets_become_corpus_lines(tmp_path):
    sd = [{"Prompt": f"stable diffusion prompt {i}, oil painting"} for i in range(300)] + [{"Prompt": ""}]
    db = [{"prompt": f"diffusiondb prompt {i} under neon light", "seed": i} for i in range(200)]
    db.append({"prompt": "STABLE DIFFUSION PROMPT 7, OIL PAINTING", "seed": 0})          # a duplicate (case)
    vid = [{"prompt": f"vidprom clip {i} of a river", "uuid": str(i)} for i in range(150)]
    repos = {"Gustavosta/Stable-Diffusion-Prompts": {"data/train-00000-of-00001.parquet": parquet_bytes(sd)},
             "poloclub/diffusiondb": {"metadata.parquet": parquet_bytes(db)},
             "WenhaoWang/VidProM": {"data/train-00000-of-00001.parquet": parquet_bytes(vid)}}
    types = {repo: "dataset" for repo in repos}
    own = tmp_path / "mine.txt"
    own.write_text("".join(f"my own prompt number {i}\n" for i in range(20)) + "short\n", encoding="utf-8")
    project = Project.create(tmp_path / "p", "llada_image")
    project.update_settings(['corpus.presets=["gustavosta","midjourney","diffusiondb","vidprom"]',
                             f"corpus.extra_files={own}", "corpus.n_val=40", "corpus.n_train=1000"])
    with LocalHub(repos, repo_types=types) as hub:
        env = hub.client_env(tmp_path / "cache")
        env["PYTHONPATH"] = str(REPO)
        r = subprocess.run([sys.executable, "-m", "trainer_core", "run", "--project", str(project.root),
                            "--only", "corpus"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train, val = (p.read_text(encoding="utf-8").splitlines() for p in project.corpus_files())
    lines = [t for t in train + val if t]
    expected = ({s["Prompt"] for s in sd if s["Prompt"]} | {d["prompt"] for d in db[:-1]} |
                {v["prompt"] for v in vid} | {f"my own prompt number {i}" for i in range(20)})
    empties = (train + val).count("")                 # the empty prompts replace some of the pool
    assert len(expected) == 670 and empties == 6 + 1   # int(630 · 0.01) in train, max(1, int(0.4)) in val
    assert set(lines) <= expected and len(lines) == len(set(lines)) == 670 - empties
    for marker in ("stable diffusion prompt", "diffusiondb prompt", "vidprom clip", "my own prompt"):
        assert sum(marker in t for t in lines) > 10, marker            # every source is in the corpus
    assert "short" not in lines and "STABLE DIFFUSION PROMPT 7, OIL PAINTING" not in lines
    events = [json.loads(line) for line in project.events_jsonl.read_text(encoding="utf-8").splitlines()]
    warnings = [e["payload"]["message"] for e in events if e["type"] == "log" and e["payload"]["level"] == "warning"]
    assert any("midjourney" in w and "skipped" in w for w in warnings), warnings
