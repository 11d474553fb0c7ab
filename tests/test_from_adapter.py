"""`new --from-adapter`: training that starts from an adapter GGUF (ours, another writer's, one on the Hub).

What is compared, and why it is the honest reading of "the resumed export equals a plain run":
* round trip: the start, loaded and exported without a step, writes the very tensor bytes of the file it
  came from (every tensor, in order, same GGML type), and the same KVs but the provenance ones (trained
  steps, checkpoint name, val figures: a step-0 export says step 0);
* training on: N steps from the start equal, bit for bit, N steps of a plain run of the same project whose
  freshly built model had those weights put in by hand — so the start changes the initial weights and
  nothing else (step 0, a fresh optimizer, the lr schedule and data order of a fresh run);
* the start is the original checkpoint's network as the file holds it: every tensor the export does not
  fold equals the checkpoint's, rounded to the file's dtype (computed here with torch's own cast).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import demo_cache
from conftest import cli_here
from hub_server import LocalHub, go_online

from trainer_core.base.errors import UsageError
from trainer_core.base.events import ListReport
from trainer_core.contract import checkpoints
from trainer_core.contract.adapter_export import export_checkpoint
from trainer_core.contract.gguf_io import (KV_BEST_VAL_COS, KV_CHECKPOINT, KV_PLANNED_STEPS, KV_SNAPSHOT,
                                           KV_TRAINED_STEPS, KV_VAL_COS, PREFIX, gguf_dtype, read_gguf_kvs)
from trainer_core.contract.kinds import build_adapter
from trainer_core.from_adapter import start_from
from trainer_core.project import Project
from trainer_core.stages import train
from trainer_core.stages.base import never

STEPS = 6
PROVENANCE = {KV_TRAINED_STEPS, KV_PLANNED_STEPS, KV_CHECKPOINT, KV_SNAPSHOT, KV_VAL_COS, KV_BEST_VAL_COS}


def _tensors(path: Path) -> list[tuple[str, int, bytes]]:
    """(name, GGML type, data bytes) of every tensor, read by the gguf library (not our reader)."""
    import gguf
    return [(t.name, int(t.tensor_type), bytes(np.ascontiguousarray(t.data).tobytes()))
            for t in gguf.GGUFReader(path).tensors]


def _untrained(trained_root: Path, tmp: Path) -> Project:
    """A copy of a trained demo without its checkpoints and export: its corpus and shards ready to train."""
    project = Project.open(shutil.copytree(trained_root, tmp / "b" / trained_root.name))
    shutil.rmtree(project.checkpoints_dir)
    project.update_settings([f"train.steps={STEPS}"])
    return project


def _state(trainer: train.Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _step0_export(project: Project, trainer: train.Trainer, out: Path) -> Path:
    ck = {"config": trainer.config.to_dict(), "model": _state(trainer), "step": 0, "train_config": {"steps": 0},
          "val": None, "best_val_cos": -1.0, "mu": trainer.mu.cpu(), "sigma": trainer.sigma.cpu()}
    if trainer.bank_stats is not None:
        ck.update(mu_bank=trainer.bank_stats[0].cpu(), sigma_bank=trainer.bank_stats[1].cpu())
    return export_checkpoint(project, ck, out, "last", snapshot=False)


def _round_trip_and_train_on(pack_id: str, tmp_path: Path) -> None:
    source = Project.open(demo_cache.copy_trained(pack_id, tmp_path / "a"))
    gguf_file = source.gguf_path()
    original = checkpoints.load(source, "best")
    project = _untrained(source.root, tmp_path)
    start_from(project, str(gguf_file))
    assert checkpoints.start_path(project).read_bytes() == gguf_file.read_bytes()

    report = ListReport()
    begun = train.Trainer(project, report)
    assert begun.resume() is False and begun.step == 0
    assert any("started from the adapter" in e["message"] for e in report.of_type("log"))
    start = _state(begun)
    # the checkpoint's network as the file holds it: unfolded tensors equal its weights cast to the file's dtype
    folded = ("out_proj.", "skip.", "out_bank.")
    for name, weight in original["model"].items():
        if name.startswith(folded) and begun.config.spec.standardized:
            continue
        dtype = torch.float32 if gguf_dtype(name, weight.ndim) == "f32" else torch.float16
        assert torch.equal(start[name], weight.float().to(dtype).float()), name

    exported = _step0_export(project, begun, tmp_path / "step0.gguf")
    assert _tensors(exported) == _tensors(gguf_file)
    kvs, theirs = read_gguf_kvs(exported), read_gguf_kvs(gguf_file)
    assert {k: v for k, v in kvs.items() if k not in PROVENANCE} == {k: v for k, v in theirs.items()
                                                                      if k not in PROVENANCE}
    assert kvs[KV_TRAINED_STEPS] == 0 != theirs[KV_TRAINED_STEPS]

    assert train.run(Project.open(project.root), ListReport()) == "done"
    from_start = checkpoints.load(project, "last")
    assert from_start["step"] == STEPS

    # the same project, no start file: a plain run whose built model is given the start's weights by hand
    shutil.rmtree(project.checkpoints_dir)
    shutil.rmtree(checkpoints.start_path(project).parent)
    plain = train.Trainer(Project.open(project.root), ListReport())
    assert plain.resume() is False
    assert not all(torch.equal(v, start[k]) for k, v in plain.model.state_dict().items())   # not the start yet
    plain.model.load_state_dict(start)
    assert plain.train(never) == "done"
    by_hand = checkpoints.load(project, "last")
    for name, weight in by_hand["model"].items():
        assert torch.equal(from_start["model"][name], weight), name
    assert not torch.equal(from_start["model"]["in_proj.weight"], start["in_proj.weight"])     # it trained


def test_layerwise_start_round_trips_and_trains_on_as_a_plain_run(tmp_path):
    """A Qwen3-VL (FLUX.3) export: standardized, its σ and μ folded into out_proj and σ into skip."""
    _round_trip_and_train_on("qwen3vl_flux3", tmp_path)


def test_seeded_resampler_start_round_trips_and_trains_on_as_a_plain_run(tmp_path):
    """A T5 (PixArt) export: raw targets, nothing folded, the seed table stored whole."""
    _round_trip_and_train_on("t5xxl_pixart", tmp_path)


# ---------------------------------------------------------------- files written without our exporter

def write_plain_gguf(path: Path, state: dict[str, torch.Tensor], f16: bool = True) -> Path:
    """The engine contract's layout with the gguf library alone: "adapter." + name in state_dict order, the
    torch bytes as they are (ne reversed), F32 for 1-D tensors and the query banks, else F16 (or F32 with
    f16=False: the engine takes a Linear in the file's dtype); no KV but the architecture."""
    import gguf
    writer = gguf.GGUFWriter(path, arch="pig")
    for name, tensor in state.items():
        keep = tensor.ndim == 1 or name in ("query", "vision_proj.weight", "layer_map") or not f16
        writer.add_tensor(PREFIX + name, tensor.float().numpy() if keep else tensor.half().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_written_without_our_exporter_trains_on(tmp_path):
    """All-F32 tensors and no KVs: the start holds the file's values, and the train stage trains on from them."""
    project = _untrained(demo_cache.trained("t5xxl_pixart"), tmp_path)
    begun = train.Trainer(project, ListReport())
    torch.manual_seed(1)
    theirs = {k: torch.randn_like(v) * 0.02 for k, v in begun.model.state_dict().items()}
    foreign = write_plain_gguf(tmp_path / "theirs.gguf", theirs, f16=False)
    start_from(project, str(foreign))
    record = checkpoints.read_start_record(project)
    assert record["trainer"] is None and record["source"] == str(foreign)
    begun = train.Trainer(Project.open(project.root), ListReport())
    begun.resume()
    for name, value in begun.model.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    width = project.settings.train.width
    project.update_settings([f"train.width={width * 2}"])          # settings changed since: refused, named
    with pytest.raises(UsageError, match=f"has width {width}, but this project's adapter needs width {width * 2}"):
        train.Trainer(Project.open(project.root), ListReport()).resume()
    project.update_settings([f"train.width={width}"])
    assert train.run(Project.open(project.root), ListReport()) == "done"
    assert checkpoints.load(project, "last")["step"] == STEPS


# ---------------------------------------------------------------- the command: the Hub, mismatches

def fresh_pixart_adapter(tmp_path: Path) -> dict[str, torch.Tensor]:
    """A small adapter of the shapes a new PixArt project trains (the real student's and teacher's widths,
    the seed table of T5's vocabulary) at width 64, depth 1: what another trainer might publish."""
    from dataclasses import replace

    from trainer_core.plan.estimate import adapter_config
    from trainer_core.project import default_settings_dict, settings_from_dict
    settings = settings_from_dict(default_settings_dict("t5xxl_pixart"))
    settings = replace(settings, train=replace(settings.train, width=64, depth=1))
    config = adapter_config(Project(tmp_path / "draft", settings))
    torch.manual_seed(2)
    return {k: v.detach() for k, v in build_adapter(config).state_dict().items()}


@pytest.fixture
def hub_repo(tmp_path, monkeypatch):
    state = fresh_pixart_adapter(tmp_path)
    good = write_plain_gguf(tmp_path / "good.gguf", state).read_bytes()
    narrow = {k: v for k, v in state.items()}
    narrow["in_proj.weight"] = narrow["in_proj.weight"][:, :512]            # another student width
    other = write_plain_gguf(tmp_path / "other.gguf", narrow).read_bytes()
    with LocalHub({"someone/pig-pixart": {"adapter-f16.gguf": good, "old/narrow-f16.gguf": other,
                                          "README.md": b"# an adapter\n"}}) as hub:
        go_online(monkeypatch, hub.url)
        yield good


def test_new_from_a_hub_repo(tmp_path, hub_repo):
    root = tmp_path / "p"
    several = cli_here("new", "--project", str(root), "--pack", "t5xxl_pixart", "--from-adapter", "someone/pig-pixart")
    assert several.returncode == 2 and not root.exists()
    assert several.stderr.count("\n") == 1
    assert "adapter-f16.gguf" in several.stderr and "old/narrow-f16.gguf" in several.stderr

    r = cli_here("new", "--project", str(root), "--pack", "t5xxl_pixart",
                 "--from-adapter", "someone/pig-pixart:adapter-f16.gguf")
    assert r.returncode == 0, r.stderr
    project = Project.open(root)
    assert checkpoints.start_path(project).read_bytes() == hub_repo
    assert (project.settings.train.width, project.settings.train.depth) == (64, 1)     # taken from the file
    assert checkpoints.read_start_record(project)["source"] == "someone/pig-pixart:adapter-f16.gguf"
    status = cli_here("status", "--project", str(root))
    assert "training starts from someone/pig-pixart:adapter-f16.gguf" in status.stdout

    mismatch = cli_here("new", "--project", str(tmp_path / "q"), "--pack", "t5xxl_pixart",
                        "--from-adapter", "someone/pig-pixart:old/narrow-f16.gguf")
    assert mismatch.returncode == 2 and not (tmp_path / "q").exists()
    assert mismatch.stderr.count("\n") == 1 and "in_dim 512" in mismatch.stderr and "in_dim 1024" in mismatch.stderr


def test_new_refuses_another_kind_and_a_damaged_file_leaving_no_folder(tmp_path):
    ours = demo_cache.trained("t5xxl_pixart")
    gguf_file = Project.open(ours).gguf_path()
    for pack, source, words in (("qwen3vl_flux3", gguf_file, ("kind seeded_resampler", "token_aligned_layerwise")),
                                ("t5xxl_pixart", tmp_path / "cut.gguf", ("--from-adapter",))):
        if source.name == "cut.gguf":
            source.write_bytes(gguf_file.read_bytes()[: gguf_file.stat().st_size // 2])
        root = tmp_path / f"new-{pack}"
        root.mkdir()              # an empty folder the user picked: kept, and left empty
        r = cli_here("new", "--project", str(root), "--pack", pack, "--from-adapter", str(source))
        assert r.returncode == 2, r.stdout
        assert r.stderr.count("\n") == 1 and all(w in r.stderr for w in words), r.stderr
        assert list(root.iterdir()) == []


# ---------------------------------------------------------------- the unfold of every standardized kind

def test_the_unfold_inverts_every_kinds_fold_as_the_file_stores_it(tmp_path):
    """Every kind the packs train on standardized targets (one head, a skip path, a bank or caption head): the
    heads folded with random statistics and stored as the export stores them (the "file"), unfolded, folded
    again: F16 values come back exactly (a quotient's f32 rounding is far inside half an f16 step), F32 values
    exactly or, where no f32 preimage exists, one unit in the last place off, and `inexact` counts those."""
    from dataclasses import replace

    from trainer_core.contract.adapter_import import unfold_standardization
    from trainer_core.contract.gguf_io import fold_standardization
    from trainer_core.packs import PACKS
    from trainer_core.plan.estimate import adapter_config
    from trainer_core.project import default_settings_dict, settings_from_dict
    seen = set()
    gen = torch.Generator().manual_seed(3)
    for pack_id in PACKS:
        settings = settings_from_dict(default_settings_dict(pack_id))
        settings = replace(settings, train=replace(settings.train, width=64, depth=1))
        config = adapter_config(Project(tmp_path / pack_id, settings))
        if config is None or not config.spec.standardized or config.kind in seen:
            continue
        seen.add(config.kind)
        bank = config.spec.bank_head(config)
        heads = ("out_proj.", "skip.") + ((f"{bank}.",) if bank else ())
        # the heads' rows as the kind has them; 16 input columns (the fold scales rows: the column count is free)
        state = {n: torch.randn((ne[-1], min(ne[0], 16)) if len(ne) == 2 else ne, generator=gen) * 0.05
                 for n, ne in config.spec.expected_ne(config).items() if n.startswith(heads)}

        def stats(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(n, generator=gen), torch.exp(torch.randn(n, generator=gen) * 2)   # σ from ~0.02 to ~50
        mu, sigma = stats(state["out_proj.bias"].numel())
        bmu, bsigma = stats(state[f"{bank}.bias"].numel()) if bank else (None, None)

        def stored(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {n: v.to(torch.float32 if gguf_dtype(n, v.ndim) == "f32" else torch.float16).float()
                    for n, v in s.items()}
        file = stored(fold_standardization(state, mu, sigma, bmu, bsigma, bank))
        unfolded = unfold_standardization(file, config, mu, sigma, bmu, bsigma)
        again = stored(fold_standardization(unfolded.state, mu, sigma, bmu, bsigma, bank))
        off = 0
        for name, value in file.items():
            if gguf_dtype(name, value.ndim) == "f16":
                assert torch.equal(again[name], value), (config.kind, name)
                continue
            differ = again[name] != value
            off += int(differ.sum())
            ulp = torch.nextafter(value, torch.full_like(value, float("inf"))) - value
            assert bool(((again[name] - value).abs()[differ] <= ulp[differ].abs() * 1.0001).all()), (config.kind, name)
        assert unfolded.inexact == off, config.kind
    assert len(seen) >= 3
