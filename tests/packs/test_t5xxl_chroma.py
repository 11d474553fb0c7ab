"""The Chroma pack (trainer_core/packs/t5xxl_chroma/): its demo through the CLI, the unmasked teacher against
a plain transformers T5 forward, the 512-slot window rule, batched precompute against one prompt at a time,
and the pack's place in the registry.

The engine facts the expectations are built from (ggk 0.9.7's T5CLIPEmbedder for Chroma): the window is the
prompt's T5 ids + EOS (1), cut to 511 ids + EOS, padded with 0 to 512; T5 runs over all 512 slots with no
key mask; the DiT reads the real slots, EOS and the first pad slot.
"""
from __future__ import annotations

import json
import subprocess
import zlib
from pathlib import Path

import pytest
import torch

import demo_cache
from conftest import REPO
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.base import Budgets
from trainer_core.project import Project
from trainer_core.packs.lookup import resolve_material, teacher_module
from trainer_core.packs.estimates import teacher_need_gib

PACK_ID = "t5xxl_chroma"
WINDOW, EOS, PAD = 512, 1, 0


def expected_window(tokenizer, prompt: str) -> tuple[list[int], int, int]:
    """(512 ids, real slots, supervised rows) of a prompt by the engine's rule, from the tokenizer's pieces alone."""
    pieces = [i for chunk, _ in parse_prompt_attention(prompt) for i in tokenizer.encode(chunk)]
    real = pieces[:WINDOW - 1] + [EOS]
    return real + [PAD] * (WINDOW - len(real)), len(real), min(len(real) + 1, WINDOW)


def single_piece_word(tokenizer) -> str:
    """A word of the demo vocabulary that is one piece alone and n pieces repeated n times."""
    for word in ("photo", "painting", "sketch", "render", "drawing", "lighting", "morning"):
        if len(tokenizer.encode(word)) == 1 and len(tokenizer.encode(" ".join([word] * 9))) == 9:
            return word
    raise AssertionError("no single-piece word in the demo's tiny T5 vocabulary")


class _StubStudent:
    """A student of one 8-wide row per character (the mock teacher's test needs no real one)."""

    def ids(self, chunks: list[str]) -> list[int]:
        return [ord(c) for chunk in chunks for c in chunk] or [0]

    def rows(self, token_lists, max_len, max_batch, tok_budget):
        tokens = [t[:max_len] for t in token_lists]
        return tokens, [torch.tensor(t, dtype=torch.bfloat16)[:, None].expand(-1, 8) for t in tokens], 0


@pytest.fixture(scope="module")
def demo():
    """The cached demo project of the pack, built and not run (its tiny real T5 and student)."""
    from trainer_core.project import Project
    return Project.open(demo_cache.built(PACK_ID))


@pytest.fixture(scope="module")
def teacher_dir(demo):
    return resolve_material(demo, "teacher")


@pytest.fixture(scope="module")
def teacher(teacher_dir):
    from trainer_core.packs.t5xxl_chroma.teacher import ChromaTeacher
    return ChromaTeacher(teacher_dir)


@pytest.fixture(scope="module")
def prompts(teacher):
    """Demo-like prompts, the empty prompt, and one of more than 511 pieces."""
    from trainer_core.packs.common.tiny_models import demo_prompts
    texts = demo_prompts()
    long = " ".join(texts[:60])
    assert len(teacher.tokenizer.encode(long)) > WINDOW - 1
    return [texts[0], "", texts[1], long, "(masterpiece:1.2) " + texts[2], texts[3], texts[4]]


# ---------------------------------------------------------------- 1. the demo's run, read back through the CLI

def test_the_demos_run_exports_an_adapter_inspect_accepts(tmp_path, run_cli):
    """The session's demo run (tests/demo_cache.py: `gguf-trainer demo`'s project, its stage processes started as
    `gguf-trainer run` starts them), read back through the CLI."""
    from trainer_core.contract.shards import Shard, shard_files
    project = demo_cache.copy_trained(PACK_ID, tmp_path)

    exported = sorted(project.parent.glob("*-f16.gguf"))
    assert [p.name for p in exported] == ["pig_t5_chroma_adapter-f16.gguf"]
    inspect = run_cli("inspect", str(exported[0]), "--json", cwd=tmp_path)
    assert inspect.returncode == 0, inspect.stderr[-2000:]
    info = json.loads(inspect.stdout)
    assert info["kind"] == "adapter" and info["variant"] == "seeded_resampler" and info["problems"] == []
    kvs = info["kvs"]
    assert kvs["adapter.pack"] == PACK_ID and kvs["adapter.num_queries"] == WINDOW
    assert kvs["adapter.target"].startswith("chroma:") and "unmasked 512-slot window" in kvs["adapter.target"]
    assert kvs["adapter.teacher"] == "callgg/t5-v1_1-xxl-encoder-bf16"

    evaluation = json.loads((project / "eval.json").read_text())
    assert evaluation["pack"] == PACK_ID and evaluation["roundtrip_cos"] >= 0.999
    assert evaluation["config"]["num_queries"] == WINDOW and evaluation["trained_steps"] == demo_cache.STEPS
    assert evaluation["val_samples"] == 40 and 0.0 < evaluation["cos"] <= 1.0

    # the shards hold the supervised rows: after each window's EOS exactly one pad slot (none in a full window)
    (path,) = shard_files(Project.open(project), "val")
    shard = Shard(path)
    ids, lens = shard["seed_ids"].long(), shard["seed_len"].long()
    assert ids.shape == (40, WINDOW) and torch.equal(shard["t_len"].long(), lens)
    assert shard["t_pack"].shape[0] == int(lens.sum())
    for row, n in zip(ids.tolist(), lens.tolist()):
        if n < WINDOW:
            assert row[n - 2:n] == [EOS, PAD] and set(row[n - 1:]) == {PAD}, n
        else:
            assert EOS in row[-2:], n


# ---------------------------------------------------------------- 2. the teacher is T5 unmasked

def test_teacher_rows_are_t5_over_the_whole_window_without_a_mask(teacher, teacher_dir, prompts):
    from transformers import T5EncoderModel
    eager = T5EncoderModel.from_pretrained(teacher_dir, attn_implementation="eager").eval()
    plain = T5EncoderModel.from_pretrained(teacher_dir).eval()          # transformers' default attention
    ids, lens = teacher.seed_windows(prompts)
    out = teacher.forward(ids, lens)
    assert out.dtype == torch.float32 and out.shape == (len(prompts), WINDOW, teacher.out_dim)  # the long one: 512
    differs = 0
    with torch.inference_mode():
        for i, text in enumerate(prompts):
            window, real, n = expected_window(teacher.tokenizer, text)
            full = torch.tensor([window])                                           # [1, 512]
            assert ids[i].tolist() == window and int(lens[i]) == n
            unmasked = eager(input_ids=full).last_hidden_state[0]                   # [512, out]
            assert torch.equal(out[i, :n], unmasked[:n]), text
            torch.testing.assert_close(out[i, :n], plain(input_ids=full).last_hidden_state[0, :n],
                                       rtol=1e-4, atol=1e-4)
            # the key-masked forward (PixArt's teacher): the same rows only where there is no pad to see
            mask = (torch.arange(WINDOW) < real).long()[None]                       # [1, 512]
            masked = eager(input_ids=full, attention_mask=mask).last_hidden_state[0, :real]
            if real < WINDOW:
                assert (out[i, :real] - masked).abs().max() > 0.1, text
                differs += 1
            else:
                torch.testing.assert_close(out[i, :real], masked, rtol=1e-5, atol=1e-5)
    assert differs == len(prompts) - 1


def test_real_rows_are_the_supervised_rows_and_no_prompts_give_none(teacher, prompts):
    rows = teacher.real_rows(prompts)
    assert [r.shape[0] for r in rows] == [expected_window(teacher.tokenizer, p)[2] for p in prompts]
    ids, lens = teacher.seed_windows([])
    assert ids.shape == (0, WINDOW) and lens.shape == (0,)
    assert teacher.forward(ids, lens).shape == (0, 0, teacher.out_dim)


def test_teacher_refuses_windows_of_another_length(teacher):
    ids, lens = teacher.seed_windows(["a photo"])
    with pytest.raises(ValueError, match=r"ids \[B, 512\]"):
        teacher.forward(ids[:, :120], lens)
    with pytest.raises(ValueError, match="every len must be in 1..512"):
        teacher.forward(ids, torch.tensor([0]))


# ---------------------------------------------------------------- 3. the window rule

@pytest.mark.parametrize("case", ["empty", "short", "attention", "pieces_510", "pieces_511", "pieces_600"])
def test_window_rule(teacher, case):
    tok = teacher.tokenizer
    word = single_piece_word(tok)
    text = {"empty": "", "short": "a photo of a cat", "attention": "a (red:1.3) fox, [sketch]",
            "pieces_510": " ".join([word] * 510), "pieces_511": " ".join([word] * 511),
            "pieces_600": " ".join([word] * 600)}[case]
    ids, lens = teacher.seed_windows([text])
    window, real, supervised = expected_window(tok, text)
    assert ids.dtype == torch.long and ids.shape == (1, WINDOW) and ids[0].tolist() == window
    assert lens.tolist() == [supervised]
    expected = {"empty": (2, 3), "pieces_510": (511, 512), "pieces_511": (512, 512), "pieces_600": (512, 512)}
    if case in expected:
        assert (real, supervised) == expected[case]
    if case == "empty":          # the engine's empty prompt is [▁, EOS]; the DiT also reads the pad after it
        assert window[:4] == [tok.piece_id("▁"), EOS, PAD, PAD]
    if case == "pieces_600":     # cut to 511 pieces + EOS, no pad slot left
        assert window == tok.encode(word) * 511 + [EOS]


def test_mock_window_rule_and_rows():
    from trainer_core.packs.t5xxl_chroma.teacher import MockChromaTeacher
    mock = MockChromaTeacher(out_dim=16, vocab_size=500)
    texts = ["a  red\tfox", "", " ".join(f"w{i}" for i in range(700))]
    ids, lens = mock.seed_windows(texts)
    fox = 2 + zlib.crc32(b"fox") % 498
    assert ids.shape == (3, WINDOW) and lens.tolist() == [5, 2, 512]
    assert ids[0, :5].tolist() == [2 + zlib.crc32(b"a") % 498, 2 + zlib.crc32(b"red") % 498, fox, EOS, PAD]
    assert ids[1, :2].tolist() == [EOS, PAD] and int(ids[2, 511]) == EOS
    assert int(ids[2, 510]) == 2 + zlib.crc32(b"w510") % 498
    out = mock.forward(ids, lens)
    assert out.shape == (3, WINDOW, 16)
    torch.testing.assert_close(mock.real_rows(texts[:1])[0], out[0, :5], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- 4. batched precompute

def test_batched_shard_equals_one_prompt_at_a_time(demo, teacher, prompts):
    from trainer_core.contract.student import load_student
    pack = demo.pack
    student = load_student(resolve_material(demo, "student"), resolve_material(demo, "student_tokenizer"))
    many = prompts + ["a photo", "sketch of a moon in the rain"]
    batched, meta = pack.make_shard(many, student, teacher, Budgets(3, 3 * WINDOW, 3, 3 * 64))
    assert sorted(meta["prompts"]) == sorted(many) and meta["num_queries"] == WINDOW
    lens = batched["t_len"].long()
    assert lens.tolist() == sorted(lens.tolist())
    t_starts = (torch.cumsum(lens, 0) - lens).tolist()
    q_lens = batched["len"].long()
    q_starts = (torch.cumsum(q_lens, 0) - q_lens).tolist()
    for k, text in enumerate(meta["prompts"]):
        alone, _ = pack.make_shard([text], student, teacher, Budgets(1, WINDOW, 1, 64))
        n, q = int(lens[k]), int(q_lens[k])
        assert n == expected_window(teacher.tokenizer, text)[2]
        assert torch.equal(batched["seed_ids"][k], alone["seed_ids"][0])
        assert torch.equal(batched["seed_len"][k:k + 1], alone["seed_len"])
        assert torch.equal(batched["t_pack"][t_starts[k]:t_starts[k] + n], alone["t_pack"]), text
        assert torch.equal(batched["ids"][q_starts[k]:q_starts[k] + q], alone["ids"])
        # the student runs padded batches: its rows may move by float rounding, then bf16
        torch.testing.assert_close(batched["q_pack"][q_starts[k]:q_starts[k] + q].float(), alone["q_pack"].float(),
                                   rtol=1e-2, atol=1e-2)
    full = torch.cat([r.to(torch.bfloat16) for r in teacher.real_rows(meta["prompts"])])
    assert torch.equal(batched["t_pack"], full)


def test_budgets_fit_whole_windows(demo, tmp_path):
    from trainer_core.project import Project
    project = Project.open(demo_cache.copy_built(PACK_ID, tmp_path))
    auto = project.pack.budgets(project, torch.device("cpu"))      # CPU auto: 64 prompts, 8192 tokens
    assert (auto.teacher_batch, auto.tok_budget) == (8192 // WINDOW, 8192)
    project.update_settings(["precompute.teacher_batch=3", "precompute.tok_budget=4096"])
    assert project.pack.budgets(project, torch.device("cpu")).teacher_batch == 3
    project.update_settings(["precompute.teacher_batch=0", "precompute.tok_budget=700"])
    assert project.pack.budgets(project, torch.device("cpu")).teacher_batch == 1


# ---------------------------------------------------------------- 5. the registry and the layout

def test_registry_finds_the_pack_and_its_teacher_module():
    import importlib

    from trainer_core.packs import DEMO_PACKS, PACKS
    pack = PACKS[PACK_ID]
    assert PACK_ID in DEMO_PACKS and pack.adapter_kind == "seeded_resampler" and pack.corpus_kind == "text"
    assert pack.reference_dims == {"out_dim": 4096, "num_queries": WINDOW, "seed_vocab": 32128}
    assert [p.id for p in PACKS.values() if p.order == pack.order] == [PACK_ID]
    assert [p.id for p in PACKS.values() if p.demo_order == pack.demo_order] == [PACK_ID]
    module = importlib.import_module(teacher_module(pack))
    assert callable(module.choose_mode) and callable(module.resident_need_gib)
    assert module.choose_mode(Path("/nonexistent"), "auto", torch.device("cpu"), 0.0) == "cpu"


def test_pack_dims_mock_and_plan_hooks(demo, teacher):
    pack = demo.pack
    dims = pack.teacher_dims(demo)
    assert dims == {"out_dim": teacher.out_dim, "seed_vocab": teacher.vocab_size, "num_queries": WINDOW}
    config = pack.adapter_config(demo, 64, dims)
    assert (config.kind, config.num_queries, config.seed_vocab) == ("seeded_resampler", WINDOW, teacher.vocab_size)
    mock = pack.build_mock_teacher(demo)
    assert (mock.out_dim, mock.vocab_size, mock.window) == (teacher.out_dim, teacher.vocab_size, WINDOW)
    student = _StubStudent()
    tensors, meta = pack.make_shard(["a red fox", "", "w " * 40], student, mock, Budgets(2, 2 * WINDOW, 2, 64))
    assert meta["prompts"] == ["", "a red fox", "w " * 40] and tensors["seed_len"].tolist() == [2, 5, 42]
    assert tensors["t_pack"].shape == (49, teacher.out_dim) and tensors["seed_ids"].shape == (3, WINDOW)
    weights = (Path(resolve_material(demo, "teacher")) / "model.safetensors").stat().st_size / 2**30
    assert teacher_need_gib(demo) == pytest.approx(weights + 2.5)
    command = pack.ggk_command(demo)
    assert "--diffusion-model chroma1-hd-Q8_0.gguf --vae ae.safetensors" in command
    assert f"--llm-adapter {demo.gguf_path()}" in command and "pig_clip-demo-f16.gguf" in command


def test_a_shards_estimate_follows_the_prompt_files_length(tmp_path):
    """Per sample: a student row a token and the real T5 slots + EOS + the first pad (bf16), the window's seed
    ids (int32); the tokens at 4 characters each of the prompts the corpus reads, 50 when none can be read."""
    project = Project.create(tmp_path / "c", "t5xxl_chroma")
    dims = {"out_dim": 4096, "num_queries": WINDOW}
    assert project.pack.shard_bytes(project, dims, 1024) == 50 * 1024 * 2 + 52 * 4096 * 2 + WINDOW * 4
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("x" * 40 + "\n" + "y" * 80 + "\n", encoding="utf-8")       # 60 characters: 15 tokens
    project.update_settings(["corpus.mode=files", f"corpus.train_file={prompts}", f"corpus.val_file={prompts}"])
    project = Project.open(project.root)
    assert project.pack.shard_bytes(project, dims, 1024) == 15 * 1024 * 2 + 17 * 4096 * 2 + WINDOW * 4


def test_chroma_is_named_only_inside_the_pack_folder():
    listed = subprocess.run(["grep", "-rli", "chroma", "trainer_core", "ui"], cwd=REPO, capture_output=True,
                            text=True, check=False)
    files = listed.stdout.split()
    assert files, listed.stderr
    assert [f for f in files if not f.startswith("trainer_core/packs/t5xxl_chroma/")] == []
    assert {"trainer_core/packs/t5xxl_chroma/__init__.py", "trainer_core/packs/t5xxl_chroma/teacher.py",
            "trainer_core/packs/t5xxl_chroma/template.py"} <= set(files)
