"""Reduced draft vocab (``convert --draft-vocab N --draft-vocab-from ...``): which ids, which rows, d2t, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dsparkhub.cli import main
from dsparkhub.convert import convert
from dsparkhub.convert.plan import plan_conversion
from dsparkhub.draft_vocab import choose_draft_vocab
from dsparkhub.errors import ConversionRefusedError
from dsparkhub.verify.reference.loading import load_drafter
from dsparkhub.testing import factories as F
from dsparkhub.validate import validate


@pytest.fixture
def pair(tmp_path):
    target = F.make_qwen3_target(tmp_path / "target", vocab=128)
    cfg = json.loads((target / "config.json").read_text())
    cfg["eos_token_id"] = 5
    (target / "config.json").write_text(json.dumps(cfg))
    run = F.make_deepspec_drafter(tmp_path / "run", target)
    prompts = tmp_path / "ids.jsonl"
    # token 7 x4, 9 x3, 3 x2, 11 x2, 100 x1 (5 = EOS never appears but is always kept)
    rows = [[7, 7, 9, 3], [7, 9, 11, 100], [7, 9, 3, 11]]
    prompts.write_text("".join(json.dumps({"prompt_token_ids": r}) + "\n" for r in rows))
    return target, run, prompts


def test_choose_keeps_eos_then_the_most_frequent_ties_by_id(pair):
    target, _, prompts = pair
    dv = choose_draft_vocab(target, [str(prompts)], 4, vocab_size=128)
    assert dv.ids == [3, 5, 7, 9]  # EOS 5 forced; then 7 (4), 9 (3), 3 (2) before 11 (2, higher id)
    assert dv.forced == [5] and dv.tokens_counted == 12 and dv.coverage == pytest.approx(9 / 12)
    assert dv.d2t().tolist() == [3, 4, 5, 6]  # target_id = draft_id + d2t[draft_id]
    t2d = dv.t2d()
    assert t2d.dtype == torch.bool and t2d.shape == (128,) and t2d.nonzero().flatten().tolist() == [3, 5, 7, 9]


def test_convert_writes_the_chosen_rows_and_d2t(pair, tmp_path):
    target, run, prompts = pair
    before = load_file(str(run / "step_latest" / "model.safetensors"))
    res = CliRunner().invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "out"),
                                    "--draft-vocab", "4", "--draft-vocab-from", str(prompts)])
    assert res.exit_code == 0, res.output
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    ids = torch.tensor([3, 5, 7, 9])
    assert torch.equal(out["lm_head.weight"], before["lm_head.weight"][ids])
    assert torch.equal(out["markov_head.markov_w2.weight"], before["markov_head.markov_w2.weight"][ids])
    assert torch.equal(out["markov_head.markov_w1.weight"], before["markov_head.markov_w1.weight"])  # input side
    assert out["d2t"].tolist() == [3, 4, 5, 6] and "embed_tokens.weight" not in out
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 4 and cfg["vocab_size"] == 128
    prov = json.loads((tmp_path / "out" / "dsparkhub_provenance.json").read_text())
    assert prov["options"]["draft_vocab"]["size"] == 4 and prov["options"]["draft_vocab"]["forced_ids"] == [5]
    report = validate(tmp_path / "out", str(target))
    assert report.ok and not report.errors, report.findings
    from transformers import AutoModelForCausalLM

    drafter = load_drafter(tmp_path / "out", AutoModelForCausalLM.from_pretrained(target))
    assert drafter.to_target_ids(torch.tensor([0, 1, 2, 3])).tolist() == [3, 5, 7, 9]
    assert drafter.lm_head.weight.shape == (4, 32)


def test_speculators_output_ships_t2d_and_converts_back(pair, tmp_path):
    target, run, prompts = pair
    plan = plan_conversion(run, target, to="speculators", draft_vocab=4, draft_vocab_from=[str(prompts)],
                           base_model="org/tiny-target")  # the toy target has no Hub id to name the verifier by
    convert(run, tmp_path / "spec", target, plan=plan)
    t = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert t["t2d"].nonzero().flatten().tolist() == [3, 5, 7, 9] and t["d2t"].tolist() == [3, 4, 5, 6]
    convert(tmp_path / "spec", tmp_path / "back", target)
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert torch.equal(back["d2t"], t["d2t"]) and torch.equal(back["lm_head.weight"], t["lm_head.weight"])


def test_refusals(pair, tmp_path):
    target, run, prompts = pair
    with pytest.raises(ConversionRefusedError, match="1 <= N < 128"):
        plan_conversion(run, target, draft_vocab=128, draft_vocab_from=[str(prompts)])
    plan = plan_conversion(run, target, draft_vocab=4, draft_vocab_from=[str(prompts)])
    convert(run, tmp_path / "small", target, plan=plan)
    with pytest.raises(ConversionRefusedError, match="already reduced"):
        plan_conversion(tmp_path / "small", target, draft_vocab=2, draft_vocab_from=[str(prompts)])
    runner = CliRunner()
    res = runner.invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "x"),
                               "--draft-vocab", "4"])
    assert res.exit_code == 2 and "go together" in res.output
    bad = tmp_path / "big.jsonl"
    bad.write_text(json.dumps({"prompt_token_ids": [1, 500]}) + "\n")
    res = runner.invoke(main, ["convert", str(run), "--target", str(target), "--out", str(tmp_path / "y"),
                               "--draft-vocab", "4", "--draft-vocab-from", str(bad)])
    assert res.exit_code == 1 and "token id 500" in res.output and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_reduced_example_drafter_stays_lossless(example, tmp_path):
    """The trained example drafter with 512 of 1024 tokens: lossless, and it still drafts."""
    from dsparkhub.verify.reference.engine import ReferenceEngine
    from dsparkhub.prompts.datasets import load_datasets

    plan = plan_conversion(example.deepspec_run, example.target, draft_vocab=512,
                           draft_vocab_from=[str(example.prompts)])
    convert(example.deepspec_run, tmp_path / "v512", example.target, plan=plan)
    assert validate(tmp_path / "v512", str(example.target)).ok
    prompts = load_datasets([str(example.prompts)], example.target, max_prompts=6)[0].prompts
    base_engine = ReferenceEngine(example.target, None)
    base = base_engine.run(prompts, num_speculative_tokens=None, max_new_tokens=64)
    full = ReferenceEngine(base_engine.target, example.deepspec_run).run(prompts, num_speculative_tokens=7,
                                                                         max_new_tokens=64)
    stats = ReferenceEngine(base_engine.target, tmp_path / "v512").run(prompts, num_speculative_tokens=7,
                                                                      max_new_tokens=64)
    assert stats.outputs == base.outputs
    # half the vocab, chosen from these prompts, covers nearly every drafted token: τ stays close to the full head's
    # (it can even rise: an argmax on a rare token moves to a common one)
    assert abs(stats.tau - full.tau) < 0.3 * full.tau, (stats.tau, full.tau)
