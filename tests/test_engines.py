"""The engine and method tables (``dsparkhub.serving``): every engine's results reach ``card`` and ``compare``, every
list of names is read from the tables, and adding an engine is one module plus one table row (a toy engine here).

Each round trip runs ``run_verify`` by backend name on the tiny target of ``tiny_models`` and a DFlash drafter of
it: the real reference engine, vLLM offline with the stand-in ``vllm`` package of ``test_vllm_backend`` (child
process), and the fake ``vllm serve`` / SGLang servers of ``test_vllm_backend`` / ``test_sglang_serve``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import textwrap

import pytest
from click.testing import CliRunner

from dsparkhub import serving
from dsparkhub.cli import main
from dsparkhub.serving import ENGINES, METHODS, Engine
from dsparkhub.verify import runner
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.settings import VerifySettings
from dsparkhub.verify.stats import RunStats

PROMPTS = [[3, 4, 5, 6], [7, 1, 2]]
N = 3  # the fake servers draft 3 tokens per step, so every engine measures n = 3


@pytest.fixture(scope="module")
def dflash(tiny_models):
    """A DFlash drafter of the tiny target on layers 0 and 1 (vLLM and the reference engine read them alike)."""
    from dsparkhub.example.layouts import make_tiny_drafter

    root, model = tiny_models
    make_tiny_drafter(root / "dflash01", model, kind="dflash", target_layer_ids=[0, 1], block_size=4)
    return root / "dflash01"


@pytest.fixture
def folders(tiny_models, dflash, tmp_path):
    """(drafter copy, target, prompt file): the card writes README.md into the drafter, so it gets a copy."""
    root, _ = tiny_models
    draft = shutil.copytree(dflash, tmp_path / "dflash")
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    return draft, root / "target", prompts


def _reference(tmp_path, monkeypatch):
    return {}, []


def _vllm(tmp_path, monkeypatch):
    from test_vllm_backend import FAKE_VLLM

    fake = tmp_path / "fake_vllm"
    for rel, text in FAKE_VLLM.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    return {}, []


def _vllm_serve(tmp_path, monkeypatch):
    from test_vllm_backend import _FakeServer

    spec, base = _FakeServer(n=N, accept=2), _FakeServer(n=None)
    return {"server_url": spec.url, "baseline_url": base.url}, [spec, base]


def _sglang_serve(tmp_path, monkeypatch):
    from test_sglang_serve import _FakeSglang

    spec, base = _FakeSglang(gamma=N, accept=2), _FakeSglang(gamma=None)
    return {"server_url": spec.url, "baseline_url": base.url}, [spec, base]


#: how each engine of the table is stood up for a round trip: -> (verify settings, servers to close)
ROUND_TRIPS = {"reference": _reference, "vllm": _vllm, "vllm-serve": _vllm_serve, "sglang-serve": _sglang_serve}


def _card_and_compare(draft, results_path) -> str:
    """``dsparkhub card`` and ``dsparkhub compare`` on one results file; returns the card's text."""
    r = CliRunner().invoke(main, ["card", str(draft), "--results", str(results_path),
                                  "--base-model", "org/tiny-target"])
    assert r.exit_code == 0, r.output
    card = (draft / "README.md").read_text()
    r = CliRunner().invoke(main, ["compare", str(results_path)])
    assert r.exit_code == 0, r.output
    assert "dflash" in r.output and "target target" in r.output
    return card


def test_every_engine_has_a_round_trip():
    assert set(ROUND_TRIPS) == set(ENGINES)


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_results_of_every_engine_reach_card_and_compare(name, folders, tmp_path, monkeypatch):
    draft, target, prompts = folders
    options, servers = ROUND_TRIPS[name](tmp_path, monkeypatch)
    out = tmp_path / f"{name}.json"
    try:
        runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[N], datasets=[f"ids={prompts}"],
                                                        max_new_tokens=6, **options),
                          backend=name, out=out, progress=False)
    finally:
        for s in servers:
            s.close()
    res = read_results(out)
    assert (res.engine.backend, res.method, res.lossless) == (name, "dflash", True)
    assert [r.num_speculative_tokens for r in res.summary] == [N] and res.summary[0].mean_tau is not None
    card = _card_and_compare(draft, out)
    engine = ENGINES[name]
    if name == "reference":
        assert "CPU reference engine" in card
    else:
        assert f"{engine.label} ({res.engine.version}, {res.engine.device})" in card


# ---- adding an engine: one module (this one) plus one table row -------------------------------------------------


class ToyEngine:
    """An engine in one module: outputs a function of the prompt, every drafted token accepted."""

    name, version, device = "toy", "toy 1.0", "cpu (toy)"

    def __init__(self, target, drafter):
        self.target, self.drafter = target, drafter

    def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0) -> RunStats:
        outputs = [[(sum(p) + k) % 50 for k in range(max_new_tokens)] for p in prompts]
        n = num_speculative_tokens
        if n is None:
            return RunStats(outputs=outputs, wall_s=2.0)
        steps = len(prompts) * math.ceil(max_new_tokens / (n + 1))
        return RunStats(outputs=outputs, wall_s=1.0, num_drafts=steps, num_draft_tokens=steps * n,
                        num_accepted_tokens=steps * n, accepted_per_pos=[steps] * n)

    def close(self):
        pass


TOY = Engine("toy", "toy engine", server=False, batching=None, final_layer_state="raw",
             final_layer_source="toy hidden states", methods=("dflash",), module=__name__, cls="ToyEngine",
             arguments={"target": "target", "draft": "drafter"})


def test_a_toy_engine_is_one_module_plus_one_table_row(folders, tmp_path, monkeypatch):
    draft, target, prompts = folders
    monkeypatch.setitem(serving.ENGINES, "toy", TOY)
    out = tmp_path / "toy.json"
    runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[2, 4], datasets=[f"ids={prompts}"],
                                                    max_new_tokens=6), backend="toy", out=out, progress=False)
    res = read_results(out)
    assert res.engine.backend == "toy" and [r.mean_tau for r in res.summary] == [3.0, 5.0]
    assert "toy engine (toy 1.0, cpu (toy))" in _card_and_compare(draft, out)
    # what the row says it takes and does not
    with pytest.raises(runner.EngineOptionError, match="--device is for the reference engine; toy engine"):
        runner.make_backend("toy", target=str(target), draft=str(draft), method="dflash", device="cpu")
    with pytest.raises(runner.EngineOptionError, match="toy runs one request at a time"):
        runner.run_verify(draft, target, VerifySettings(datasets=[f"ids={prompts}"], load=_load(4)), backend="toy",
                          progress=False)
    with pytest.raises(runner.EngineUnavailableError, match=r"toy engine \(toy\) does not serve dspark drafters"):
        runner.run_verify(target.parent / "dspark_run", target, VerifySettings(datasets=[f"ids={prompts}"]),
                          backend="toy", progress=False)


def _load(concurrency: int):
    from dsparkhub.verify.settings import LoadOptions

    return LoadOptions(concurrency=(1, concurrency))


# ---- every list of names is the table ---------------------------------------------------------------------------


def _choices(command: str, option: str) -> tuple[str, ...]:
    param = next(p for p in main.commands[command].params if p.name == option)
    return tuple(param.type.choices)


def test_cli_choices_schema_and_validate_engines_are_the_tables():
    from dsparkhub.validate.settings import ENGINE_FINAL_LAYER_STATE
    from dsparkhub.verify.results import schema
    from dsparkhub.verify.vllm.method import VLLM_METHODS

    assert _choices("verify", "backend") == tuple(ENGINES) == ("reference", "vllm", "vllm-serve", "sglang-serve")
    assert _choices("validate", "engine") == tuple(ENGINES)
    assert _choices("verify", "method") == _choices("vllm-check", "method") == schema.METHODS == tuple(METHODS)
    assert _choices("sglang-check", "algorithm") == ("DSPARK", "DFLASH")
    assert dict(ENGINE_FINAL_LAYER_STATE) == {"reference": "normed", "vllm": "raw", "vllm-serve": "raw",
                                              "sglang-serve": "raw"}
    assert VLLM_METHODS == {"dspark": "dspark", "dflash": "dflash", "dflash2": "dflash", "eagle3": "eagle3"}
    assert serving.method_for_variant("dflash2") == "dflash" and serving.method_for_variant("eagle") is None


def test_every_engine_row_loads_its_class():
    for engine in ENGINES.values():
        assert engine.load().__name__ == engine.cls
        assert set(engine.arguments) <= {"target", "draft", "opened_draft", "method", "device", "tensor_parallel_size",
                                         "max_model_len", "compilation_config", "confidence_threshold", "server_url",
                                         "baseline_url", "speculative_config", "engine_args", "env", "max_concurrency"}
    with pytest.raises(ImportError, match="has no Nothing"):
        Engine("x", "x", False, None, "raw", "", (), module="dsparkhub.serving", cls="Nothing").load()
