"""The qwen35_bridge adapter GGUF: layout, KVs and vocabulary, the fold of both heads, the engine's
reading rules, and `gguf-trainer infer` against an independent numpy forward (bridge_numpy.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch

from numpy_adapters import bridge_forward, engine_bank_hidden, engine_bank_rows, gguf_tensors
from test_gguf_io import PROV, f16_rounded, random_adapter
from trainer_core.base.errors import ModelFileError
from trainer_core.cli import main

from trainer_core.packs.base import ExportContents
from trainer_core.contract.adapter_export import export_checkpoint
from trainer_core.contract.adapter import Bridge
from trainer_core.contract.kinds import (AdapterConfig, build_adapter, detect_layout, expected_ne, expected_tensor_count,
                                         gguf_dtype)
from trainer_core.contract.gguf_io import (Provenance, read_adapter_gguf, read_gguf_kvs, read_gguf_string_array,
                                           write_adapter_gguf)

IN, OUT, VIS, W, BANK_DIM = 48, 40, 24, 64, 56
SEED_VOCAB, SEED_RANK, MAX_SLOTS = 300, 16, 40
BANKS = {"prompt": dict(n_bank=160, bank_dim=BANK_DIM, bank_align=True),
         "caption": dict(n_bank=80, bank_dim=BANK_DIM, bank_align=False),
         "none": {}}
ARRAYS = {"tokenizer.ggml.tokens": [f"tok{i}" for i in range(SEED_VOCAB - 2)] + ["Ġé", "<|im_end|>"],
          "tokenizer.ggml.merges": ["t o", "to k", "Ġ é"]}
# one sample: 7 student rows, a 30-slot template with two references of 6 and 9 vision rows
N_BODY, P, VIS_POS = 7, 30, [(4, 6), (12, 9)]


def config(variant: str, **kw) -> AdapterConfig:
    return AdapterConfig("qwen35_bridge", IN, OUT, W, 2, seed_vocab=SEED_VOCAB, vis_dim=VIS, max_slots=MAX_SLOTS,
                         seed_rank=SEED_RANK, **{**BANKS[variant], **kw})


def fold_stats(c: AdapterConfig, seed: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    fold = {"mu": torch.randn(OUT, generator=g) * 3, "sigma": torch.rand(OUT, generator=g) * 2 + 0.03}
    if c.n_bank:
        fold.update(bank_mu=torch.randn(BANK_DIM, generator=g) * 2, bank_sigma=torch.rand(BANK_DIM, generator=g) + 0.03)
    return fold


def export(tmp_path: Path, variant: str) -> tuple[Path, torch.nn.Module, dict]:
    c = config(variant)
    model, fold = random_adapter(c), fold_stats(c)
    path = write_adapter_gguf(tmp_path / f"pig_bridge_{variant}-f16.gguf", model, c, name="pig_bridge",
                              pack="qwen35_bridge", provenance=PROV, arrays=ARRAYS, **fold)
    return path, model, fold


def sample(seed: int = 3) -> tuple[np.ndarray, list[int], np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((N_BODY, IN)).astype(np.float32)
    ids = [int(i) for i in rng.integers(0, SEED_VOCAB, P)]
    vis = rng.standard_normal((sum(n for _, n in VIS_POS), VIS)).astype(np.float32)
    return hidden, ids, vis


def torch_inputs(hidden, ids, vis, bank_hidden=None) -> tuple[torch.Tensor, dict]:
    vis_slot = torch.zeros(1, P, VIS)
    row = 0
    for start, count in VIS_POS:
        vis_slot[0, start:start + count] = torch.from_numpy(vis[row:row + count])
        row += count
    extra = dict(seed_ids=torch.tensor([ids]), vis_slot=vis_slot, vis_kv=torch.from_numpy(vis)[None])
    if bank_hidden is not None:
        extra["bank_hidden"] = torch.from_numpy(bank_hidden).float()[None]
    return torch.from_numpy(hidden)[None], extra


# ------------------------------------------------------------------ the file

@pytest.mark.parametrize("variant", list(BANKS))
def test_file_layout_kvs_and_vocabulary(variant, tmp_path):
    path, model, _ = export(tmp_path, variant)
    c = config(variant)
    reader = gguf.GGUFReader(path)
    state = model.state_dict()
    assert [t.name for t in reader.tensors] == ["adapter." + n for n in state]
    assert len(reader.tensors) == expected_tensor_count(c)
    types = {t.name[len("adapter."):]: t.tensor_type.name for t in reader.tensors}
    for t in reader.tensors:
        name = t.name[len("adapter."):]
        assert tuple(int(x) for x in t.shape) == tuple(reversed(state[name].shape)), name
        f32 = state[name].ndim == 1 or ".ln_" in name or name.startswith("ln_") or name in ("slot_query", "bank_query")
        assert types[name] == ("F32" if f32 else "F16"), name
    for name in ("seed_embed.weight", "seed_proj.weight", "vis_q.weight", "vis_in.weight", "out_proj.weight"):
        assert types[name] == "F16"
    assert types["slot_query"] == "F32" and ("bank_query" in types) == bool(c.n_bank)
    assert ("bank_in.weight" in types) == c.bank_align and ("out_bank.weight" in types) == bool(c.n_bank)
    if c.n_bank:
        assert types["bank_query"] == "F32" and types["out_bank.weight"] == "F16" and types["out_bank.bias"] == "F32"
    assert list(state)[0] == ("bank_query" if c.n_bank else "slot_query")

    V = gguf.GGUFValueType
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    heads = keys.index("adapter.heads")
    bridge_kvs = ["adapter.kind", "adapter.n_bank", "adapter.bank_dim", "adapter.bank_align", "adapter.max_slots",
                  "adapter.seed_rank", "adapter.seed_vocab", "adapter.vis_dim"]
    assert keys[heads + 1:heads + 9] == bridge_kvs and keys[heads + 9] == "adapter.trained_steps"
    assert "adapter.num_queries" not in keys
    assert keys[-4:] == ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model", "tokenizer.ggml.pre"]
    for key in bridge_kvs[1:]:
        assert reader.fields[key].types == [V.UINT32], key
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert reader.fields[key].types == [V.ARRAY, V.STRING], key
    kvs = read_gguf_kvs(path)
    assert kvs["adapter.kind"] == "qwen35_bridge" and kvs["adapter.max_slots"] == MAX_SLOTS
    assert (kvs["adapter.n_bank"], kvs["adapter.bank_dim"], kvs["adapter.bank_align"]) == (
        c.n_bank, c.bank_dim, int(c.bank_align))
    assert (kvs["adapter.seed_rank"], kvs["adapter.seed_vocab"], kvs["adapter.vis_dim"]) == (SEED_RANK, SEED_VOCAB, VIS)
    assert kvs["tokenizer.ggml.pre"] == "qwen35" and kvs["tokenizer.ggml.model"] == "gpt2"
    assert kvs["tokenizer.ggml.tokens"] == f"[array of {SEED_VOCAB}]"
    assert read_gguf_string_array(path, "tokenizer.ggml.tokens") == ARRAYS["tokenizer.ggml.tokens"]
    assert read_gguf_string_array(path, "tokenizer.ggml.merges") == ARRAYS["tokenizer.ggml.merges"]
    with pytest.raises(ModelFileError, match="has no string array adapter.kind"):
        read_gguf_string_array(path, "adapter.kind")

    loaded = read_adapter_gguf(path)
    assert loaded.config == c and loaded.problems == [] and isinstance(loaded.model, Bridge)


@pytest.mark.parametrize("bank, count", [(dict(n_bank=240, bank_dim=20480, bank_align=True), 183),
                                         (dict(n_bank=240, bank_dim=20480, bank_align=False), 182), ({}, 179)])
def test_reference_sizes_tensor_counts(bank, count):
    c = AdapterConfig("qwen35_bridge", 1024, 4096, 1024, 6, seed_vocab=248320, vis_dim=4096, max_slots=2304,
                      seed_rank=384, **bank)
    ne = expected_ne(c)
    assert expected_tensor_count(c) == len(ne) == count
    with torch.device("meta"):                       # the names and shapes, without 235M parameters
        state = build_adapter(c).state_dict()
    assert list(ne) == list(state)
    assert all(ne[n] == tuple(reversed(t.shape)) for n, t in state.items())
    assert ne["slot_query"] == (1024, 2304) and ne["seed_embed.weight"] == (384, 248320)
    if bank:
        assert ne["bank_query"] == (1024, 240) and ne["out_bank.weight"] == (1024, 20480)


def test_read_of_a_reference_size_vocabulary_stays_fast(tmp_path):
    """The 248k tokens and ~247k merges are stepped over, not parsed item by item. Held to the read's CPU time,
    not its wall: on the shared 2-core VM at a load of 9 the read took 0.5–0.7 s of wall for 0.10–0.13 s of CPU,
    so a wall bound failed on a loaded enough machine without anything being slower."""
    import time
    c = config("none")
    arrays = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(248320)],
              "tokenizer.ggml.merges": [f"a{i} b" for i in range(247000)]}
    path = write_adapter_gguf(tmp_path / "big.gguf", random_adapter(c), c, name="n", pack="p", provenance=PROV,
                              arrays=arrays, **fold_stats(c))
    start = time.process_time()
    adapter = read_adapter_gguf(path)
    assert adapter.kvs["tokenizer.ggml.merges"] == "[array of 247000]"
    assert time.process_time() - start < 2.0


# ------------------------------------------------------------------ the fold

@pytest.mark.parametrize("variant", ["prompt", "none"])
def test_folded_file_gives_each_head_at_teacher_scale(variant, tmp_path):
    path, model, fold = export(tmp_path, variant)
    hidden, ids, vis = sample()
    bank_hidden = np.zeros((model.config.n_bank, IN), np.float32) if model.config.n_bank else None
    if bank_hidden is not None:
        bank_hidden[3:3 + N_BODY] = hidden
    h, extra = torch_inputs(hidden, ids, vis, bank_hidden)
    with torch.no_grad():
        bank_std, slot_std = model(h, **extra)                      # what training optimises
        bank_got, slot_got = read_adapter_gguf(path).model(h, **extra)
        bank_f16, slot_f16 = f16_rounded(model, fold)(h, **extra)
    slot_want = slot_std * fold["sigma"] + fold["mu"]
    assert (slot_got - slot_want).abs().max() / slot_want.abs().max() < 2e-3       # f16 weights
    torch.testing.assert_close(slot_got, slot_f16, atol=1e-5, rtol=1e-5)
    if model.config.n_bank:
        bank_want = bank_std * fold["bank_sigma"] + fold["bank_mu"]
        assert (bank_got - bank_want).abs().max() / bank_want.abs().max() < 2e-3
        torch.testing.assert_close(bank_got, bank_f16, atol=1e-5, rtol=1e-5)
        T = gguf_tensors(path)
        b = model.state_dict()["out_bank.bias"].double().numpy()
        np.testing.assert_allclose(T["out_bank.bias"], fold["bank_sigma"].numpy() * b + fold["bank_mu"].numpy(),
                                   rtol=1e-6, atol=1e-6)
    else:
        assert bank_got is None


def test_export_refuses_a_bridge_without_the_vocabulary_or_stats(tmp_path):
    c = config("caption")
    model, fold = random_adapter(c), fold_stats(c)
    for arrays in (None, {"tokenizer.ggml.tokens": ARRAYS["tokenizer.ggml.tokens"]},
                   {**ARRAYS, "tokenizer.ggml.merges": []}):
        with pytest.raises(ModelFileError) as info:
            write_adapter_gguf(tmp_path / "a.gguf", model, c, name="n", pack="p", provenance=PROV, arrays=arrays,
                               **fold)
        message = str(info.value)
        assert "tokenizer.json" in message and message.count(". ") == 0 and message.endswith(".")
    without_bank = {k: v for k, v in fold.items() if not k.startswith("bank_")}
    with pytest.raises(ValueError, match="bank head's fold statistics"):
        write_adapter_gguf(tmp_path / "b.gguf", model, c, name="n", pack="p", provenance=PROV, arrays=ARRAYS,
                           **without_bank)
    c0 = config("none")
    with pytest.raises(ValueError, match="bank head's fold statistics"):
        write_adapter_gguf(tmp_path / "c.gguf", random_adapter(c0), c0, name="n", pack="p", provenance=PROV,
                           arrays=ARRAYS, **fold)
    assert list(tmp_path.iterdir()) == []


def test_export_checkpoint_folds_the_bank_stats_and_writes_the_pack_arrays(tmp_path):
    c = config("prompt")
    model, fold = random_adapter(c), fold_stats(c)
    ck = {"config": c.to_dict(), "model": model.state_dict(), "step": 12, "mu": fold["mu"], "sigma": fold["sigma"],
          "mu_bank": fold["bank_mu"], "sigma_bank": fold["bank_sigma"], "train_config": {"steps": 40}}

    class Pack(SimpleNamespace):
        def export_contents(self, project, config):
            if self.missing:
                raise ModelFileError("The teacher's tokenizer.json is missing; download the teacher.")
            return ExportContents(kvs={"adapter.teacher": "Qwen/Qwen3.5-9B"}, arrays=ARRAYS)

    project = SimpleNamespace(pack=Pack(id="qwen35_bridge", missing=False), settings=SimpleNamespace(name="pig_b"))
    path = export_checkpoint(project, ck, tmp_path / "out.gguf", "best", snapshot=False)
    same = write_adapter_gguf(tmp_path / "same.gguf", model, c, name="pig_b", pack="qwen35_bridge",
                              provenance=Provenance(12, 40, "best"), pack_kvs={"adapter.teacher": "Qwen/Qwen3.5-9B"},
                              arrays=ARRAYS, **fold)
    assert path.read_bytes() == same.read_bytes()

    project.pack.missing = True
    with pytest.raises(ModelFileError, match="tokenizer.json"):
        export_checkpoint(project, ck, tmp_path / "none.gguf", "best", snapshot=False)
    assert not (tmp_path / "none.gguf").exists()


# ------------------------------------------------------------------ the engine's reading rules

def layout(variant: str, edit=None) -> dict[str, tuple[tuple[int, ...], str]]:
    tensors = {"adapter." + n: (ne, gguf_dtype(n, len(ne)).upper()) for n, ne in expected_ne(config(variant)).items()}
    if edit:
        edit(tensors)
    return tensors


def test_detect_layout_reads_every_size_from_shapes():
    for variant in BANKS:
        found, problems = detect_layout(layout(variant))
        assert found == config(variant) and problems == []
    # prompt alignment is the presence of bank_in, nothing else
    found, problems = detect_layout(layout("prompt", lambda t: t.pop("adapter.bank_in.weight")))
    assert found == config("prompt", bank_align=False) and problems == []
    # a query stored f16 still runs (the engine converts queries to f32) but is not what we write
    found, problems = detect_layout(layout("none", lambda t: t.update({"adapter.slot_query": ((W, MAX_SLOTS), "F16")})))
    assert found == config("none") and [p.fatal for p in problems] == [False]
    assert "adapter.slot_query is F16; gguf-trainer writes F32" in problems[0].message


@pytest.mark.parametrize("drop", [("adapter.out_bank.weight", "adapter.out_bank.bias"), ("adapter.bank_query",)])
def test_half_a_bank_is_ignored_as_the_engine_does(drop, tmp_path):
    found, problems = detect_layout(layout("prompt", lambda t: [t.pop(n) for n in drop]))
    assert found == config("none")
    assert len(problems) == 1 and not problems[0].fatal
    assert "the engine ignores them and runs no bank" in problems[0].message

    # the same file on disk loads without the bank, and runs as the numpy engine runs it
    path, model, _ = export(tmp_path, "prompt")
    T = gguf_tensors(path)
    w = gguf.GGUFWriter(tmp_path / "half.gguf", arch="pig")
    for name, array in T.items():
        if "adapter." + name not in drop:
            w.add_tensor("adapter." + name, array.astype(np.float32 if gguf_dtype(name, array.ndim) == "f32"
                                                          else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = read_adapter_gguf(tmp_path / "half.gguf")
    assert loaded.config == config("none") and not loaded.problems[0].fatal
    hidden, ids, vis = sample()
    h, extra = torch_inputs(hidden, ids, vis)
    with torch.no_grad():
        bank, slots = loaded.model(h, **extra)
    _, want = bridge_forward(gguf_tensors(tmp_path / "half.gguf"), hidden, ids, vis, VIS_POS)
    assert bank is None
    np.testing.assert_allclose(slots[0].numpy(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"adapter.cap_query": ((W, 8), "F32")}), "adapter.cap_query makes the engine run this file with its Ming runner"),
    (lambda t: t.update({"adapter.vis_q.weight": ((VIS + 8, W), "F16")}),
     "adapter.vis_q.weight reads 32-wide vision embeds but adapter.vis_in.weight 24-wide"),
    (lambda t: t.update({"adapter.slot_query": ((W + 8, MAX_SLOTS), "F32")}), "not a multiple of the engine's head_dim"),
    (lambda t: t.pop("adapter.seed_embed.weight"), "adapter.seed_embed.weight (2-D) is missing"),
    (lambda t: t.pop("adapter.seed_proj.weight"), "adapter.seed_proj.weight is missing"),
    (lambda t: t.update({"adapter.seed_proj.weight": ((SEED_RANK + 1, W), "F16")}), "adapter.seed_proj.weight has ne [17, 64]"),
    (lambda t: t.update({"adapter.query": ((W, 8), "F32")}), "adapter.query is not part of a qwen35_bridge adapter"),
], ids=["cap-query", "vis-disagree", "width", "no-seed-table", "no-seed-proj", "seed-proj-shape", "stray-query"])
def test_layouts_the_engine_refuses_or_misreads(edit, message):
    found, problems = detect_layout(layout("caption", edit))
    assert found is None and any(p.fatal and message in p.message for p in problems), problems


# ------------------------------------------------------------------ infer

def write_inputs(tmp_path: Path) -> tuple[np.ndarray, list[int], np.ndarray]:
    hidden, ids, vis = sample()
    (tmp_path / "qwen_hidden.bin").write_bytes(hidden.astype("<f4").tobytes())
    (tmp_path / "seed_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    (tmp_path / "vis_embeds.bin").write_bytes(vis.astype("<f4").tobytes())
    return hidden, ids, vis


VIS_ARG = ",".join(f"{s}:{n}" for s, n in VIS_POS)


@pytest.mark.parametrize("variant, bank", [("prompt", False), ("prompt", True), ("caption", True)])
def test_infer_through_the_cli_equals_the_numpy_engine(variant, bank, tmp_path, run_cli):
    path, _, _ = export(tmp_path, variant)
    hidden, ids, vis = write_inputs(tmp_path)
    T = gguf_tensors(path)
    bank_hidden = engine_bank_hidden(T, hidden) if bank and "bank_in.weight" in T else None
    bank_rows, slot_rows = bridge_forward(T, hidden, ids, vis, VIS_POS, bank_hidden)
    want = bank_rows[:engine_bank_rows(T, N_BODY)] if bank else slot_rows
    (tmp_path / "ref.bin").write_bytes(want.astype("<f4").tobytes())
    r = run_cli("infer", "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                "--seed-ids", str(tmp_path / "seed_ids.txt"), "--vis", str(tmp_path / "vis_embeds.bin"),
                "--vis-pos", VIS_ARG, *(["--bank"] if bank else []), "--out", str(tmp_path / "out.npy"),
                "--compare", str(tmp_path / "ref.bin"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rows = 80 if bank else P       # prompt: ceil80(3 + 7 + 5) rows of its 160; caption: all its 80
    assert result["output_shape"] == [rows, BANK_DIM if bank else OUT] and result["head"] == ("bank" if bank else "slots")
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-4, rtol=1e-4)
    assert result["cos"] == pytest.approx(1.0, abs=1e-6)


def infer(capsys, *args: str) -> tuple[int, str, str]:
    """`gguf-trainer infer ARGS` in this process (the error paths; the happy ones run the real CLI)."""
    code = main(["infer", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_infer_slot_rows_without_vision_or_bank(tmp_path, capsys):
    path, _, _ = export(tmp_path, "none")
    hidden, ids, _ = write_inputs(tmp_path)
    code, out, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                           "--seed-ids", str(tmp_path / "seed_ids.txt"), "--out", str(tmp_path / "o.bin"))
    assert code == 0, err
    assert f"qwen35_bridge adapter: {N_BODY} student rows -> output (slots) {P} x {OUT}" in out
    _, want = bridge_forward(gguf_tensors(path), hidden, ids)
    got = np.frombuffer((tmp_path / "o.bin").read_bytes(), "<f4").reshape(P, OUT)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # the MOSS rows of a prompt-aligned adapter run without the student's rows in the bank
    path, _, _ = export(tmp_path, "prompt")
    code, _, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                         "--seed-ids", str(tmp_path / "seed_ids.txt"), "--out", str(tmp_path / "p.npy"))
    assert code == 0, err
    _, want = bridge_forward(gguf_tensors(path), hidden, ids)
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("args, message", [
    (["--vis-pos", "4:6"], "--vis-pos places 6 vision rows but --vis holds 15"),
    (["--vis-pos", "4:6,12"], '--vis-pos "12" is not START:COUNT'),
    (["--vis-pos", "4:6,25:9"], "--vis-pos run 2 (25:9) is not inside the 30 template slots"),
    (["--vis-pos=-1:6,12:9"], "--vis-pos run 1 (-1:6) is not inside the 30 template slots"),
    (["--vis-pos", "4:6,8:9"], "--vis-pos run 2 (8:9) starts before run 1 ends (slot 10)"),
    ([], "--vis and --vis-pos go together"),
], ids=["sum", "syntax", "past-the-end", "negative", "overlap", "no-vis-pos"])
def test_infer_bad_vis_pos(args, message, tmp_path, capsys):
    path, _, _ = export(tmp_path, "caption")
    write_inputs(tmp_path)
    code, _, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"),
                         "--seed-ids", str(tmp_path / "seed_ids.txt"), "--vis", str(tmp_path / "vis_embeds.bin"), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("variant, ids, args, message", [
    ("caption", None, [], "pass the Qwen3.5 ids of the MOSS template with --seed-ids"),
    ("caption", [1, 2, SEED_VOCAB], [], f"--seed-ids holds the id {SEED_VOCAB}, outside the adapter's seed table (0..299)"),
    ("caption", list(range(MAX_SLOTS + 1)), [], f"--seed-ids has {MAX_SLOTS + 1} ids but this adapter takes 1 to {MAX_SLOTS}"),
    ("caption", [1, "x"], [], '(--seed-ids) holds "x", which is not a token id'),
    ("none", [1, 2], ["--bank"], "--bank reads the FLUX.3 Klein bank, and this adapter has none"),
    ("caption", [1, 2], ["--t5-ids", "{tmp}/ids.txt"], "--t5-ids is only for seeded resamplers"),
], ids=["no-ids", "id-range", "too-many-slots", "not-an-id", "bank-without-bank", "t5-ids"])
def test_infer_bad_bridge_inputs(variant, ids, args, message, tmp_path, capsys):
    path, _, _ = export(tmp_path, variant)
    write_inputs(tmp_path)
    seed = []
    if ids is not None:
        (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in ids))
        seed = ["--seed-ids", str(tmp_path / "ids.txt")]
    code, _, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "qwen_hidden.bin"), *seed,
                         *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_bridge_options_on_another_kind(tmp_path, capsys):
    from test_gguf_io import export as export_other
    path, _, _ = export_other(tmp_path, "resampler")
    (tmp_path / "h.bin").write_bytes(np.ones((3, 64), np.float32).tobytes())
    (tmp_path / "ids.txt").write_text("1\n2\n")
    code, _, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "h.bin"),
                         "--seed-ids", str(tmp_path / "ids.txt"))
    assert code == 2 and "--seed-ids is only for Qwen3.5 bridge and Ming adapters; this one is a resampler" in err
    code, _, err = infer(capsys, "--adapter", str(path), "--hidden", str(tmp_path / "h.bin"), "--bank")
    assert code == 2 and "--bank is only for Qwen3.5 bridge and Ming adapters" in err
