"""dsparkhub.card and `dsparkhub card`: metadata, tables, serve commands, every number traced to a results file,
refusals (other drafter, not lossless, malformed), plots are real PNGs, atomic writes, template override."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dsparkhub.card.render import write_card
from dsparkhub.cli import main
from dsparkhub.errors import CardError, ResultsError
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings
from dsparkhub.verify.results.derive import build_results
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.stats import RunStats

OUT_A = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23]]
OUT_B = [[31, 32, 33, 34, 35], [41, 42, 43, 44], [51, 52]]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# as dsparkhub.convert writes it (the keys the card reads)
PROVENANCE = {"tool": "dsparkhub", "version": "0.1.0", "command": "convert", "created": "2026-11-30T20:40:00+00:00",
              "source": {"path": "/runs/qwen3/step_1200", "layout": "deepspec",
                         "files": {"model.safetensors": "c0ffee" * 10}},
              "target": {"source": "Qwen/Qwen3-8B", "path": None, "config_sha256": None}, "layout": "vllm",
              "options": {"keep_embeddings": False}, "files": {"config.json": "ab12" * 16}}


def make_drafter(path: Path, provenance: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7, "num_hidden_layers": 2,
        "hidden_size": 96, "target_layer_ids": [1, 5, 9], "mask_token_id": 1021, "markov_rank": 24,
        "markov_head_type": "vanilla", "vocab_size": 1024}))
    (path / "model.safetensors").write_bytes(b"weights")
    if provenance is not None:
        (path / "dsparkhub_provenance.json").write_text(json.dumps(provenance))
    return path


def spec(outputs, wall, drafts, per_pos):
    n = len(per_pos)
    return RunStats(outputs=outputs, wall_s=wall, num_drafts=drafts, num_draft_tokens=drafts * n,
                    num_accepted_tokens=sum(per_pos), accepted_per_pos=per_pos)


def make_results(draft: Path, path: Path, *, backend="reference", device="cpu (2 threads)", version="dsparkhub 0.1.0",
                 fingerprint=None, mismatch=False, temperature=0.0, settings=None) -> Path:
    b3 = [list(o) for o in OUT_B]
    if mismatch:
        b3[0][2] = 999
    runs = [
        ("gsm-mini", "/data/gsm-mini.jsonl", RunStats(outputs=OUT_A, wall_s=3.37),
         {3: spec(OUT_A, 1.83, 5, [5, 3, 2]), 7: spec(OUT_A, 1.41, 3, [3, 3, 2, 2, 1, 1, 0])}),
        ("code", "builtin:code", RunStats(outputs=OUT_B, wall_s=2.91),
         {3: spec(b3, 1.77, 6, [5, 4, 1]), 7: spec(OUT_B, 1.59, 4, [4, 3, 3, 2, 1, 0, 0])}),
    ]
    s = settings or Settings(temperature=temperature, max_new_tokens=7, seed=13, num_speculative_tokens=[3, 7])
    res = build_results(engine=EngineInfo(backend, version, device), method="dspark",
                        target=ModelRef("Qwen/Qwen3-8B", None),
                        drafter=ModelRef(str(draft), fingerprint or checkpoint_fingerprint(draft)),
                        settings=s, runs=runs, date="2026-11-30T21:04:05+00:00")
    return res.save(path)


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("\n---\n", 1)[0][4:])


# ---- every number comes from a file --------------------------------------------------------------------------

_HEX = re.compile(r"[0-9a-f]{16,}")
_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\d.]*\d)")


def numbers(text: str) -> list[str]:
    return _NUM.findall(_HEX.sub(" ", text))


def allowed_numbers(files: list[Path], options: list[str]) -> set[str]:
    """Number tokens a card may show: those in the results / config / provenance files, the float values of the
    results in the formats the card uses, draft positions 1..max n, and numbers in the command-line options."""
    allowed: set[str] = set()
    for f in files:
        text = f.read_text()
        allowed |= set(numbers(text))
        if f.name.endswith(".json"):
            stack = [json.loads(text)]
            while stack:
                x = stack.pop()
                if isinstance(x, dict):
                    stack += list(x.values())
                elif isinstance(x, list):
                    stack += x
                elif isinstance(x, (int, float)) and not isinstance(x, bool):
                    allowed |= {f"{abs(x):.1f}", f"{abs(x):.2f}", str(round(abs(x), 3)), str(x)}
                    if isinstance(x, int):
                        allowed |= {str(k) for k in range(1, x + 1)} if x <= 16 else set()
    for o in options:
        allowed |= set(numbers(o))
    return allowed


def make_gpu_results(draft: Path, path: Path) -> Path:
    """Results as `verify --backend vllm` writes them with the seeds' serving settings (TP 8, max_model_len 20000)."""
    return make_results(draft, path, backend="vllm", version="vllm 0.32.0", device="NVIDIA H200 x8",
                        settings=Settings(temperature=0.0, max_new_tokens=7, seed=13, num_speculative_tokens=[3, 7],
                                          tensor_parallel_size=8, max_model_len=20000,
                                          compilation_config={"pass_config": {"fuse_allreduce_rms": False}}))


def test_every_number_in_the_card_comes_from_a_file(tmp_path):
    draft = make_drafter(tmp_path / "d", provenance=PROVENANCE)
    r1 = make_results(draft, tmp_path / "ref.json")
    r2 = make_gpu_results(draft, tmp_path / "gpu.json")
    out = write_card(draft, [r1, r2], repo_id="org/qwen3-8b-dspark", license="apache-2.0")
    text = out.readme.read_text()
    allowed = allowed_numbers([r1, r2, draft / "config.json", draft / "dsparkhub_provenance.json"],
                              ["org/qwen3-8b-dspark", "apache-2.0", "http://localhost:8000/v1"])  # vLLM's port
    found = numbers(text)
    assert len(found) > 150  # tables, settings and metadata really are in the card
    stray = sorted({n for n in found if n not in allowed})
    assert stray == [], f"numbers in the card that no file holds: {stray}"
    # the checker itself catches a typed-in number
    assert "9.87" not in allowed and "9.87" in numbers(text + "\n| extra | 9.87x |")


# ---- content ----------------------------------------------------------------------------------------------------


def test_card_content_reference_only(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    out = write_card(draft, [r], repo_id="org/qwen3-8b-dspark", license="mit")
    text = out.readme.read_text()
    meta = front_matter(text)
    assert meta["base_model"] == "Qwen/Qwen3-8B" and meta["library_name"] == "vllm"
    assert meta["pipeline_tag"] == "text-generation" and meta["license"] == "mit" and meta["inference"] is False
    assert meta["tags"] == ["speculative-decoding", "dspark", "draft-model", "vllm"]
    metrics = [m for res in meta["model-index"][0]["results"] for m in res["metrics"]]
    assert meta["model-index"][0]["name"] == "org/qwen3-8b-dspark"
    # τ only: CPU reference-engine speedups never enter the metadata
    assert {m["type"] for m in metrics} == {"acceptance_length"} and len(metrics) == 4
    data = json.loads(r.read_text())
    tau_a3 = data["datasets"][0]["runs"][0]["tau"]
    assert tau_a3 == pytest.approx(1 + 10 / 5)
    assert metrics[0]["value"] == round(tau_a3, 3)
    a3, a7 = data["datasets"][0]["runs"]
    c3, c7 = data["datasets"][1]["runs"]
    row = f"| gsm-mini | {a3['speedup']:.2f}x (τ {a3['tau']:.2f}) | {a7['speedup']:.2f}x (τ {a7['tau']:.2f}) |"
    assert row in text
    assert f"| code | {c3['speedup']:.2f}x (τ {c3['tau']:.2f}) |" in text
    s3, s7 = data["summary"]
    assert (f"| **mean** | **{s3['mean_speedup']:.2f}x (τ {s3['mean_tau']:.2f})** | "
            f"**{s7['mean_speedup']:.2f}x (τ {s7['mean_tau']:.2f})** |") in text
    ch = data["change"]
    assert f"From n=3 to n=7 the mean speedup changes by {ch['speedup_delta']:+.2f}x" in text
    assert f"the mean τ by {ch['tau_delta']:+.2f}" in text
    assert "| n | k=1 | k=2 | k=3 | k=4 | k=5 | k=6 | k=7 |" in text
    assert "| 3 | " + " | ".join(f"{v:.2f}" for v in s3["mean_per_position_acceptance"]) + " |  |  |  |  |" in text
    assert "CPU reference engine" in text and "**not** a GPU serving speedup" in text
    assert "hint, not a GPU measurement" in text
    best = max(data["summary"], key=lambda r: r["mean_speedup"])["num_speculative_tokens"]
    assert (f"vllm serve Qwen/Qwen3-8B \\\n  --speculative-config '{{\"model\": \"org/qwen3-8b-dspark\", "
            f"\"method\": \"dspark\", \"num_speculative_tokens\": {best}}}'") in text
    assert "--tensor-parallel-size" not in text  # measured at TP 1: nothing to add
    assert "- **Block size:** 7" in text and "- **Target layer ids (layer index):** [1, 5, 9]" in text
    assert "no `dsparkhub_provenance.json`" in text
    assert "![cumulative acceptance per draft position](assets/acceptance_per_position.png)" in text
    assert [p.name for p in out.plots] == ["acceptance_per_position.png", "speedup_vs_n.png"]


def test_card_with_gpu_results_and_provenance(tmp_path):
    draft = make_drafter(tmp_path / "d", provenance=PROVENANCE)
    ref = make_results(draft, tmp_path / "ref.json")
    gpu = make_gpu_results(draft, tmp_path / "gpu.json")
    out = write_card(draft, [ref, gpu])
    text = out.readme.read_text()
    meta = front_matter(text)
    assert meta["base_model"] == "Qwen/Qwen3-8B"  # from provenance / results, never a local path
    metrics = [m for res in meta["model-index"][0]["results"] for m in res["metrics"]]
    speedups = [m for m in metrics if m["type"] == "speedup"]
    assert len(speedups) == 4 and all("vllm" in m["name"] and "H200" in m["name"] for m in speedups)
    data = json.loads(gpu.read_text())
    best = max(data["summary"], key=lambda r: r["mean_speedup"])["num_speculative_tokens"]
    assert ("vllm serve Qwen/Qwen3-8B \\\n  --tensor-parallel-size 8 \\\n  --max-model-len 20000 \\\n"
            "  --compilation-config '{\"pass_config\": {\"fuse_allreduce_rms\": false}}' \\\n"
            f"  --speculative-config '{{\"model\": \"<your-namespace>/d\", \"method\": \"dspark\", "
            f"\"num_speculative_tokens\": {best}}}'") in text  # no --repo-id: a placeholder push refuses
    assert "    tensor_parallel_size=8,\n    max_model_len=20000," in text
    assert "compilation_config={'pass_config': {'fuse_allreduce_rms': False}}," in text
    assert "**Recommendation** (from the `vllm` measurements below): No n is reliably better" in text  # one timed repeat: no spread
    assert "### CPU reference engine" in text and "### vLLM offline engine (vllm 0.32.0, NVIDIA H200 x8)" in text
    assert "on NVIDIA H200 x8" in text
    assert "- **Source checkpoint:** `step_1200` (deepspec layout)" in text  # an old file's path, by its name
    assert "/runs/" not in text and str(tmp_path) not in text and "/data/" not in text
    assert f"`model.safetensors` `{'c0ffee' * 10}`" in text
    assert "- **Converted against target:** `Qwen/Qwen3-8B`" in text
    assert '- **Conversion options:** `{"keep_embeddings": false}`' in text
    assert "- **Converted with:** dsparkhub 0.1.0 on 2026-11-30T20:40:00+00:00" in text
    assert '"command": "convert"' in text  # the whole file, folded
    names = sorted(p.name for p in out.plots)
    assert names == ["acceptance_per_position_reference.png", "acceptance_per_position_vllm.png",
                     "speedup_vs_n_reference.png", "speedup_vs_n_vllm.png"]
    assert all(f"(assets/{n})" in text for n in names)


def test_temperature_results_say_lossless_not_checked(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json", temperature=0.7, mismatch=True)  # mismatch is not a failure here
    text = write_card(draft, [r]).readme.read_text()
    assert "Lossless: not checked: temperature 0.7" in text


def test_plots_are_png(tmp_path):
    import matplotlib.image as mpimg

    draft = make_drafter(tmp_path / "d")
    out = write_card(draft, [make_results(draft, tmp_path / "r.json")])
    assert len(out.plots) == 2
    for p in out.plots:
        assert p.read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(p)
        assert img.shape[0] == 825 and img.shape[1] == 1350 and img.std() > 0.01  # not a blank canvas
    assert not list(draft.glob(".dsparkhub-card-*"))


def test_plots_name_drafter_target_and_datasets_and_speedup_shows_the_1x_line(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    draft = make_drafter(tmp_path / "my-drafter")
    write_card(draft, [make_results(draft, tmp_path / "r.json")], repo_id="org/d")
    (acc,), (speed,) = (f.axes for f in figures)
    for ax in (acc, speed):
        title = ax.get_title()
        assert "DSpark drafter my-drafter on Qwen/Qwen3-8B" in title and "datasets: gsm-mini, code" in title
    ys = [y for line in speed.get_lines() for y in line.get_ydata()]
    # the axis spans the data and the labelled 1x line (target alone), so a 1.1x never looks like a 3x
    assert speed.get_ylim()[0] < min(ys + [1.0]) and speed.get_ylim()[1] > max(ys)


# ---- refusals ---------------------------------------------------------------------------------------------------


def test_refuse_other_drafter(tmp_path):
    draft = make_drafter(tmp_path / "d")
    other = "f" * 64
    r = make_results(draft, tmp_path / "r.json", fingerprint=other)
    with pytest.raises(ResultsError) as ei:
        write_card(draft, [r])
    msg = str(ei.value)
    assert other in msg and checkpoint_fingerprint(draft) in msg and str(r) in msg
    assert not (draft / "README.md").exists()


def test_refuse_changed_weights(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    (draft / "model.safetensors").write_bytes(b"retrained weights")
    with pytest.raises(ResultsError, match="measured on drafter fingerprint"):
        write_card(draft, [r])


def test_refuse_lossless_failed(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json", mismatch=True)
    with pytest.raises(ResultsError, match="not lossless .*dataset 'code', num_speculative_tokens=3"):
        write_card(draft, [r])
    assert not (draft / "README.md").exists() and not (draft / "assets").exists()


def test_refuse_malformed_and_missing(tmp_path):
    draft = make_drafter(tmp_path / "d")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "dsparkhub.verify.results/1"}')
    with pytest.raises(ResultsError, match="key `settings`: expected a JSON object, found missing"):
        write_card(draft, [bad])
    with pytest.raises(CardError, match="at least one results file"):
        write_card(draft, [])
    with pytest.raises(FileNotFoundError):
        write_card(tmp_path / "nope", [bad])


def test_template_override_and_errors(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    t = tmp_path / "mine.md.j2"
    t.write_text("# {{ name }}\n{% for s in sections %}{{ s.mean | join(' ; ') }}{% endfor %}\n")
    text = write_card(draft, [r], template=t, repo_id="org/x").readme.read_text()
    data = json.loads(r.read_text())
    s3 = data["summary"][0]
    assert text.startswith("# org/x\n") and f"{s3['mean_speedup']:.2f}x (τ {s3['mean_tau']:.2f})" in text
    (draft / "README.md").unlink()
    t.write_text("{{ no_such_variable }}")
    with pytest.raises(CardError, match="no_such_variable"):
        write_card(draft, [r], template=t)
    t.write_text("line one\n{% for x in %}")
    with pytest.raises(CardError, match="line 2"):
        write_card(draft, [r], template=t)
    with pytest.raises(CardError, match="does not exist"):
        write_card(draft, [r], template=tmp_path / "none.j2")
    assert not (draft / "README.md").exists() and not list(draft.glob(".dsparkhub-card-*"))


# ---- CLI ----------------------------------------------------------------------------------------------------------


def test_cli_card(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(r), "--repo-id", "org/x",
                                    "--base-model", "Qwen/Qwen3-8B", "--license", "mit"])
    assert res.exit_code == 0, res.output
    assert f"wrote {(draft / 'README.md').resolve()}" in res.output and "speedup_vs_n.png" in res.output
    assert front_matter((draft / "README.md").read_text())["license"] == "mit"
    bad = make_results(draft, tmp_path / "bad.json", mismatch=True)
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(r), "--results", str(bad)])
    assert res.exit_code == 1 and "ResultsError" in res.output and "not lossless" in res.output
    res = CliRunner().invoke(main, ["card", str(draft)])
    assert res.exit_code == 2  # --results is required: no way to make a card without measurements


def test_a_hand_written_readme_is_kept_unless_overwrite(tmp_path):
    from dsparkhub.card import CARD_MARKER

    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    (draft / "README.md").write_text("# my notes\n")
    with pytest.raises(CardError, match="did not write"):
        write_card(draft, [r])
    assert (draft / "README.md").read_text() == "# my notes\n"
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(r)])
    assert res.exit_code == 1 and "--overwrite" in res.output
    write_card(draft, [r], overwrite=True)
    assert (draft / "README.md").read_text().rstrip().endswith(CARD_MARKER)
    write_card(draft, [r])  # its own card is replaced without --overwrite
    res = CliRunner().invoke(main, ["card", str(draft), "--results", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_a_readme_folder_is_refused_before_anything_is_written(tmp_path):
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    (draft / "README.md").mkdir()
    with pytest.raises(CardError, match="not a file"):
        write_card(draft, [r])
    assert not (draft / "assets").exists()


# ---- a release that is right when it leaves (issue 13) -----------------------------------------------------------


@pytest.mark.parametrize("edit, words", [
    (lambda run: run.update(tau=4.5), "τ is 4.5, but a verify step commits 1 to n + 1 = 4 tokens"),
    (lambda run: run.update(speedup=run["tau"] * 1.5), "exceeds τ"),
    (lambda run: run.update(tokens_per_s=-1.0), "tokens_per_s is -1.0 (negative)"),
    (lambda run: run.update(per_position_acceptance=[1.2, 0.5, 0.1]), "leaves [0, 1]"),
])
def test_impossible_results_are_refused_naming_the_file(tmp_path, edit, words):
    draft = make_drafter(tmp_path / "d")
    path = make_results(draft, tmp_path / "edited.json")
    data = json.loads(path.read_text())
    run = data["datasets"][0]["runs"][0]
    assert run["num_speculative_tokens"] == 3
    edit(run)
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="impossible results") as err:
        write_card(draft, [path], repo_id="org/d")
    assert words in str(err.value) and "edited.json" in str(err.value) and "gsm-mini" in str(err.value)
    assert not (draft / "README.md").exists()


def _local_target(path: Path, config_extra: dict | None = None) -> Path:
    from dsparkhub.testing.factories import make_qwen3_target

    make_qwen3_target(path)
    if config_extra:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, **config_extra}))
    return path


def test_card_for_a_local_target_names_its_hub_id_and_no_local_path(tmp_path):
    from dsparkhub.card.render import serve_command_problems

    target = _local_target(tmp_path / "targets" / "qwen3", {"_name_or_path": "Qwen/Qwen3-8B"})
    draft = make_drafter(tmp_path / "d")
    path = make_results(draft, tmp_path / "r.json")
    data = json.loads(path.read_text())
    data["target"]["id"] = str(target)  # a results file written before results named targets by Hub id
    data["datasets"][0]["source"] = str(tmp_path / "data" / "gsm-mini.jsonl")
    path.write_text(json.dumps(data))
    read_results(path)
    text = write_card(draft, [path], repo_id="org/d").readme.read_text()
    assert front_matter(text)["base_model"] == "Qwen/Qwen3-8B"
    assert "vllm serve Qwen/Qwen3-8B" in text and "- **Target:** `Qwen/Qwen3-8B`" in text
    assert str(tmp_path) not in text and "`gsm-mini.jsonl`" in text
    assert serve_command_problems(text) == []
    # no Hub id anywhere: the card is refused before anything is written, naming --base-model, which fixes it
    bare = _local_target(tmp_path / "bare")
    data["target"]["id"] = str(bare)
    path.write_text(json.dumps(data))
    (draft / "README.md").unlink()
    with pytest.raises(CardError, match="no Hub repo id of it is known") as err:
        write_card(draft, [path])
    assert "--base-model" in err.value.hint and not (draft / "README.md").exists()
    assert str(tmp_path) not in str(err.value)
    text = write_card(draft, [path], base_model="org/qwen3-tiny", repo_id="org/d").readme.read_text()
    assert front_matter(text)["base_model"] == "org/qwen3-tiny" and serve_command_problems(text) == []


def test_target_repo_id_from_config_manifest_headers_and_skeleton(tmp_path):
    from dsparkhub.skeleton import write_skeleton
    from dsparkhub.target import target_repo_id

    assert target_repo_id("Qwen/Qwen3-8B@main") == ("Qwen/Qwen3-8B", "Hub repo id")
    assert target_repo_id("kimi-k2.6")[0] == "moonshotai/Kimi-K2.6"
    named = _local_target(tmp_path / "named", {"_name_or_path": "org/base"})
    assert target_repo_id(named) == ("org/base", "config.json _name_or_path")
    local_name = _local_target(tmp_path / "local", {"_name_or_path": str(tmp_path / "elsewhere")})
    assert target_repo_id(local_name)[0] is None  # a local _name_or_path is no Hub id
    write_skeleton("qwen3-8b", tmp_path / "skel")
    (tmp_path / "skel" / "dsparkhub_skeleton.json").unlink()  # the headers alone match the manifest
    assert target_repo_id(tmp_path / "skel") == ("Qwen/Qwen3-8B", "headers match manifest qwen3-8b")
def test_card_concurrency_table_plot_and_unreliable(tmp_path):
    """A /2 file with two concurrencies: the measured table replaces the one-request caveat, the plot is written,
    and an impossible batch-1 figure (speedup above τ) is marked and never chooses n."""
    from dsparkhub.card.tables import serve_commands

    draft = make_drafter(tmp_path / "d")
    base = {1: [RunStats(outputs=OUT_A, wall_s=4.0)], 4: [RunStats(outputs=OUT_A, wall_s=2.0)]}
    by = {(3, 1): [spec(OUT_A, 2.5, 5, [5, 3, 2])],        # 1.6x at τ 3.0: possible
          (7, 1): [spec(OUT_A, 0.5, 3, [3, 3, 2, 2, 1, 1, 0])],  # 8x at τ 5.0: impossible at batch 1
          (3, 4): [spec(OUT_A, 1.6, 5, [5, 3, 2])], (7, 4): [spec(OUT_A, 2.5, 3, [3, 3, 2, 2, 1, 1, 0])]}
    res = build_results(engine=EngineInfo("reference", "dsparkhub 0.1.0", "cpu (1 threads)"), method="dspark",
                        target=ModelRef("Qwen/Qwen3-8B", None),
                        drafter=ModelRef(str(draft), checkpoint_fingerprint(draft)),
                        settings=Settings(0.0, 7, 13, [3, 7], concurrency=[1, 4]),
                        runs=[("gsm-mini", "/data/gsm-mini.jsonl", base, by)], date="2026-11-30T21:04:05+00:00")
    path = res.save(tmp_path / "r.json")
    assert serve_commands(read_results(path), target="t", model="m")["n"] == 3  # not the impossible n=7
    out = write_card(draft, [path])
    text = out.readme.read_text()
    assert "8.00x (unreliable)" in text and "exceeds τ 5.00" in text
    assert "Measured at serving load" in text and "| 4 | n=3 |" in text
    assert "one request at a time" not in text
    assert (draft / "assets" / "speedup_vs_concurrency.png").read_bytes().startswith(PNG_MAGIC)
    assert "- concurrency 1: Only n=3 (1.60x) was measured reliably" in text  # n=7's impossible 8x never counts
    assert "- concurrency 4: No n is reliably better: n=3 (1.25x) leads n=7 (0.80x), but with 1 timed" in text
    assert "The drafter stops paying from concurrency" not in text


def test_card_license_comes_from_the_target_manifest_unless_given(tmp_path):
    """Issue 29 item 7: the license is the target manifest's (Kimi K2: `other (modified-mit)`, written as the Hub's
    `license: other` + `license_name`), not always apache-2.0; --license wins; an unknown target keeps apache-2.0."""
    draft = make_drafter(tmp_path / "d")
    r = make_results(draft, tmp_path / "r.json")
    meta = front_matter(write_card(draft, [r], base_model="moonshotai/Kimi-K2.6").readme.read_text())
    assert (meta["license"], meta["license_name"]) == ("other", "modified-mit")
    meta = front_matter(write_card(draft, [r], base_model="moonshotai/Kimi-K2.6", license="mit").readme.read_text())
    assert meta["license"] == "mit" and "license_name" not in meta
    assert front_matter(write_card(draft, [r]).readme.read_text())["license"] == "apache-2.0"  # Qwen3-8B manifest
    assert front_matter(write_card(draft, [r], base_model="org/unknown").readme.read_text())["license"] == "apache-2.0"


def _outside_details(text: str) -> str:
    """The card's text without its folded ``<details>`` blocks."""
    return re.sub(r"<details>.*?</details>", "", text, flags=re.S)


def test_hashes_are_folded_away_except_the_drafter_fingerprint(tmp_path):
    draft = make_drafter(tmp_path / "d", provenance=PROVENANCE)
    out = write_card(draft, [make_results(draft, tmp_path / "ref.json")], repo_id="org/qwen3-8b-dspark")
    text = out.readme.read_text()
    assert "<details><summary>Provenance and hashes</summary>" in text
    visible = _outside_details(text)
    # the one hash left in view is the fingerprint line `push` checks the weights against (hub/trust.py)
    assert re.findall(r"[0-9a-f]{40,}", visible) == [checkpoint_fingerprint(draft)]
    assert "c0ffee" * 10 in text and "c0ffee" * 10 not in visible
    assert "Converted from `step_1200` (deepspec layout) to the vllm layout with dsparkhub 0.1.0 on 2026-11-30" \
        in visible


def test_the_sglang_command_serves_the_calibration_sidecar_at_its_gamma(tmp_path):
    draft = make_drafter(tmp_path / "d")
    res = make_results(draft, tmp_path / "ref.json")
    n, _ = read_results(res).best_n()
    (draft / "dspark_sts.json").write_text(json.dumps({"temperatures": [1.1] * n}))  # SGLang's own fitter's file
    text = write_card(draft, [res], repo_id="org/d").readme.read_text()
    assert (f'--speculative-dspark-block-size {n} \\\n  --speculative-dspark-confidence-sts-path '
            f'"$(hf download org/d dspark_sts.json)"') in text
    (draft / "dspark_sts.json").write_text(json.dumps({"temperatures": [1.1] * (n + 1)}))
    text = write_card(draft, [res], repo_id="org/d").readme.read_text()
    assert "confidence-sts-path" not in text.split("## Use with SGLang")[1].split("```")[1]
    assert f"fitted for γ = {n + 1} and SGLang refuses it at γ = {n}" in text


def _repeated(draft: Path, tmp_path: Path, walls: dict[int, list[float]]):
    """Results with three timed repeats: baseline 4 s each; ``walls[n]`` the three walls with the drafter."""
    base = {1: [RunStats(outputs=OUT_A, wall_s=4.0)] * 3}
    per_pos = {3: [5, 3, 2], 7: [3, 3, 2, 2, 1, 1, 0]}
    by = {(n, 1): [spec(OUT_A, w, 5 if n == 3 else 3, per_pos[n]) for w in ws] for n, ws in walls.items()}
    res = build_results(engine=EngineInfo("vllm", "vllm 0.32.0", "NVIDIA H200"), method="dspark",
                        target=ModelRef("Qwen/Qwen3-8B", None),
                        drafter=ModelRef(str(draft), checkpoint_fingerprint(draft)),
                        settings=Settings(0.0, 7, 13, [3, 7], repeats=3, spread_limit=0.5),
                        runs=[("gsm-mini", "/data/gsm-mini.jsonl", base, by)], date="2026-11-30T21:04:05+00:00")
    return res.save(tmp_path / "r.json")


@pytest.mark.parametrize("walls, kind, says", [
    ({3: [2.0, 2.0, 2.0], 7: [2.5, 2.5, 2.5]}, "best", "Best n: n=3 (2.00x), ahead of n=7 (1.60x) by more than"),
    ({3: [1.9, 2.0, 2.5], 7: [2.1, 2.1, 2.1]}, "tie", "No n is reliably better: n=3 (2.00x) leads n=7 (1.90x) by less"),
    ({3: [5.0, 5.0, 5.0], 7: [6.0, 6.0, 6.0]}, "no_gain", "Speculation does not pay at this load"),
])
def test_best_n_only_where_the_margin_beats_the_spread_and_speculation_pays(tmp_path, walls, kind, says):
    from dsparkhub.card.tables import recommendation

    draft = make_drafter(tmp_path / "d")
    path = _repeated(draft, tmp_path, walls)
    assert recommendation(read_results(path))["kind"] == kind
    text = write_card(draft, [path], repo_id="org/d").readme.read_text()
    assert says in text
    assert ("Best n" in text) == (kind == "best")


def test_setup_line_install_and_openai_client(tmp_path):
    from dsparkhub.card.render import serve_command_problems

    draft = make_drafter(tmp_path / "d")
    gpu = make_gpu_results(draft, tmp_path / "gpu.json")
    text = write_card(draft, [gpu], repo_id="org/d").readme.read_text()
    assert ("**Setup:** vLLM offline engine (vllm 0.32.0) on NVIDIA H200 x8; temperature 0.0 (greedy), up to 7 new "
            "tokens; one request at a time; prompts through the target's chat template, thinking disabled; 1 timed "
            "repeat(s).") in text
    assert 'pip install "vllm==0.32.0" openai\nvllm serve Qwen/Qwen3-8B' in text
    assert 'client = OpenAI(base_url="http://localhost:8000/v1"' in text and 'model="Qwen/Qwen3-8B",' in text
    assert '"enable_thinking": False' in text and "VLLM_USE_V2_MODEL_RUNNER=0" in text
    assert serve_command_problems(text) == []
    ref = write_card(draft, [make_results(draft, tmp_path / "ref.json")], repo_id="org/d").readme.read_text()
    assert "pip install vllm openai\n" in ref and "dsparkhub CPU reference engine (dsparkhub 0.1.0) on cpu" in ref


def test_plots_show_spread_honest_labels_and_one_legend_entry_per_line(tmp_path, monkeypatch):
    import dsparkhub.card.plots as plots

    figs = {}

    def keep(fig, path):
        figs[Path(path).name] = fig.axes[0]
        return path

    monkeypatch.setattr(plots, "_save_png", keep)
    draft = make_drafter(tmp_path / "d")
    res = read_results(_repeated(draft, tmp_path, {3: [1.9, 2.0, 2.5], 7: [2.1, 2.1, 2.1]}))  # one dataset
    plots.plot_speedup(res, tmp_path / "s.png")
    ax = figs["s.png"]
    # n=3's repeats spread by 25% (limit 50%): reliable, no hollow marker; one dataset: no separate mean line
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["gsm-mini", "target alone (1x)"]
    assert len(ax.containers) == 1 and ax.containers[0].has_yerr  # the repeats' range as error bars
    lo, hi = ax.get_ylim()
    assert 0.85 < lo < 1.0 and 2.1 < hi < 2.4  # spans the data and 1x, not 0 to 1.2
    assert plots._speedup_limits([1.02, 1.03]) == pytest.approx((0.95, 1.08))  # flat: not squashed at the top
    plots.plot_acceptance(res, tmp_path / "a.png")
    ax = figs["a.png"]
    assert "first k drafts all accepted" in ax.get_ylabel() and "Cumulative" in ax.get_title()
    tight = read_results(_repeated(draft, tmp_path, {3: [1.9, 2.0, 2.5], 7: [2.1, 2.1, 2.1]}))
    tight.datasets[0].runs[0].unreliable = ["spread"]  # as verify marks a wide spread: hollow, in the legend
    plots.plot_speedup(tight, tmp_path / "t.png")
    assert "hollow: unreliable timing" in [t.get_text() for t in figs["t.png"].get_legend().get_texts()]


def test_training_section_from_what_convert_recorded(tmp_path):
    prov = {**PROVENANCE, "training": {"step": 1200, "config": {"train.lr": 0.0006, "data.chat_template": "qwen"}}}
    draft = make_drafter(tmp_path / "d", provenance=prov)
    text = write_card(draft, [make_results(draft, tmp_path / "r.json")], repo_id="org/d").readme.read_text()
    training = text.split("## Training\n", 1)[1].split("\n## ", 1)[0]
    assert "- **Training step:** 1200" in training and '- **`train.lr`:** `0.0006`' in training
    assert '- **`data.chat_template`:** `"qwen"`' in training
    draft2 = make_drafter(tmp_path / "d2", provenance=PROVENANCE)  # older provenance: no section
    assert "## Training" not in write_card(draft2, [make_results(draft2, tmp_path / "r2.json")]).readme.read_text()


def test_where_the_time_goes_from_step_costs_and_a_schedule_report(tmp_path):
    from dsparkhub.io.output import replace_json
    from dsparkhub.verify.costs import StepCosts, step_costs_record
    from dsparkhub.verify.schedule import PolicyRow, ScheduleReport, report_dict

    draft = make_drafter(tmp_path / "d")
    path = make_results(draft, tmp_path / "ref.json")
    plain = write_card(draft, [path]).readme.read_text()
    assert "## Where the time goes" not in plain  # a results file without step costs: no such section
    res = read_results(path)

    def costs(width, draft_s, verify_s):
        c = StepCosts()
        for _ in range(9):
            c.record(1, width, draft_s, verify_s, context=20)
        return [(c, 1.0)]

    # n=3: 10 ms a target step, 2 + 12 ms a speculative one; n=7: a 40 ms step caps it at 2x, below the measured
    res.step_costs = step_costs_record(res, {(None, 1): costs(None, 0.0, 0.010), (3, 1): costs(3, 0.002, 0.012),
                                             (7, 1): costs(7, 0.008, 0.032)}, source="reference engine steps")
    res.save(path)
    sched = replace_json(tmp_path / "schedule.json", report_dict(ScheduleReport(
        gamma=7, engine="reference (x)", hardware="cpu (1 thread)", baseline_tokens_per_s={4: 100.0},
        policies=[PolicyRow("static", "-", 4, 90, 7.0, 4.2, 0.0, 3.8, 150.0, 0.0, True),
                  PolicyRow("budget", "sts", 4, 90, 3.5, 1.0, 0.4, 3.5, 170.0, 3.5, True)])))
    text = write_card(draft, [path], schedule=sched).readme.read_text()
    block = text[text.index("## Where the time goes"):]
    n3, n7 = res.step_costs.law
    assert f"| 3 | 1 | 10.00 | 2.00 | 12.00 | 14% | 1.20x | {n3.tau:.2f} | {n3.predicted:.2f}x" in block
    assert n7.flag == "above ceiling" and f"| 2.00x | {n7.measured:.2f}x ⚠ |" in block  # one repeat: no range
    assert f"n=7 at concurrency 1: measured {n7.measured:.2f}x is above the ceiling 2.00x" in block
    assert "The lowest ceiling is 2.00x (n=7, concurrency 1)" in block and "5.00 ms against 10.00 ms" in block
    assert "| budget | sts | 4 | 3.50 | 1.00 | 3.50 | 3.50 | 1.70x | yes |" in block
    assert "**Recommendation** (from the policy table): From concurrency 4 on, serve with budget with sts" in block
    out = CliRunner().invoke(main, ["card", str(draft), "--results", str(path), "--schedule", str(path)])
    assert out.exit_code == 1 and "not a `dsparkhub schedule --out` report" in out.output
