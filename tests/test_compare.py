"""dsparkhub.compare, `dsparkhub compare` and `dsparkhub card --compare`: the seed tables (Novita's speedups at
n=3 / n=7 with the change, LightSeek's τ / throughput per concurrency with the crossover), unweighted means, and
the one-paragraph refusal of a results file of another target."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.compare import CompareError, compare, format_markdown, format_text, load_sources
from dsparkhub.verify.results.derive import build_results
from dsparkhub.verify.results.reading import read_results
from dsparkhub.verify.results.schema import EngineInfo, ModelRef, Settings
from dsparkhub.verify.stats import RunStats

OUT = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12]]  # 12 output tokens per run
OUT2 = [[1, 2, 3, 4, 5, 6]]  # 6 output tokens (a smaller dataset: counts once in the unweighted mean)


def _spec(wall, n, drafts=4):
    return RunStats(outputs=OUT, wall_s=wall, num_drafts=drafts, num_draft_tokens=drafts * n,
                    num_accepted_tokens=drafts * n // 2, accepted_per_pos=[drafts // 2] * n)


def make(path: Path, drafter: str, method: str, walls: dict, *, target="Qwen/Qwen3-8B", base_wall=1.2,
         small_walls: dict | None = None) -> Path:
    """walls: {(n, concurrency): wall seconds} on a 12-token dataset whose baseline takes base_wall seconds (so
    speedup = base_wall / wall); small_walls: the same for a second, 6-token dataset."""
    ns = sorted({n for n, _ in walls})
    cs = sorted({c for _, c in walls})
    runs = [("math", "builtin:math", {c: [RunStats(outputs=OUT, wall_s=base_wall)] for c in cs},
             {(n, c): [_spec(w, n)] for (n, c), w in walls.items()})]
    if small_walls:
        runs.append(("chat", "builtin:chat", {c: [RunStats(outputs=OUT2, wall_s=base_wall)] for c in cs},
                     {(n, c): [RunStats(outputs=OUT2, wall_s=w, num_drafts=2, num_draft_tokens=2 * n,
                                        num_accepted_tokens=n, accepted_per_pos=[1] * n)]
                      for (n, c), w in small_walls.items()}))
    res = build_results(engine=EngineInfo("reference", "dsparkhub 0.1.0", "cpu"), method=method,
                        target=ModelRef(target, None), drafter=ModelRef(drafter, None),
                        settings=Settings(temperature=0.0, max_new_tokens=8, seed=0, num_speculative_tokens=ns,
                                          concurrency=cs),
                        runs=runs, date="2026-12-01T00:00:00+00:00")
    return res.save(path)


@pytest.fixture
def files(tmp_path):
    # dspark: fast at low concurrency, falls off; eagle3: slower at 1, faster from 8 (the LightSeek shape)
    dspark = make(tmp_path / "dspark.json", "dspark-drafter", "dspark",
                  {(3, 1): 0.6, (7, 1): 0.5, (3, 8): 0.6, (7, 8): 0.8})
    eagle = make(tmp_path / "eagle3.json", "eagle3-drafter", "eagle3",
                 {(3, 1): 0.8, (7, 1): 1.0, (3, 8): 0.4, (7, 8): 0.5})
    return dspark, eagle


def test_novita_rows_and_change(files):
    (cmp,) = compare(load_sources(list(files)))
    d, e = cmp.rows
    assert d.label == "dspark-drafter" and d.speedup == {3: pytest.approx(2.0), 7: pytest.approx(2.4)}
    assert d.change == pytest.approx(0.4)
    assert e.speedup == {3: pytest.approx(1.5), 7: pytest.approx(1.2)} and e.change == pytest.approx(-0.3)
    text = format_text([cmp])
    assert "2.00x" in text and "+0.40x" in text and "-0.30x" in text and "target Qwen/Qwen3-8B" in text


def test_lightseek_load_and_crossover(files):
    (cmp,) = compare(load_sources(list(files)))
    assert cmp.concurrencies == [1, 8]
    at1, at8 = cmp.load["dspark-drafter"][1], cmp.load["dspark-drafter"][8]
    assert at1.n == 7 and at1.tokens_per_s == pytest.approx(24.0)  # best n at 1: 12 tokens / 0.5 s
    assert at8.n == 3 and at8.tokens_per_s == pytest.approx(20.0)
    assert cmp.load["eagle3-drafter"][8].tokens_per_s == pytest.approx(30.0)
    x = cmp.crossover
    assert (x.leader, x.to, x.from_concurrency, x.at) == ("dspark-drafter", "eagle3-drafter", 1, 8)
    assert "crossover: eagle3-drafter matches or passes dspark-drafter" in format_text([cmp])
    md = format_markdown([cmp])
    assert md.startswith("## Comparison with other drafters") and "| concurrency |" in md
    assert "From concurrency 8" not in md and "from concurrency 8" in md


def test_no_crossover_and_single_drafter(tmp_path):
    a = make(tmp_path / "a.json", "a", "dspark", {(3, 1): 0.5, (3, 4): 0.5})
    b = make(tmp_path / "b.json", "b", "dflash", {(3, 1): 0.6, (3, 4): 0.6})
    (cmp,) = compare(load_sources([a, b]))
    assert cmp.crossover is None and "keeps its lead" in format_text([cmp])
    (one,) = compare(load_sources([a]))
    assert one.crossover is None and "one drafter" in format_text([one])
    # n=7 not measured: "-" and no change
    assert one.rows[0].speedup[7] is None and one.rows[0].change is None


def test_means_unweighted_over_datasets(tmp_path):
    # math (12 tokens) speedup 2.0, chat (6 tokens) speedup 1.0: unweighted mean 1.5 (a token-weighted one: 1.67)
    p = make(tmp_path / "r.json", "d", "dspark", {(3, 1): 0.6}, small_walls={(3, 1): 1.2})
    (cmp,) = compare(load_sources([p]))
    assert cmp.rows[0].speedup[3] == pytest.approx(1.5)


def test_compare_cli_groups_targets_and_labels_repeats(tmp_path, files):
    other = make(tmp_path / "other.json", "dspark-drafter", "dspark", {(3, 1): 0.6}, target="Qwen/Qwen3-32B")
    arm = make(tmp_path / "arm-on.json", "dspark-drafter", "dspark", {(3, 1): 0.55})
    r = CliRunner().invoke(main, ["compare", str(files[0]), str(files[1]), str(other), str(arm)])
    assert r.exit_code == 0, r.output
    assert "target Qwen/Qwen3-8B" in r.output and "target Qwen/Qwen3-32B" in r.output
    assert "dspark-drafter [dspark.json]" in r.output and "dspark-drafter [arm-on.json]" in r.output


def test_compare_cli_malformed_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(main, ["compare", str(bad)])
    assert r.exit_code == 1 and "schema" in r.output


def _drafter_folder(tmp_path):
    import json

    from dsparkhub.io.hashing import checkpoint_fingerprint

    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7, "num_hidden_layers": 2,
        "hidden_size": 96, "target_layer_ids": [1, 5, 9], "mask_token_id": 1021, "markov_rank": 24,
        "markov_head_type": "vanilla", "vocab_size": 1024}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d, checkpoint_fingerprint(d)


def _card_results(tmp_path, d, fp, target="Qwen/Qwen3-8B"):
    p = make(tmp_path / "mine.json", "drafter", "dspark", {(3, 1): 0.6, (7, 1): 0.5, (3, 8): 0.6, (7, 8): 0.8},
             target=target)

    res = read_results(p)
    res.drafter = ModelRef("drafter", fp)
    return res.save(p)


def test_card_compare_renders_tables(tmp_path, files):
    d, fp = _drafter_folder(tmp_path)
    mine = _card_results(tmp_path, d, fp)
    r = CliRunner().invoke(main, ["card", str(d), "--results", str(mine), "--compare", str(files[1])])
    assert r.exit_code == 0, r.output
    text = (d / "README.md").read_text()
    assert "## Comparison with other drafters" in text and "eagle3-drafter" in text
    assert "| drafter | method | engine | speedup vs | speedup n=3 | speedup n=7 | change n=3->7 |" in text
    assert "Crossover: eagle3-drafter matches or passes drafter" in text


def test_card_without_compare_has_no_section(tmp_path):
    d, fp = _drafter_folder(tmp_path)
    mine = _card_results(tmp_path, d, fp)
    r = CliRunner().invoke(main, ["card", str(d), "--results", str(mine)])
    assert r.exit_code == 0, r.output
    assert "Comparison with other drafters" not in (d / "README.md").read_text()


def test_card_compare_other_target_is_one_paragraph(tmp_path):
    d, fp = _drafter_folder(tmp_path)
    mine = _card_results(tmp_path, d, fp)
    other = make(tmp_path / "kimi.json", "eagle3-drafter", "eagle3", {(3, 1): 0.8}, target="moonshotai/Kimi-K3")
    r = CliRunner().invoke(main, ["card", str(d), "--results", str(mine), "--compare", str(other)])
    assert r.exit_code == 1
    assert "moonshotai/Kimi-K3" in r.output and "Qwen/Qwen3-8B" in r.output and "kimi.json" in r.output
    assert "Traceback" not in r.output and not (d / "README.md").exists()
    from dsparkhub.compare import read_compare

    with pytest.raises(CompareError):
        read_compare(read_results(mine), [other])


def test_reads_v1_results():
    v1 = Path(__file__).parent / "data" / "results_v1.json"
    (cmp,) = compare(load_sources([v1]))
    assert cmp.concurrencies == [1] and cmp.rows[0].concurrency == 1 and 1 in cmp.load[cmp.rows[0].label]


def test_best_n_is_read_from_the_results_by_card_and_compare(tmp_path):
    """One best n (``VerifyResults.best_n``): the reliable best speedup, else the highest τ; never the highest
    tokens/s of unreliable timings (compare fell back to that, the card to τ)."""
    from dsparkhub.card.tables import serve_commands
    from dsparkhub.compare import load_cell

    p = make(tmp_path / "r.json", "d", "dspark", {(3, 1): 0.6, (7, 1): 0.5, (3, 8): 0.4, (7, 8): 0.8})
    res = read_results(p)
    assert res.best_n(1) == (7, True) and serve_commands(res, target="t", model="m")["n"] == 7
    for row in res.load:  # as when no speedup at concurrency 8 is reliable
        if row.concurrency == 8:
            row.best_n = row.best_speedup = row.pays = None
    by_n = {r.num_speculative_tokens: r for r in res.summary_at(8)}
    assert by_n[7].mean_tau > by_n[3].mean_tau and by_n[3].mean_tokens_per_s > by_n[7].mean_tokens_per_s
    assert res.best_n(8) == (7, False)
    cell = load_cell(res, 8)
    assert (cell.n, cell.reliable) == (7, False)
    assert res.best_n(32) is None and load_cell(res, 32) is None


# --- issue 30: LightSeek's Kimi K3 table shape from three results files, one per drafter TorchSpec trains
# (EAGLE-3, DFlash2, DSpark) on one target: τ and throughput per concurrency, the first hand-over of the lead

# wall seconds per (n, concurrency) on the 12-token dataset (baseline 1.2 s): DSpark leads at 1, DFlash2 at 8,
# EAGLE-3 at 32 -- the concurrency-dependent choice of LightSeek's release
WALLS = {"dspark": {(3, 1): 0.4, (3, 8): 0.7, (3, 32): 0.9},
         "dflash2": {(3, 1): 0.5, (3, 8): 0.5, (3, 32): 0.8},
         "eagle3": {(3, 1): 0.6, (3, 8): 0.6, (3, 32): 0.45}}


@pytest.fixture
def three_k3(tmp_path):
    # a DFlash2 drafter runs as vLLM's method "dflash" (the results schema's methods: dspark, dflash, eagle3)
    return [make(tmp_path / f"{m}.json", f"kimi-k3-{m}", {"dflash2": "dflash"}.get(m, m), walls,
                 target="moonshotai/Kimi-K3") for m, walls in WALLS.items()]


def test_three_drafters_give_lightseeks_table_and_first_crossover(three_k3):
    (cmp,) = compare(load_sources(three_k3))
    assert cmp.concurrencies == [1, 8, 32]
    assert set(cmp.load) == {"kimi-k3-dspark", "kimi-k3-dflash2", "kimi-k3-eagle3"}
    for label, walls in WALLS.items():
        for (n, c), wall in walls.items():
            cell = cmp.load[f"kimi-k3-{label}"][c]
            assert cell.n == n and cell.tokens_per_s == pytest.approx(12 / wall)
            assert cell.tau == pytest.approx(1 + n / 2)  # half of the drafts accepted, plus the bonus token
    x = cmp.crossover
    assert (x.leader, x.to, x.from_concurrency, x.at) == ("kimi-k3-dspark", "kimi-k3-dflash2", 1, 8)
    text, md = format_text([cmp]), format_markdown([cmp])
    assert "target moonshotai/Kimi-K3" in text and "crossover: kimi-k3-dflash2 matches or passes kimi-k3-dspark" in text
    assert all(label in md for label in cmp.load) and "| concurrency |" in md
