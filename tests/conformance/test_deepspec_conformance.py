"""DeepSpec conformance: the run folder in ``tests/conformance/deepspec/`` was written by DeepSpec's own
``Qwen3DSparkTrainer.build_models`` + ``ckpt_manager.save_checkpoint`` (``deepspec/generate.py``, commit in
``deepspec/UPSTREAM.json``). These tests read only the committed files; DeepSpec itself is not needed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dsparkhub.errors import CheckpointNotFoundError

FIXTURE = Path(__file__).parent / "deepspec"
RUN, TARGET = FIXTURE / "run", FIXTURE / "target"


def _deepspec_run_at(root: Path) -> Path:
    """The fixture's run folder re-created under ``root`` with ``step_latest`` written by DeepSpec's rule:
    ``Path(step_dir).resolve()`` (deepspec/utils/io.py:13 safe_symlink), an absolute link."""
    run = root / "run"
    run.mkdir(parents=True)
    shutil.copytree(RUN / "step_2", run / "step_2")
    (run / "step_latest").symlink_to((run / "step_2").resolve())
    return run


def test_fixture_is_what_deepspec_writes():
    upstream = json.loads((FIXTURE / "UPSTREAM.json").read_text())
    assert upstream["producer"] == "deepseek-ai/DeepSpec" and len(upstream["commit"]) == 40
    link = os.readlink(RUN / "step_latest")
    assert os.path.isabs(link) and Path(link).name == "step_2"  # DeepSpec always writes an absolute link
    assert not Path(link).exists()  # the folder it names is the generating machine's, gone since
    names = sorted(p.name for p in (RUN / "step_2").iterdir())
    assert names == ["config.json", "model.safetensors", "train_config.py", "training_state.rank0.pt"]


def test_copied_run_reads_its_own_step_not_the_original(tmp_path):
    """Issue 12 item 4: a copied run's absolute ``step_latest`` still names the original; the copy's step is read."""
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.layouts.reading import open_draft

    original = _deepspec_run_at(tmp_path / "A")
    copy = tmp_path / "B" / "run"
    shutil.copytree(original, copy, symlinks=True)
    assert Path(os.readlink(copy / "step_latest")) == (original / "step_2").resolve()
    # the original keeps training / is edited after the copy: reading it instead would be silently wrong
    cfg = json.loads((original / "step_2" / "config.json").read_text())
    cfg["block_size"] = 8
    (original / "step_2" / "config.json").write_text(json.dumps(cfg))

    assert resolve_step_dir(copy) == copy / "step_2"
    assert open_draft(copy).spec.block_size == 4
    assert resolve_step_dir(original) == (original / "step_2").resolve()  # the uncopied run is read as before
    assert open_draft(original).spec.block_size == 8


def test_committed_copy_with_dangling_absolute_link_reads_its_own_step():
    from dsparkhub.layouts.deepspec_run import resolve_step_dir
    from dsparkhub.validate import validate

    assert resolve_step_dir(RUN) == RUN / "step_2"
    report = validate(RUN, TARGET)
    assert report.ok, report.errors
    assert report.draft == str(RUN / "step_2")


def test_link_outside_the_run_without_a_same_named_step_is_refused(tmp_path):
    from dsparkhub.layouts.deepspec_run import resolve_step_dir

    run = tmp_path / "run"
    shutil.copytree(RUN / "step_2", run / "step_1")
    elsewhere = _deepspec_run_at(tmp_path / "elsewhere")
    (run / "step_latest").symlink_to((elsewhere / "step_2").resolve())
    with pytest.raises(CheckpointNotFoundError) as exc:
        resolve_step_dir(run)
    msg = str(exc.value)
    assert "step_latest" in msg and str((elsewhere / "step_2").resolve()) in msg and "step_2" in msg
    assert "step_1" in (exc.value.hint or "")


def test_load_drafter_and_convert_resolve_run_folders_the_same_way(tmp_path):
    """Issue 14: one resolver. Without ``step_latest`` both refuse (DeepSpec writes the link last, after the step's
    files: a step without it may be half-saved, ckpt_manager.py save_checkpoint)."""
    from dsparkhub.verify.reference import loading
    from dsparkhub.layouts.deepspec_run import resolve_step_dir

    run = tmp_path / "run"
    shutil.copytree(RUN / "step_2", run / "step_2")
    for resolve in (resolve_step_dir, lambda p: loading.load_drafter(p)):
        with pytest.raises(CheckpointNotFoundError, match="step_latest"):
            resolve(run)


def _target_with_other_embedding(folder: Path) -> Path:
    """The fixture target with another (same shape, same dtype) input embedding: a target the drafter was not
    trained for."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(TARGET, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.embed_tokens.weight"] = torch.roll(tensors["model.embed_tokens.weight"], 1, dims=0).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_frozen_embedding_copy_that_differs_from_the_target_is_an_error(tmp_path):
    """Issue 12 item 7: DeepSpec copies the target's embedding and LM head frozen (base_trainer.py build_models ->
    initialize_embeddings_and_head(freeze=True)); a copy that differs means another target."""
    from dsparkhub.convert.plan import plan_conversion
    from dsparkhub.errors import ValidationFailedError

    plan = plan_conversion(RUN, TARGET)  # the real target: both copies byte-identical, dropped
    assert {x.name: x.action for x in plan.decisions}["embed_tokens.weight"] == "drop"
    other = _target_with_other_embedding(tmp_path / "other")
    with pytest.raises(ValidationFailedError) as exc:
        plan_conversion(RUN, other)
    f = [x for x in exc.value.report.findings if x.code == "DSH312"]
    assert len(f) == 1 and f[0].severity == "error" and f[0].location == "tensor embed_tokens.weight"
    assert "model.embed_tokens.weight" in f[0].message and "step_2" in f[0].message
    assert "base_trainer.py" in f[0].hint and "--allow-different-embeddings" in f[0].hint
    assert f[0].expected and f[0].found and f[0].expected != f[0].found
    with pytest.raises(ValidationFailedError, match="DSH312"):  # keeping the copies does not hide it
        plan_conversion(RUN, other, keep_embeddings=True)
    plan = plan_conversion(RUN, other, allow_different_embeddings=True)  # asked for: kept, reported
    decisions = {x.name: x for x in plan.decisions}
    assert decisions["embed_tokens.weight"].action == "copy" and decisions["lm_head.weight"].action == "drop"
    assert "DSH312" in plan.report.codes and not plan.report.ok


@pytest.mark.parametrize("family", ["gemma4", "deepseek-v4"])
def test_qwen3_drafter_against_a_same_size_target_of_another_family_is_an_error(tmp_path, family):
    from dsparkhub.testing import factories as F
    from dsparkhub.validate import validate

    make = F.make_gemma4_target if family == "gemma4" else F.make_v4_target
    target = make(tmp_path / family, hidden=32, layers=4, vocab=128)
    report = validate(RUN, str(target))
    f = [x for x in report.findings if x.code == "DSH311"]
    assert len(f) == 1 and f[0].severity == "error" and not report.ok
    assert f[0].expected == family and f[0].found == "qwen3" and "Qwen3DSparkModel" in f[0].message
    assert validate(RUN, str(TARGET)).ok  # its own (qwen3) target


def test_cli_convert_refuses_a_different_frozen_copy_unless_asked(tmp_path):
    from click.testing import CliRunner

    from dsparkhub.cli import main

    other = _target_with_other_embedding(tmp_path / "other")
    args = ["convert", str(RUN), "--target", str(other), "--out", str(tmp_path / "out"), "--dry-run"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "DSH312" in res.output and "--allow-different-embeddings" in res.output
    res = CliRunner().invoke(main, args + ["--allow-different-embeddings"])
    assert res.exit_code == 0, res.output


def _run_reading_the_final_layer(tmp_path: Path) -> Path:
    """The fixture's step with target_layer_ids [0, 3]: 3 is the 4-layer target's final layer (same fc width)."""
    step = tmp_path / "final" / "step_2"
    shutil.copytree(RUN / "step_2", step)
    cfg = json.loads((step / "config.json").read_text())
    cfg["target_layer_ids"] = [0, 3]
    (step / "config.json").write_text(json.dumps(cfg))
    return step


def test_final_layer_id_is_a_warning_for_vllm_and_an_error_for_the_reference_engine(tmp_path):
    """Issue 12 item 11: DeepSpec's target cache hooks the raw decoder-layer outputs (scripts/data/
    prepare_target_cache.py) and vLLM 0.32 takes the final layer's state before the final norm
    (deepseek_v4/nvidia/model.py:1482-1495); only HF output_hidden_states (the reference engine, DeepSpec's
    evaluator: base_evaluator.py assert_no_final_target_layer) returns it normed."""
    from dsparkhub.validate import validate

    step = _run_reading_the_final_layer(tmp_path)
    served = validate(step, TARGET)
    assert served.ok and "DSH304" not in served.codes
    w = [f for f in served.findings if f.code == "DSH313"]
    assert len(w) == 1 and w[0].severity == "warning" and "prepare_target_cache.py" in w[0].hint
    ref = validate(step, TARGET, engine="reference")
    e = [f for f in ref.findings if f.code == "DSH304"]
    assert len(e) == 1 and not ref.ok and "output_hidden_states" in e[0].message
    assert e[0].expected == "<= 2" and e[0].found == "[0, 3]" and "base_evaluator.py" in e[0].hint


def test_verify_with_the_reference_engine_refuses_the_final_layer_before_loading(tmp_path):
    from dsparkhub.errors import ValidationFailedError
    from dsparkhub.verify.runner import _validate

    step = _run_reading_the_final_layer(tmp_path)
    _validate(step, TARGET, 3, None, engine="vllm")  # warning only
    with pytest.raises(ValidationFailedError, match="DSH304"):
        _validate(step, TARGET, 3, None, engine="reference")


def _save_mask_embedding(folder: Path, mask_token_id: int) -> bytes:
    """A ``mask_embedding.pt`` as vLLM 0.32 reads it (qwen3_dflash.py ``_read_mask_embedding``: a tensor, or a dict
    with ``embedding`` and optionally ``mask_token_id``, read with ``torch.load(weights_only=True)``)."""
    import torch

    torch.save({"embedding": torch.linspace(-1, 1, 32).to(torch.bfloat16), "mask_token_id": mask_token_id},
               folder / "mask_embedding.pt")
    return (folder / "mask_embedding.pt").read_bytes()


def test_dflash_mask_embedding_file_is_carried_byte_for_byte(tmp_path):
    """Issue 12 item 5: vLLM 0.32's DFlash loader reads mask_embedding.pt from the drafter folder when present
    (qwen3_dflash.py:910-913, 929-960); convert used to leave it behind silently."""
    import torch

    from dsparkhub.convert import convert
    from dsparkhub.testing import factories as F

    src = F.make_zlab_dflash_drafter(tmp_path / "dflash", TARGET)
    raw = _save_mask_embedding(src, 127)
    result = convert(src, tmp_path / "out", TARGET, to="speculators", base_model="dsparkhub-test/toy-target")
    assert (tmp_path / "out" / "mask_embedding.pt").read_bytes() == raw
    assert "mask_embedding.pt" in result.files
    assert result.provenance["source"]["files"]["mask_embedding.pt"]
    loaded = torch.load(tmp_path / "out" / "mask_embedding.pt", weights_only=True)  # what vLLM does
    assert loaded["mask_token_id"] == 127 and loaded["embedding"].shape == (32,)


def test_dspark_mask_embedding_file_is_carried_with_a_note(tmp_path):
    """vLLM 0.32's DSpark masks via the vocab row and never reads the file (qwen3_dspark.py:338): carried, said."""
    from dsparkhub.convert import convert
    from dsparkhub.convert.plan import plan_conversion

    run = tmp_path / "run"
    shutil.copytree(RUN / "step_2", run / "step_2")
    (run / "step_latest").symlink_to("step_2")
    raw = _save_mask_embedding(run / "step_2", 127)
    plan = plan_conversion(run, TARGET)
    assert plan.carried == ["mask_embedding.pt"]
    assert any("mask_embedding.pt" in n and "qwen3_dspark.py" in n for n in plan.draft.spec.notes)
    convert(run, tmp_path / "out", TARGET, plan=plan)
    assert (tmp_path / "out" / "mask_embedding.pt").read_bytes() == raw


@pytest.mark.vllm
def test_vllm_finds_the_carried_mask_embedding(tmp_path):
    """vLLM 0.32's own file lookup for the DFlash loader (repo_utils.get_hf_file_bytes, as _read_mask_embedding
    calls it) finds the carried file in the converted folder, byte for byte."""
    from vllm.transformers_utils.repo_utils import get_hf_file_bytes

    from dsparkhub.convert import convert
    from dsparkhub.testing import factories as F

    src = F.make_zlab_dflash_drafter(tmp_path / "dflash", TARGET)
    raw = _save_mask_embedding(src, 127)
    convert(src, tmp_path / "out", TARGET, to="speculators", base_model="dsparkhub-test/toy-target")
    assert get_hf_file_bytes("mask_embedding.pt", str(tmp_path / "out"), None) == raw
