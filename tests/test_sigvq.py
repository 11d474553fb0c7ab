"""The SigVQ export: every tensor of the vision encoder's safetensors, f16, names unchanged,
skipped while the GGUF is newer than its source."""
from __future__ import annotations

import os

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from trainer_core.project import Project
from trainer_core.packs.llada_image.export import export_sigvq, sigvq_path
from trainer_core.packs.lookup import resolve_material


def _source(project: Project) -> dict[str, torch.Tensor]:
    folder = resolve_material(project, "sigvq") / "sigvq"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(3)
    tensors = {"encoder.patch_embed.weight": torch.randn(8, 3, 2, 2, generator=g),
               "encoder.blocks.0.attn.qkv.weight": torch.randn(24, 8, generator=g).bfloat16(),
               "encoder.blocks.0.norm.bias": torch.randn(8, generator=g),
               "quantizer.codebook": torch.randn(16, 8, generator=g).half()}
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"))
    return tensors


def test_every_tensor_is_written_as_f16_under_its_own_name_and_skipped_when_current(tmp_path):
    project = Project.create(tmp_path / "llada_adapter", "llada_image")
    assert export_sigvq(project) == (None, "no source")
    tensors = _source(project)
    out, what = export_sigvq(project)
    assert what == "written" and out == sigvq_path(project) and out.name == "pig_llada_sigvq-f16.gguf"
    reader = gguf.GGUFReader(out)
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(tensors)
    for name, t in got.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.F16
        expected = tensors[name].float().numpy().astype(np.float16)
        assert np.array_equal(np.asarray(t.data).reshape(expected.shape), expected), name
    mtime = out.stat().st_mtime_ns
    assert export_sigvq(project) == (out, "current") and out.stat().st_mtime_ns == mtime
    source = resolve_material(project, "sigvq") / "sigvq" / "diffusion_pytorch_model.safetensors"
    os.utime(source, ns=(mtime + 10**9, mtime + 10**9))                   # a newer source: written again
    assert export_sigvq(project)[1] == "written"
    project.update_settings(["export.export_sigvq=false"])
    assert export_sigvq(Project.open(project.root)) == (None, "off")


def test_the_output_listing_shows_the_sigvq_file(tmp_path):
    from trainer_core.status import output_files
    project = Project.create(tmp_path / "llada_adapter", "llada_image")
    _source(project)
    out, _ = export_sigvq(project)
    assert [f["name"] for f in output_files(project)] == [out.name]
