"""The llada_image pack through the stages: shards from the tiny real teacher, the stale-contract
path of the rotary fix, and a whole demo run on the mock teacher to a folded, evaluated GGUF."""
from __future__ import annotations

import json

import pytest
import torch

import demo_cache
from conftest import cli, copy_project, demo_with_corpus
from trainer_core.base.errors import ModelFileError
from trainer_core.base.events import ListReport
from trainer_core.contract import checkpoints
from trainer_core.contract.engine_bpe import TOKENIZATION
from trainer_core.contract.adapter_export import checkpoint_model
from trainer_core.contract.gguf_io import read_adapter_gguf
from trainer_core.inspect_file import describe_gguf
from trainer_core.packs.llada_image.teacher import LLaDATeacher
from trainer_core.project import Project
from trainer_core.contract.shards import Shard, shard_files
from trainer_core.stages import precompute, stage_done
from trainer_core.packs.llada_image.tiny import write_tiny_llada
from trainer_core.packs.lookup import format_prompt, resolve_material

NQ, PROJ = 256, 48


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The LLaDA demo project with its corpus written (built once; tests work on copies)."""
    return demo_with_corpus(tmp_path_factory.mktemp("llada") / "llada_adapter", "llada_image")


@pytest.fixture
def demo(template, tmp_path):
    return copy_project(template, tmp_path)


def with_tiny_teacher(project: Project) -> Project:
    write_tiny_llada(resolve_material(project, "teacher"), num_queries=NQ, proj_dim=PROJ)
    project.update_settings(["precompute.mock_teacher=false"])
    return Project.open(project.root)


def test_teacher_dims_come_from_the_snapshot_or_the_reference_shape_for_the_mock(demo):
    assert demo.pack.teacher_dims(demo) == {"out_dim": 2560, "num_queries": 256}     # mocked, not downloaded
    demo.update_settings(["precompute.mock_teacher=false"])
    # the demo's teacher folder holds only its small SigVQ: the first missing file is named
    with pytest.raises(ModelFileError, match=r"QueryFormer config .*LLaDA-Image-Turbo/queryformer/config\.json is "
                                             r"missing; download inclusionAI/LLaDA-Image-Turbo again"):
        demo.pack.teacher_dims(Project.open(demo.root))
    project = with_tiny_teacher(demo)
    assert project.pack.teacher_dims(project) == {"out_dim": PROJ, "num_queries": NQ}


def test_shards_from_the_tiny_teacher(demo, monkeypatch):
    project = with_tiny_teacher(demo)
    project.update_settings(["precompute.teacher_batch=5"])     # several teacher batches in the shard
    project = Project.open(project.root)
    report = ListReport()
    assert precompute.run(project, report, split="val") == "done"
    logs = [e["message"] for e in report.of_type("log")]
    assert any("rotary table of model.rotary_emb" in m and "rebuilt" in m for m in logs)
    assert (project.shards_dir("val") / "CONTRACT").read_text().strip() == f"llada_image/2 {TOKENIZATION}"
    (path,) = shard_files(project, "val")
    shard = Shard(path)
    prompts = shard.prompts
    s = len(prompts)
    assert s == 32 and shard.meta["mock_teacher"] is False
    t_pack = shard["t_pack"]
    assert t_pack.shape == (s * NQ, PROJ) and t_pack.dtype == torch.bfloat16
    assert int(shard["stat_n"][0]) == s * NQ and shard["t_len"].tolist() == [NQ] * s
    assert int(shard["len"].sum()) == shard["q_pack"].shape[0] == shard["ids"].shape[0]
    torch.testing.assert_close(shard["stat_s"], t_pack.double().sum(0))
    # each prompt's rows are its own single-prompt run, up to bf16 arithmetic (the stage runs the teacher in
    # bf16: batched and alone differ by a few rounding steps, rows of |x| ≈ 1.25 agree to cos ≥ 0.999)
    teacher = LLaDATeacher(resolve_material(project, "teacher"))
    for r in (0, s // 2, s - 1):
        alone = teacher.forward_prompts([format_prompt(project.pack, prompts[r])])[0]
        cos = torch.nn.functional.cosine_similarity(t_pack[r * NQ:(r + 1) * NQ].float(), alone, dim=-1)
        assert float(cos.min()) >= 0.999
    lens = teacher.text_lens([format_prompt(project.pack, p) for p in prompts])
    assert lens == sorted(lens)                                  # the shard keeps the teacher-length order


@pytest.mark.parametrize("old", ["llada_image/1", "llada_image/2", None])
def test_shards_of_the_unfixed_teacher_are_discarded_and_checkpoints_archived(demo, old):
    assert precompute.run(demo, ListReport(), split="val") == "done"
    (path,) = shard_files(demo, "val")
    contract = demo.shards_dir("val") / "CONTRACT"
    if old is None:
        contract.unlink()
    else:
        contract.write_text(old + "\n")
    assert not stage_done(demo, "precompute_val")
    demo.checkpoints_dir.mkdir()
    (demo.checkpoints_dir / "last.pt").write_bytes(b"trained on scrambled positions")
    report = ListReport()
    assert precompute.run(demo, report, split="val") == "done"
    why = f'written under "{old}"' if old else "written without a CONTRACT marker"
    assert any(f"val shards discarded: 1 were {why}" in e["message"] for e in report.of_type("log"))
    assert any("prompts exactly as the engine does" in e["message"] for e in report.of_type("log"))
    (archived,) = demo.root.glob("checkpoints.stale-*")
    assert (archived / "last.pt").read_bytes() == b"trained on scrambled positions"
    assert contract.read_text().strip() == f"llada_image/2 {TOKENIZATION} mock-teacher"
    assert stage_done(demo, "precompute_val")


def test_the_demo_exports_a_folded_seedless_resampler_with_eval_metrics(tmp_path):
    """On the session's trained LLaDA demo (tests/demo_cache.py: the whole pipeline, its stage processes)."""
    root = demo_cache.copy_trained("llada_image", tmp_path)
    gguf = root.parent / "pig_llada_adapter-f16.gguf"
    info = describe_gguf(gguf)
    assert info["kind"] == "adapter" and info["variant"] == "resampler"
    assert not [p for p in info["problems"] if p["fatal"]]
    assert info["config"]["num_queries"] == 256 and info["config"]["out_dim"] == 2560
    assert "adapter.t5_embed.weight" not in info["kvs"] and info["kvs"]["adapter.target"].startswith("llada_image")
    assert (root.parent / "pig_llada_sigvq-f16.gguf").is_file()           # the demo's small SigVQ, exported beside

    # the fold: the GGUF alone gives rows in teacher scale (μ + σ·the checkpoint's standardized rows)
    project = Project.open(root)
    shard = Shard(shard_files(project, "val")[0])
    n0 = int(shard["len"][0])
    hidden = shard["q_pack"][:n0].float()[None]                                   # the first prompt's states
    with torch.no_grad():
        out = read_adapter_gguf(gguf).model(hidden, None)[0]                      # [256, 2560]
        ck = checkpoints.load(root / "checkpoints" / "best.pt")
        standardized = checkpoint_model(ck)[1](hidden, None)[0]
    target = shard["t_pack"][:256].float()
    assert out.shape == target.shape
    assert abs(float(out.mean()) - float(target.mean())) < 0.01 * abs(float(target.mean()))   # ~2000, not ~0
    assert abs(float(standardized.mean())) < 1.0
    torch.testing.assert_close(out, standardized * ck["sigma"].float() + ck["mu"].float(), atol=1.0, rtol=1e-3)

    ev = json.loads((root / "eval.json").read_text())
    names = project.pack.metric_names
    assert names[0] == "cos_centered"
    for key in names:
        assert key in ev, key
    assert ev["roundtrip_cos"] >= 0.999 and ev["val_batches"] >= 1
    assert ev["cos_raw"] > 0.99          # the shared offset: plain cosine is high whatever the prompt part does
    status = cli("status", "--project", str(root))
    assert "cos_centered" in status.stdout and "pig_llada_sigvq-f16.gguf" in status.stdout
