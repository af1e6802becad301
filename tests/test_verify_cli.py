"""dsparkhub.verify.runner and `dsparkhub verify`: a fake backend whose counters we control, the lossless failure
path (exit 1 with prompt, position and both tokens), engine refusals, the backend factory, and one slow end-to-end
run with the real reference engine on the embedded example."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
import shutil

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.errors import (EngineUnavailableError, LayoutError, LosslessMismatchError, ValidationFailedError,
                              VerifyError)
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.verify import runner
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.settings import LoadOptions, VerifyArgumentError, VerifySettings
from dsparkhub.verify.stats import RunStats

PROMPTS = [[3, 4, 5], [7, 1], [2, 2, 2, 2]]


class FakeBackend:
    """Deterministic outputs; counters and wall times chosen per configuration so every number is known.

    Without a drafter a run takes 2.0 s; with n it takes 1.0 s. Each prompt contributes ``drafts`` verify steps;
    ``accepted[n]`` is the survival count list for one prompt (multiplied by the prompt count).
    """

    name, version, device = "reference", "fake 1.0", "cpu (fake)"

    def __init__(self, *, mismatch: tuple[int, int, int, int] | None = None, refuse_at: int | None = None,
                 drafts: int = 2):
        self.mismatch, self.refuse_at, self.drafts = mismatch, refuse_at, drafts
        self.accepted = {2: [2, 1], 3: [2, 2, 1]}
        self.calls: list[tuple[int | None, int]] = []
        self.closed = False

    @staticmethod
    def output(prompt, max_new):
        return [(sum(prompt) * 7 + k) % 97 for k in range(max_new)]

    def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0):
        n = num_speculative_tokens
        self.calls.append((n, len(prompts)))
        if n is not None and n == self.refuse_at:
            raise EngineUnavailableError(f"fake engine refuses num_speculative_tokens={n}")
        outputs = [self.output(p, max_new_tokens) for p in prompts]
        if n is None:
            return RunStats(outputs=outputs, wall_s=2.0)
        if self.mismatch and self.mismatch[0] == n:
            _, i, pos, tok = self.mismatch
            outputs[i][pos] = tok
        per = self.accepted[n]
        k = len(prompts)
        return RunStats(outputs=outputs, wall_s=1.0, num_drafts=self.drafts * k, num_draft_tokens=self.drafts * k * n,
                        num_accepted_tokens=sum(per) * k, accepted_per_pos=[a * k for a in per])

    def close(self):
        self.closed = True


def make_drafter(path, kind="dspark"):
    """A real drafter (testing factories: the method is read from its DraftSpec) of ``kind`` ``dspark`` |
    ``dflash`` | ``eagle3``, or ``plain`` (a target-shaped Qwen3 folder no drafter layout reads)."""
    from dsparkhub.testing.factories import (make_eagle3_drafter, make_qwen3_target, make_speculators_drafter,
                                             make_zlab_dflash_drafter)

    if kind == "plain":
        return make_qwen3_target(path)
    target = make_qwen3_target(path.parent / f".{path.name}-target")
    make = {"dspark": make_speculators_drafter, "dflash": make_zlab_dflash_drafter, "eagle3": make_eagle3_drafter}
    return make[kind](path, target)


@pytest.fixture
def setup(tmp_path):
    draft = make_drafter(tmp_path / "draft")
    target = tmp_path / "target"
    target.mkdir()
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    return draft, target, prompts


def no_validate(draft, target, n, warn=None, engine="vllm", validation=None, told=None):
    return None


def test_run_verify_numbers(setup, tmp_path):
    draft, target, prompts = setup
    fake = FakeBackend()
    out = tmp_path / "res" / "results.json"
    res = runner.run_verify(draft, target,
                            VerifySettings(num_speculative_tokens=[3, 2], datasets=[f"p={prompts}"], max_new_tokens=5),
                            backend=fake, out=out, progress=False, validate_fn=no_validate)
    assert fake.calls == [(None, 3), (2, 3), (3, 3)]  # configuration-outer
    assert not fake.closed  # a backend object passed in is the caller's to close
    assert res.method == "dspark" and res.lossless is True
    assert res.drafter.fingerprint == checkpoint_fingerprint(draft)
    # local folders by name (plus fingerprint) and files by name plus hash: a results file names no local path
    assert res.target.id == "target" and res.drafter.id == "draft"
    assert res.datasets[0].source == f"ids.jsonl (sha256 {hashlib.sha256(prompts.read_bytes()).hexdigest()[:16]})"
    assert str(tmp_path) not in out.read_text()
    (ds,) = res.datasets
    assert ds.name == "p" and ds.baseline.output_tokens == 15 and ds.baseline.tokens_per_s == pytest.approx(7.5)
    r2, r3 = ds.run(2), ds.run(3)
    assert r2.tau == pytest.approx(1 + 9 / 6) and r3.tau == pytest.approx(1 + 15 / 6)
    assert r2.per_position_acceptance == pytest.approx([1.0, 0.5])
    assert r3.per_position_acceptance == pytest.approx([1.0, 1.0, 0.5])
    assert r3.speedup == pytest.approx(2.0) and r3.draft_tokens_per_step == pytest.approx(3.0)
    assert res.change.tau_delta == pytest.approx(1.0)
    assert read_results(out) == res


def test_lossless_mismatch_raises_after_saving(setup, tmp_path):
    draft, target, prompts = setup
    out = tmp_path / "results.json"
    with pytest.raises(LosslessMismatchError) as ei:
        runner.run_verify(draft, target,
                          VerifySettings(num_speculative_tokens=[2, 3], datasets=[str(prompts)], max_new_tokens=5),
                          backend=FakeBackend(mismatch=(3, 1, 2, 96)), out=out, progress=False,
                          validate_fn=no_validate)
    e = ei.value
    expected = FakeBackend.output(PROMPTS[1], 5)[2]
    assert (e.dataset, e.prompt_index, e.position, e.expected, e.found) == ("ids", 1, 2, expected, 96)
    saved = read_results(out)
    assert saved.lossless is False and saved.datasets[0].run(2).lossless is True
    assert saved.datasets[0].run(3).first_mismatch.found == 96


def test_validation_runs_before_any_backend(setup, monkeypatch):
    draft, target, prompts = setup
    built = []
    monkeypatch.setattr(runner, "make_backend", lambda *a, **k: built.append(1) or FakeBackend())

    def refuse(d, t, n):
        assert (d, t, n) == (str(draft), str(target), 7)
        raise ValidationFailedError("fc.weight has the wrong width")

    with pytest.raises(ValidationFailedError, match="wrong width"):
        runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[3, 7], datasets=[str(prompts)]),
                          backend="reference", progress=False, validate_fn=refuse)
    assert built == []


def test_validate_report_listed(setup, monkeypatch):
    """_validate turns a report with errors into one error listing every finding (dsparkhub.validate API)."""
    import dsparkhub.verify.runner as validate_mod  # runner's own name for dsparkhub.validate.record.validate_reusing

    class F:
        def __init__(self, code, message, location):
            self.code, self.message, self.location, self.severity = code, message, location, "error"

    class Report:
        ok = False
        errors = [F("fc-width", "fc.weight is [64, 128], expected [64, 192]", "fc.weight"),
                  F("mask-token", "mask_token_id 900 outside vocab 512", None)]

    seen, report = {}, Report()
    monkeypatch.setattr(validate_mod, "validate_reusing",
                        lambda d, t, num_speculative_tokens=None, engine="vllm", record=None, note=None:
                        (seen.update(n=num_speculative_tokens, engine=engine) or report, None))
    draft, _, _ = setup  # no target: _validate opens a local target folder itself, and setup's is empty
    with pytest.raises(ValidationFailedError) as ei:
        runner._validate(draft, None, 5)
    msg = str(ei.value)
    assert seen["n"] == 5 and seen["engine"] == "vllm" and "2 error(s)" in msg and "[fc-width] fc.weight: fc.weight is [64, 128]" in msg
    assert "[mask-token] mask_token_id 900" in msg and ei.value.report is report


def test_backend_returning_wrong_prompt_count(setup):
    draft, target, prompts = setup

    class Short(FakeBackend):
        def run(self, prompts, **kw):
            s = super().run(prompts, **kw)
            s.outputs = s.outputs[:-1]
            return s

    with pytest.raises(VerifyError, match="outputs for 2 prompts, expected 3"):
        runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[2], datasets=[str(prompts)]),
                          backend=Short(), progress=False, validate_fn=no_validate)


def test_progress_hook_used_when_offered(setup):
    draft, target, prompts = setup
    ticks = []

    class WithProgress(FakeBackend):
        def run(self, prompts, *, num_speculative_tokens, max_new_tokens, temperature=0.0, seed=0, progress=None):
            for _ in prompts:
                progress(1)
                ticks.append(num_speculative_tokens)
            return super().run(prompts, num_speculative_tokens=num_speculative_tokens,
                               max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)

    runner.run_verify(draft, target,
                      VerifySettings(num_speculative_tokens=[2], datasets=[str(prompts)], max_new_tokens=3),
                      backend=WithProgress(), progress=False, validate_fn=no_validate)
    assert ticks == [None, None, None, 2, 2, 2]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_speculative_tokens=[0, 3]), "distinct positive integers"),
    (dict(num_speculative_tokens=[3, 3]), "distinct positive integers"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be at least 1"),
    (dict(method="medusa"), "unknown method 'medusa'"),
])
def test_bad_arguments(setup, kwargs, message):
    draft, target, prompts = setup
    with pytest.raises(ValueError, match=message):
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], **kwargs), backend=FakeBackend(),
                          progress=False, validate_fn=no_validate)


@pytest.mark.parametrize("name, kwargs, message", [
    ("sglang", {}, "unknown backend 'sglang'"),
    ("vllm-serve", {}, "needs --server-url"),
    ("reference", dict(tensor_parallel_size=2), "--tp 2 needs --backend vllm"),
    ("reference", dict(server_url="http://x"), "only for --backend vllm-serve"),
    ("vllm", dict(confidence_threshold=0.5), "no confidence threshold"),
    ("vllm", dict(device="cuda"), "--device is for the reference engine"),
    ("vllm", dict(baseline_url="http://x"), "only for --backend vllm-serve"),
])
def test_make_backend_refusals(name, kwargs, message):
    with pytest.raises(EngineUnavailableError, match=message):
        runner.make_backend(name, target="t", draft="d", method="dspark", **kwargs)


@pytest.mark.parametrize("device, message", [("bogus", "is not a torch device"), ("mps", "runs on cpu or cuda")])
def test_reference_device_is_checked_before_loading(device, message):
    with pytest.raises(EngineUnavailableError, match=message):
        runner.make_backend("reference", target="t", draft="d", method="dspark", device=device)


def test_method_contradicting_the_drafter_is_refused(setup):
    draft, target, prompts = setup
    with pytest.raises(ValueError, match="describes a dspark drafter"):
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], method="dflash"),
                          backend=FakeBackend(), progress=False, validate_fn=no_validate)
    res = runner.run_verify(draft, target,
                            VerifySettings(datasets=[str(prompts)], method="dspark", num_speculative_tokens=[2]),
                            backend=FakeBackend(), progress=False, validate_fn=no_validate)
    assert res.method == "dspark"


def test_results_path_is_checked_before_running(setup, tmp_path):
    draft, target, prompts = setup
    backend = FakeBackend()
    with pytest.raises(ValueError, match="is a folder"):
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)]), backend=backend, progress=False,
                          validate_fn=no_validate, out=tmp_path)
    assert backend.calls == []


def test_results_path_must_be_new_and_writable_before_running(setup, tmp_path):
    from dsparkhub.errors import OutputExistsError, OutputNotWritableError

    draft, target, prompts = setup
    backend = FakeBackend()
    kwargs = dict(backend=backend, progress=False, validate_fn=no_validate,
                  settings=VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2]))
    existing = tmp_path / "old.json"
    old = '{"schema": "dsparkhub.verify.results/2"}'  # --overwrite replaces a results file only
    existing.write_text(old)
    with pytest.raises(OutputExistsError, match="already exists") as err:
        runner.run_verify(draft, target, out=existing, **kwargs)
    assert "--overwrite" in err.value.hint and existing.read_text() == old and backend.calls == []
    # /proc takes no new files, not even from root (a chmod-ed folder would not stop root)
    with pytest.raises(OutputNotWritableError, match="does not take new files"):
        runner.run_verify(draft, target, out=Path("/proc/dsparkhub-test/r.json"), **kwargs)
    assert backend.calls == []
    runner.run_verify(draft, target, out=existing, overwrite=True, **kwargs)
    assert read_results(existing).settings.num_speculative_tokens == [2]


def test_cli_verify_refuses_an_existing_results_file_unless_overwrite(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    out = tmp_path / "r.json"
    out.write_text('{"schema": "dsparkhub.verify.results/2"}')
    args = ["verify", str(draft), "--target", str(target), "-n", "2", "--datasets", str(prompts), "--out", str(out),
            "--quiet"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "OutputExistsError" in res.output and cli_fake["kwargs"] is None  # not started
    res = CliRunner().invoke(main, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output


def test_method_of_a_run_folder_follows_step_latest(tmp_path):
    run = tmp_path / "run"
    make_drafter(run / "step_5")
    (run / "step_latest").symlink_to("step_5")
    assert runner.detect_method(run) == "dspark"


def test_validation_warnings_are_passed_on(tmp_path):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    lines: list[str] = []
    runner._validate(run, target, 100, lines.append)
    assert any("DSH401" in line for line in lines), lines


def test_make_backend_vllm_is_lazy_and_configured(tmp_path):
    """The vLLM backends are constructed without starting anything (the child starts on the first run)."""
    b = runner.make_backend("vllm", target=str(tmp_path), draft=str(tmp_path), method="dspark",
                            tensor_parallel_size=8, max_model_len=20000,
                            compilation_config={"pass_config": {"fuse_allreduce_rms": False}})
    assert b.name == "vllm" and b.method == "dspark"
    req = b.engine_request(7)
    assert req["engine_args"]["tensor_parallel_size"] == 8 and req["engine_args"]["max_model_len"] == 20000
    assert req["engine_args"]["speculative_config"] == {"method": "dspark", "num_speculative_tokens": 7,
                                                        "model": str(tmp_path)}
    s = runner.make_backend("vllm-serve", target="t", draft="d", method="dspark", server_url="http://h:1/v1",
                            baseline_url="http://h:2")
    assert (s.name, s.base_url, s.baseline_url) == ("vllm-serve", "http://h:1", "http://h:2")


def test_detect_method(tmp_path):
    assert runner.detect_method(make_drafter(tmp_path / "a")) == "dspark"
    assert runner.detect_method(make_drafter(tmp_path / "b", "dflash")) == "dflash"
    assert runner.detect_method(make_drafter(tmp_path / "c", "eagle3")) == "eagle3"
    # a DSpark drafter under a folder named like DFlash is still DSpark (never guessed from the path)
    assert runner.detect_method(make_drafter(tmp_path / "my-dflash")) == "dspark"
    with pytest.raises(LayoutError):
        runner.detect_method(make_drafter(tmp_path / "d", "plain"))
    with pytest.raises(LayoutError):
        runner.detect_method(tmp_path / "missing")


# ---- CLI -----------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_fake(monkeypatch):
    """Route `dsparkhub verify --backend reference` to a FakeBackend and skip the static validation."""
    holder = {"backend": FakeBackend(), "kwargs": None}

    def factory(name, **kwargs):
        holder["kwargs"] = dict(kwargs, name=name)
        return holder["backend"]

    monkeypatch.setattr(runner, "make_backend", factory)
    monkeypatch.setattr(runner, "_validate", no_validate)
    return holder


def test_cli_verify_ok(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "-n", "3,2",
                                    "--datasets", f"p={prompts}", "--max-new-tokens", "4", "--out", str(out),
                                    "--quiet", "--max-model-len", "512",
                                    "--compilation-config", '{"level": 0}'])
    assert res.exit_code == 0, res.output
    assert "2.50 / 2.00x / ok" in res.output and "3.50 / 2.00x / ok" in res.output  # n=2, n=3 for dataset p
    assert f"wrote {out}" in res.output and cli_fake["backend"].closed
    assert cli_fake["kwargs"]["max_model_len"] == 512 and cli_fake["kwargs"]["compilation_config"] == {"level": 0}
    saved = read_results(out)
    assert saved.settings.max_model_len == 512 and saved.settings.compilation_config == {"level": 0}


def test_cli_verify_lossless_failure_exit_1(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    cli_fake["backend"] = FakeBackend(mismatch=(2, 2, 3, 55))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "-n", "2,3",
                                    "--datasets", str(prompts), "--max-new-tokens", "5", "--out", str(out),
                                    "--quiet"])
    assert res.exit_code == 1
    expected = FakeBackend.output(PROMPTS[2], 5)[3]
    assert "LosslessMismatchError" in res.output and "prompt 2" in res.output and "position 3" in res.output
    assert f"expected token {expected}, found 55" in res.output
    assert "FAIL" in res.output  # the table is printed before the error
    assert read_results(out).lossless is False


def test_cli_verify_engine_refusal_exit_1(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    cli_fake["backend"] = FakeBackend(refuse_at=3)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "-n", "2,3",
                                    "--datasets", str(prompts), "--out", str(out), "--quiet"])
    assert res.exit_code == 1 and "refuses num_speculative_tokens=3" in res.output
    assert cli_fake["backend"].closed
    # the configurations measured before the refusal are kept, the rest marked incomplete
    assert "partial results" in res.output and str(out) in res.output.replace("\n", "")
    partial = read_results(out)
    assert [r.num_speculative_tokens for r in partial.datasets[0].runs] == [2]
    assert partial.incomplete[0].startswith("stopped at ") and "n=3" in partial.incomplete[0]
    assert "n=3 @ concurrency 1" in partial.incomplete[1]


@pytest.mark.parametrize("args", [["-n", "3,x"], ["-n", "3,3"], ["--compilation-config", "[1]"],
                                  ["--backend", "tensorrt"], ["--temperature", "-1"]])
def test_cli_verify_usage_errors_exit_2(setup, args):
    draft, target, _ = setup
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), *args])
    assert res.exit_code == 2, res.output


# ---- end to end -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_end_to_end_reference_engine_and_card(example, tmp_path):
    """Real reference engine on the embedded example: verify (lossless, τ > 1) then a card from the results."""
    import torch

    torch.set_num_threads(1)
    draft = tmp_path / "draft"
    shutil.copytree(example.dspark_step, draft, symlinks=False,
                    ignore=shutil.ignore_patterns("training_state*", "*.pt"))
    out = tmp_path / "results.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(example.target), "-n", "2,4",
                                    "--datasets", f"heldout={example.prompts},builtin:math", "--max-prompts", "2",
                                    "--max-new-tokens", "24", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    r = read_results(out)
    assert r.lossless is True and r.engine.backend == "reference" and r.method == "dspark"
    held = next(d for d in r.datasets if d.name == "heldout")
    assert all(x.tau is not None and x.tau > 1.0 for x in held.runs)  # a trained drafter accepts something
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(out), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    text = (draft / "README.md").read_text()
    assert "CPU reference engine" in text and "heldout" in text
    assert "- **Target:** `org/tiny-target`" in text and "vllm serve org/tiny-target" in text


def test_real_validate_and_reference_engine_on_tiny_random_models(tmp_path):
    """The real chain on toy checkpoints (lead's factories): validate -> reference engine -> results -> card.

    A random drafter accepts little, but the greedy lossless check, the counters' consistency and the card's
    refusal-free path are real.
    """
    import torch

    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    torch.set_num_threads(1)
    target = make_qwen3_target(tmp_path / "target", dtype=torch.float32)
    run = make_deepspec_drafter(tmp_path / "run", target, block_size=4)
    draft = run / "step_100"
    prompts = tmp_path / "ids.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in [[5, 9, 17, 3], [40, 2]]))
    out = tmp_path / "results.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "-n", "2,4",
                                    "--datasets", str(prompts), "--max-new-tokens", "12", "--out", str(out),
                                    "--quiet"])
    assert res.exit_code == 0, res.output
    r = read_results(out)
    assert r.lossless is True and r.engine.backend == "reference" and r.method == "dspark"
    assert r.target.fingerprint is not None and r.drafter.fingerprint == checkpoint_fingerprint(draft)
    for run_result in r.datasets[0].runs:
        n = run_result.num_speculative_tokens
        assert run_result.num_draft_tokens == n * run_result.num_drafts  # no confidence threshold: full drafts
        assert run_result.num_accepted_tokens == sum(run_result.accepted_per_pos)
        assert run_result.output_tokens == r.datasets[0].baseline.output_tokens
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(out), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    assert "CPU reference engine" in (draft / "README.md").read_text()


def test_prompts_longer_than_the_context_are_warned_about_when_allowed(setup):
    draft, target, prompts = setup
    lines: list[str] = []
    runner.run_verify(draft, target,
                      VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2], max_new_tokens=4,
                                     max_model_len=5, allow_beyond_context=True), backend=FakeBackend(),
                      progress=False, validate_fn=no_validate, warn=lines.append)
    assert any("exceed the context of 5 tokens" in line for line in lines), lines
    lines.clear()
    runner.run_verify(draft, target,
                      VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2], max_new_tokens=4),
                      backend=FakeBackend(), progress=False, validate_fn=no_validate, warn=lines.append)
    assert lines == []


def test_warnings_are_stored_in_the_results_and_listed_on_the_card(setup, tmp_path):
    draft, target, prompts = setup
    cfg = json.loads((draft / "config.json").read_text())  # the card's facts come from the DraftSpec the recipes
    cfg.update(target_layer_ids=[0], hidden_size=8, vocab_size=16)  # read: a config they can read
    (draft / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "results.json"
    r = runner.run_verify(draft, target,
                          VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2], max_new_tokens=4,
                                         max_model_len=5, allow_beyond_context=True), backend=FakeBackend(),
                          progress=False, validate_fn=no_validate, out=out)  # no warn callback: stored anyway
    assert len(r.warnings) == 1 and "exceed the context of 5 tokens" in r.warnings[0]
    assert not r.warnings[0].startswith("warning")
    assert read_results(out).warnings == r.warnings
    old = json.loads(out.read_text())
    del old["warnings"]  # files written before the key existed still load
    out.write_text(json.dumps(old))
    assert read_results(out).warnings == []
    r.save(out)
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(out), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    text = (draft / "README.md").read_text()
    assert "Warnings `dsparkhub verify` printed" in text and "exceed the context of 5 tokens" in text


def test_a_run_folder_is_measured_and_named_by_its_step(tmp_path):
    run = tmp_path / "run"
    step = make_drafter(run / "step_5")
    (run / "step_latest").symlink_to("step_5")
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt_token_ids": [1, 2]}) + "\n")
    res = runner.run_verify(run, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2]),
                            backend=FakeBackend(), progress=False, validate_fn=no_validate)
    assert res.drafter.id == "step_5" and res.drafter.fingerprint == checkpoint_fingerprint(step)


def test_argument_errors_are_usage_errors(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    for extra in (["--method", "dflash"], ["--out", str(tmp_path)], ["--backend", "vllm-serve"],
                  ["--backend", "vllm", "--device", "cpu"], ["--server-url", "http://127.0.0.1:9"],
                  ["--device", "bogus"], ["--device", "mps"]):
        res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--datasets", str(prompts),
                                        "-n", "2", "--quiet", *extra])
        assert res.exit_code == 2 and "Usage" in res.output and "_ArgError" not in res.output, res.output


def test_vllm_dspark_on_cpu_is_refused_before_the_baseline(setup, tmp_path, monkeypatch):
    from dsparkhub.errors import EngineUnavailableError

    draft, target, prompts = setup
    monkeypatch.setattr(runner, "_cuda_available", lambda: False)
    built = []
    monkeypatch.setattr(runner, "make_backend", lambda name, **kw: built.append(name) or FakeBackend())
    with pytest.raises(EngineUnavailableError, match="V2 GPU model runner") as err:
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2]),
                          backend="vllm", progress=False, validate_fn=no_validate, out=tmp_path / "r.json")
    assert built == [] and "--backend reference" in str(err.value) and not (tmp_path / "r.json").exists()
    monkeypatch.setattr(runner, "_cuda_available", lambda: True)  # on a GPU node the engine decides
    runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2]),
                      backend="vllm", progress=False, validate_fn=no_validate)
    assert built == ["vllm"]
def test_cli_verify_concurrency_out_of_reach_exit_2(setup):
    """The SGLang server backend times one request at a time: --concurrency 8 is refused before anything loads
    (the vLLM backends measure it with `vllm serve` + `vllm bench serve`: tests/test_vllm_sweep.py)."""
    draft, target, prompts = setup
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--backend", "sglang-serve",
                                    "--server-url", "http://127.0.0.1:9", "--concurrency", "1,8",
                                    "--datasets", str(prompts), "--quiet"])
    assert res.exit_code == 2 and "runs one request at a time, so --concurrency 8 is out of its reach" in res.output
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--concurrency", "0"])
    assert res.exit_code == 2 and "distinct positive integers" in res.output


# ---- a broken drafter, a context overrun, Ctrl-C ----------------------------------------------------------------


class DeadDrafter(FakeBackend):
    """Drafts every step and has nothing accepted (what NaN weights give: τ 1.00, acceptance 0 / 0 / 0)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.accepted = {2: [0, 0], 3: [0, 0, 0]}


def test_no_draft_token_accepted_is_warned_about_and_stored(setup, tmp_path):
    draft, target, prompts = setup
    lines: list[str] = []
    out = tmp_path / "r.json"
    res = runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2, 3],
                                                          max_new_tokens=4),
                            backend=DeadDrafter(), progress=False, validate_fn=no_validate, warn=lines.append, out=out)
    assert [r.tau for r in res.datasets[0].runs] == [1.0, 1.0]
    (line,) = lines
    assert line.startswith("warning: no draft token was accepted at any position in every run (30 proposed")
    assert "NaN / Inf" in line and read_results(out).warnings == [line.removeprefix("warning: ")]
    lines.clear()
    runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2, 3],
                                                    max_new_tokens=4),
                      backend=FakeBackend(), progress=False, validate_fn=no_validate, warn=lines.append)
    assert lines == []  # a drafter that accepts something is not warned about


def test_no_acceptance_names_only_the_dead_runs():
    from dsparkhub.verify.results.derive import build_results, no_acceptance
    from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings

    out = [[1, 2, 3]]
    good = RunStats(outputs=out, wall_s=1.0, num_drafts=2, num_draft_tokens=4, num_accepted_tokens=1,
                    accepted_per_pos=[1, 0])
    dead = RunStats(outputs=out, wall_s=1.0, num_drafts=2, num_draft_tokens=6, num_accepted_tokens=0,
                    accepted_per_pos=[0, 0, 0])
    res = build_results(engine=EngineInfo("reference", "x", "cpu"), method="dspark", target=ModelRef("t", None),
                        drafter=ModelRef("d", None), runs=[("math", "m", RunStats(outputs=out, wall_s=2.0),
                                                            {2: good, 3: dead})],
                        settings=Settings(temperature=0.0, max_new_tokens=3, seed=0, num_speculative_tokens=[2, 3]))
    assert no_acceptance(res).startswith("no draft token was accepted at any position in math n=3 (6 proposed")
    res.datasets[0].runs[1] = res.datasets[0].runs[0]
    assert no_acceptance(res) is None


def test_the_card_lists_the_no_acceptance_warning(setup, tmp_path):
    draft, target, prompts = setup
    cfg = json.loads((draft / "config.json").read_text())
    cfg.update(target_layer_ids=[0], hidden_size=8, vocab_size=16)  # a config the card's recipes read
    (draft / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "results.json"
    runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2],
                                                    max_new_tokens=4),
                      backend=DeadDrafter(), progress=False, validate_fn=no_validate, out=out)
    card = CliRunner().invoke(main, ["card", str(draft), "--results", str(out), "--base-model", "org/tiny-target"])
    assert card.exit_code == 0, card.output
    text = (draft / "README.md").read_text()
    assert "Warnings `dsparkhub verify` printed:\n  - no draft token was accepted at any position in every run" in text


def _target_with_context(path: Path, tokens: int) -> Path:
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": tokens}))
    return path


def test_max_new_tokens_beyond_the_context_is_refused_before_anything_loads(setup, tmp_path, monkeypatch):
    draft, _, prompts = setup
    target = _target_with_context(tmp_path / "ctx-target", 2048)
    loaded = []
    monkeypatch.setattr(runner, "make_backend", lambda name, **kw: loaded.append("engine") or FakeBackend())
    monkeypatch.setattr(runner, "_validate", lambda *a, **k: loaded.append("validate"))
    import dsparkhub.verify.prompts as prompt_mod

    monkeypatch.setattr(prompt_mod, "load_datasets", lambda *a, **k: loaded.append("tokenizer") or [])
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "--datasets", str(prompts),
                                    "-n", "2", "--max-new-tokens", "100000000", "--quiet",
                                    "--out", str(tmp_path / "r.json")])  # never the default ./results.json
    assert res.exit_code == 2, res.output
    assert "--max-new-tokens 100000000 plus the prompt exceeds the target's context of 2048 tokens" in res.output
    assert "max_position_embeddings" in res.output and "--allow-beyond-context" in res.output
    assert loaded == []  # refused before validation, tokenizer and engine


def test_prompts_beyond_the_context_are_refused_unless_allowed(setup, tmp_path):
    draft, _, prompts = setup
    target = _target_with_context(tmp_path / "ctx-target", 6)  # prompts of 2-4 tokens + 4 new tokens
    fake = FakeBackend()
    settings = VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2], max_new_tokens=4)
    with pytest.raises(VerifyArgumentError) as err:
        runner.run_verify(draft, target, settings, backend=fake, progress=False, validate_fn=no_validate)
    assert "2 prompt(s) of dataset 'ids' (longest 4 tokens) plus --max-new-tokens 4 exceed the target's context " \
           "of 6 tokens" in str(err.value)
    assert "at most 2" in err.value.hint and fake.calls == []
    lines: list[str] = []
    from dataclasses import replace

    runner.run_verify(draft, target, replace(settings, allow_beyond_context=True), backend=fake, progress=False,
                      validate_fn=no_validate, warn=lines.append)
    assert fake.calls and any("exceed the context of 6 tokens" in line for line in lines)


class InterruptedBackend(FakeBackend):
    """Ctrl-C arrives while the ``at``-th call runs (1-based)."""

    def __init__(self, at: int, interleaves: bool = False):
        super().__init__()
        self.at, self.interleaves = at, interleaves

    def run(self, prompts, **kwargs):
        if len(self.calls) + 1 == self.at:
            self.calls.append("interrupted")
            raise KeyboardInterrupt
        return super().run(prompts, **kwargs)


def test_ctrl_c_keeps_the_configurations_already_measured(setup, tmp_path, cli_fake):
    draft, target, prompts = setup
    cli_fake["backend"] = InterruptedBackend(at=3)  # baseline, n=2 measured; Ctrl-C during n=3
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(target), "-n", "2,3", "--repeats", "1",
                                    "--datasets", str(prompts), "--max-new-tokens", "4", "--out", str(out),
                                    "--quiet"])
    assert res.exit_code == 130, res.output
    assert "measured before Ctrl-C were written to" in res.output and str(out) in res.output.replace("\n", "")
    partial = read_results(out)
    assert [r.num_speculative_tokens for r in partial.datasets[0].runs] == [2]
    assert partial.datasets[0].run(2).tau == pytest.approx(2.5)
    assert partial.incomplete[0] == "stopped at ids n=3, concurrency 1, repeat 1: interrupted (Ctrl-C)"
    assert "not measured: n=3 @ concurrency 1" in partial.incomplete[1] and cli_fake["backend"].closed


def test_ctrl_c_in_an_interleaved_repeat_keeps_every_configuration_with_its_finished_repeats(setup, tmp_path):
    draft, target, prompts = setup
    fake = InterruptedBackend(at=5, interleaves=True)  # repeat 1: baseline, n=2, n=3; repeat 2: baseline, Ctrl-C
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt) as err:
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2, 3],
                                                        max_new_tokens=4, load=LoadOptions(repeats=2)),
                          backend=fake, out=out, progress=False, validate_fn=no_validate)
    assert err.value.partial_results == out
    partial = read_results(out)
    assert [(r.num_speculative_tokens, len(r.tokens_per_s_repeats)) for r in partial.datasets[0].runs] == \
        [(2, 1), (3, 1)]
    assert partial.incomplete == ["stopped at ids n=2, concurrency 1, repeat 2: interrupted (Ctrl-C)",
                                  "dataset ids @ concurrency 1: 1 of 2 repeat(s) measured"]
    with pytest.raises(KeyboardInterrupt):  # nothing with the drafter measured: no file
        runner.run_verify(draft, target, VerifySettings(datasets=[str(prompts)], num_speculative_tokens=[2]),
                          backend=InterruptedBackend(at=2), out=tmp_path / "none.json", progress=False,
                          validate_fn=no_validate)
    assert not (tmp_path / "none.json").exists()


@pytest.mark.slow
def test_end_to_end_nan_drafter_is_warned_about(example, tmp_path):
    """The real reference engine on a NaN-poisoned copy of the converted example drafter: τ 1.00 and one warning."""
    import torch
    from safetensors.torch import load_file, save_file

    from dsparkhub.convert import convert

    torch.set_num_threads(1)
    draft = tmp_path / "draft"
    convert(example.dspark_step, draft, example.target)
    tensors = load_file(str(draft / "model.safetensors"))
    tensors = {k: torch.full_like(v, float("nan")) if v.dtype.is_floating_point else v for k, v in tensors.items()}
    save_file(tensors, str(draft / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "results.json"
    res = CliRunner().invoke(main, ["verify", str(draft), "--target", str(example.target), "-n", "2",
                                    "--datasets", str(example.prompts), "--max-prompts", "2", "--max-new-tokens", "8",
                                    "--repeats", "1", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "warning: no draft token was accepted at any position in every run" in res.output
    r = read_results(out)
    assert [x.tau for x in r.datasets[0].runs] == [1.0] and "no draft token" in r.warnings[-1]
