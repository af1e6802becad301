"""Manifests of the real targets and the seed releases: schema, provenance marks, meta-device confirmation, CLI, and
manifest names as --target."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.errors import ManifestError
from dsparkhub.layouts.manifests import get_manifest, load_manifests, manifests_dir
from dsparkhub.skeleton_tensors import meta_check
from dsparkhub.target import open_target, target_spec_from_manifest
from dsparkhub.testing import factories as F
from dsparkhub.validate import validate

torch.set_num_threads(1)

TARGETS = {"kimi-k2.6", "kimi-k2.7-code", "kimi-k3", "deepseek-v4-flash", "deepseek-v4-pro", "qwen3-4b", "qwen3-8b",
           "qwen3-14b", "gemma4-12b"}
RELEASES = {"novita-kimi-k2.6-dspark", "novita-kimi-k2.7-code-dspark", "lightseek-kimi-k3-dspark",
            "lightseek-kimi-k3-dflash2", "lightseek-kimi-k3-eagle3", "deepseek-v4-flash-dspark"}


def test_every_manifest_parses_with_provenance_for_each_geometry_value():
    targets, releases = load_manifests()
    assert set(targets) == TARGETS and set(releases) == RELEASES
    for t in targets.values():
        for key in ("hidden_size", "num_hidden_layers", "vocab_size", "embed", "lm_head", "repo_id", "license"):
            assert key in t.facts, (t.name, key)
        assert t.embed.shape == (t.vocab_size, t.hidden_size)
    for r in releases.values():
        assert r.target in targets and r.published


def test_values_formats_marks_unverified_stay_unverified():
    # FORMATS §7: V4-Pro H / V unverified, Kimi K3 embed / head names unverified, Gemma4-12B "check config",
    # Kimi K2.x embed / head names unverified in FORMATS but confirmed by transformers' conversion mapping
    pro, k3, g4, k26 = (get_manifest(n) for n in ("deepseek-v4-pro", "kimi-k3", "gemma4-12b", "kimi-k2.6"))
    assert pro.verified("hidden_size") is False and pro.verified("vocab_size") is False
    assert k3.verified("embed") is False and k3.verified("lm_head") is False
    assert g4.verified("hidden_size") is False
    assert k26.verified("embed") is True and "conversion_mapping" in k26.facts["embed"]["source"]
    flash = get_manifest("deepseek-v4-flash")
    assert flash.verified("hidden_size") is True and flash.embed.name == "embed.weight"
    novita = get_manifest("novita-kimi-k2.6-dspark")
    assert novita.facts["settings"]["verified"] is False  # Vd = 32000 is a third-party claim
    speedups = {(p["drafter"], p["num_speculative_tokens"]): p["value"] for p in novita.published}
    assert speedups == {("DSpark", 3): 2.17, ("DSpark", 7): 2.55, ("Eagle3-MLA", 3): 2.01, ("Eagle3-MLA", 7): 2.01}


@pytest.mark.parametrize("name", ["qwen3-8b", "deepseek-v4-flash", "kimi-k2.6"])
def test_meta_check_confirms_names_and_shapes(name):
    r = meta_check(name, layers=2)
    assert not r.mismatched
    m = get_manifest(name)
    assert m.embed.name in r.matched and (m.lm_head.name in r.matched or m.tied)
    if name == "deepseek-v4-flash":
        assert "layers.1.attn.attn_sink" in r.matched and len(r.merged) == 2 * 3 * 256
        assert all(u.endswith(".scale") for u in r.unmapped)
    if name == "kimi-k2.6":
        assert "language_model.model.layers.0.self_attn.kv_b_proj.weight" in r.matched
        assert all(".experts." in u for u in r.unmapped)
    if name == "qwen3-8b":
        assert not r.unmapped


def _copy_manifests(tmp_path, monkeypatch):
    folder = tmp_path / "manifests"
    shutil.copytree(manifests_dir(), folder)
    monkeypatch.setenv("DSPARKHUB_MANIFESTS_DIR", str(folder))
    return folder


@pytest.mark.parametrize("edit,fragment", [
    (lambda d: d.pop("vocab_size"), "target manifest lacks required key `vocab_size`"),
    (lambda d: d["facts"].update(hidden_size={"verified": "yes", "source": "x"}),
     "key `facts.hidden_size.verified`: expected true or false, found str 'yes'"),
    (lambda d: d["embed"].update(shape=[1, 2]), "disagrees with [vocab_size, hidden_size]"),
    (lambda d: d["embed"].update(dtype="BF17"), "key `embed.dtype`: expected a safetensors dtype code ("),
    (lambda d: d.update(colour="red"), "unknown target manifest key `colour`; known keys there: architecture,"),
    (lambda d: d["facts"].update(colour={"verified": True, "source": "x"}), "`facts.colour` describes a field"),
    (lambda d: d.update(name="other"), "differs from its file name"),
    (lambda d: d["drafter_defaults"].update(target_layer_ids=[1, 99]), "layer indices"),
])
def test_schema_errors_name_the_file_and_key(tmp_path, monkeypatch, edit, fragment):
    folder = _copy_manifests(tmp_path, monkeypatch)
    path = folder / "targets" / "qwen3-8b.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match=re.escape(fragment)) as exc:
        load_manifests(folder)
    assert "qwen3-8b.yaml" in str(exc.value)


def test_release_naming_an_unknown_target_is_refused(tmp_path, monkeypatch):
    folder = _copy_manifests(tmp_path, monkeypatch)
    path = folder / "releases" / "lightseek-kimi-k3-dspark.yaml"
    data = yaml.safe_load(path.read_text())
    data["target"] = "kimi-k9"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match="kimi-k9"):
        load_manifests(folder)


def test_manifest_name_as_target(tmp_path):
    t = open_target("qwen3-8b")
    assert (t.hidden_size, t.num_hidden_layers, t.vocab_size) == (4096, 36, 151936)
    assert t.embed.name == "model.embed_tokens.weight" and t.embed.shape == (151936, 4096) and not t.local
    assert t.default_target_layer_ids == [1, 9, 17, 25, 33]
    assert open_target("manifest:kimi-k2.6").lm_head.name == "language_model.lm_head.weight"
    with pytest.raises(ManifestError, match="release manifest"):
        target_spec_from_manifest("novita-kimi-k2.6-dspark")
    # a drafter for a tiny target checked against a real manifest: every mismatch is named
    small = F.make_qwen3_target(tmp_path / "t")
    run = F.make_deepspec_drafter(tmp_path / "run", small)
    report = validate(run, "qwen3-8b")
    assert {"DSH301", "DSH302", "DSH306", "DSH305"} <= report.codes


def test_cli_manifests_list_and_show():
    res = CliRunner().invoke(main, ["manifests", "list"])
    assert res.exit_code == 0, res.output
    assert "deepseek-v4-flash" in res.output and "novita-kimi-k2.6-dspark" in res.output
    res = CliRunner().invoke(main, ["manifests", "show", "deepseek-v4-pro"])
    assert res.exit_code == 0 and "hidden_size: NOT verified" in res.output
    res = CliRunner().invoke(main, ["manifests", "show", "kimi-k2.6", "--json"])
    assert json.loads(res.output)["embed"]["name"] == "language_model.model.embed_tokens.weight"
    res = CliRunner().invoke(main, ["manifests", "show", "nope"])
    assert res.exit_code == 1 and "unknown manifest 'nope'" in res.output
