"""dsparkhub.verify.results: numbers computed from RunStats, schema round trip, every malformed-file error."""

from __future__ import annotations

import json
import os
import struct

import pytest

from dsparkhub.errors import LosslessMismatchError, ResultsError
from dsparkhub.verify.results.derive import build_results, build_run_result, first_mismatch
from dsparkhub.verify.results.identity import target_fingerprint
from dsparkhub.verify.results.reading import read_results, results_from_dict
from dsparkhub.verify.results.schema import SCHEMA, EngineInfo, ModelRef, Settings, VerifyResults
from dsparkhub.verify.results.table import format_summary_table
from dsparkhub.verify.stats import RunStats

OUT_A = [[10, 11, 12, 13, 14, 15], [20, 21, 22]]             # dataset "a": 2 prompts, 9 tokens
OUT_B = [[30, 31, 32, 33], [40, 41], [50, 51, 52, 53, 54]]   # dataset "b": 3 prompts, 11 tokens


def spec(outputs, wall, drafts, acc_per_pos, draft_tokens=None):
    """A drafter run whose counters we choose; num_accepted = sum of the survival counts (vLLM semantics)."""
    n = len(acc_per_pos)
    return RunStats(outputs=[list(o) for o in outputs], wall_s=wall, num_drafts=drafts,
                    num_draft_tokens=drafts * n if draft_tokens is None else draft_tokens,
                    num_accepted_tokens=sum(acc_per_pos), accepted_per_pos=list(acc_per_pos))


def make_results(temperature=0.0, mismatch=False, date="2026-11-30T21:00:00+00:00") -> VerifyResults:
    b_spec3 = [list(o) for o in OUT_B]
    if mismatch:
        b_spec3[1][1] = 99
    runs = [
        ("a", "a.jsonl", RunStats(outputs=OUT_A, wall_s=3.0),
         {3: spec(OUT_A, 1.5, 4, [4, 3, 1]), 5: spec(OUT_A, 2.0, 2, [2, 2, 1, 1, 0], draft_tokens=8)}),
        ("b", "builtin:code", RunStats(outputs=OUT_B, wall_s=2.2),
         {3: spec(b_spec3, 1.1, 5, [3, 1, 0]), 5: spec(OUT_B, 1.0, 4, [4, 2, 2, 1, 1])}),
    ]
    return build_results(engine=EngineInfo("reference", "dsparkhub 0.1.0 (torch 2.13)", "cpu (1 threads)"),
                         method="dspark", target=ModelRef("/t", None), drafter=ModelRef("/d", "ab" * 32),
                         settings=Settings(temperature=temperature, max_new_tokens=6, seed=1,
                                           num_speculative_tokens=[5, 3]),
                         runs=runs, date=date)


def test_numbers_from_runstats_exact():
    r = make_results()
    assert r.schema == SCHEMA and r.settings.num_speculative_tokens == [3, 5]
    a3 = r.datasets[0].run(3)
    assert a3.tau == pytest.approx(1 + 8 / 4)
    assert a3.per_position_acceptance == pytest.approx([1.0, 0.75, 0.25])
    assert a3.draft_tokens_per_step == pytest.approx(3.0)
    assert a3.tokens_per_s == pytest.approx(9 / 1.5) and a3.baseline_tokens_per_s == pytest.approx(9 / 3.0)
    assert a3.speedup == pytest.approx((9 / 1.5) / (9 / 3.0))
    a5 = r.datasets[0].run(5)
    assert a5.tau == pytest.approx(1 + 6 / 2) and a5.draft_tokens_per_step == pytest.approx(4.0)
    assert a5.per_position_acceptance == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.0])
    b3, b5 = r.datasets[1].run(3), r.datasets[1].run(5)
    assert b3.speedup == pytest.approx((11 / 1.1) / (11 / 2.2))
    assert r.datasets[1].baseline.tokens_per_s == pytest.approx(5.0) and r.datasets[1].baseline.prompts == 3
    # summary: unweighted over datasets (dataset b has more prompts and tokens; it must not weigh more)
    s3, s5 = r.summary
    assert s3.mean_tau == pytest.approx((3.0 + (1 + 4 / 5)) / 2)
    assert s3.mean_speedup == pytest.approx((2.0 + 2.0) / 2)
    assert s5.mean_speedup == pytest.approx(((9 / 2.0) / 3.0 + (11 / 1.0) / 5.0) / 2)
    assert s5.mean_tau == pytest.approx((4.0 + (1 + 10 / 4)) / 2)
    assert s3.mean_per_position_acceptance == pytest.approx([(1.0 + 0.6) / 2, (0.75 + 0.2) / 2, (0.25 + 0) / 2])
    assert r.change.from_n == 3 and r.change.to_n == 5
    assert r.change.tau_delta == pytest.approx(s5.mean_tau - s3.mean_tau)
    assert r.change.speedup_delta == pytest.approx(s5.mean_speedup - s3.mean_speedup)
    assert r.lossless is True and all(x.lossless for x in r.summary) and b5.first_mismatch is None


def test_mismatch_recorded_and_error():
    r = make_results(mismatch=True)
    assert r.lossless is False
    b3 = r.datasets[1].run(3)
    assert b3.lossless is False and b3.first_mismatch.prompt_index == 1 and b3.first_mismatch.position == 1
    assert (b3.first_mismatch.expected, b3.first_mismatch.found) == (41, 99)
    assert r.summary[0].lossless is False and r.summary[1].lossless is True
    err = r.lossless_error()
    assert isinstance(err, LosslessMismatchError)
    assert (err.dataset, err.prompt_index, err.position, err.expected, err.found) == ("b", 1, 1, 41, 99)
    assert "prompt 1" in str(err) and "position 1" in str(err) and "41" in str(err) and "99" in str(err)
    assert make_results().lossless_error() is None


def test_temperature_skips_lossless():
    r = make_results(temperature=0.7, mismatch=True)
    assert r.lossless is None and r.datasets[1].run(3).lossless is None and r.summary[0].lossless is None


def test_first_mismatch_prefix_and_counts():
    assert first_mismatch([[1, 2, 3]], [[1, 2, 3]]) is None
    m = first_mismatch([[1, 2, 3]], [[1, 2]])
    assert (m.position, m.expected, m.found) == (2, 3, None)
    m = first_mismatch([[5], [1]], [[5], [1, 7]])
    assert (m.prompt_index, m.position, m.expected, m.found) == (1, 1, None, 7)
    with pytest.raises(ResultsError, match="2 prompts .* for 1"):
        first_mismatch([[1], [2]], [[1]])


def test_accepted_per_pos_length_checked():
    with pytest.raises(ResultsError, match="length 2 for num_speculative_tokens=3"):
        build_run_result(3, spec(OUT_A, 1.0, 1, [1, 1]), RunStats(outputs=OUT_A, wall_s=1.0), check_lossless=True)


def test_zero_baseline_time_gives_no_speedup():
    r = build_run_result(3, spec(OUT_A, 1.0, 1, [1, 0, 0]), RunStats(outputs=OUT_A, wall_s=0.0), check_lossless=True)
    assert r.speedup is None and r.baseline_tokens_per_s == 0.0


def test_round_trip(tmp_path):
    r = make_results(mismatch=True)
    d = r.to_dict()
    assert list(d)[0] == "schema" and d["schema"] == SCHEMA
    assert results_from_dict(json.loads(json.dumps(d))) == r
    path = r.save(tmp_path / "sub" / "results.json")
    assert read_results(path) == r
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp file left
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as readable as any other output, not mkstemp's 0600
    r2 = make_results(date="2027-01-01T00:00:00+00:00")
    r2.save(path)
    assert read_results(path).date == "2027-01-01T00:00:00+00:00"


def _write(tmp_path, data) -> str:
    p = tmp_path / "r.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="dsparkhub.verify.results/4"), "unknown results schema 'dsparkhub.verify.results/4'"),
    (lambda d: d.pop("schema"), "unknown results schema None"),
    (lambda d: d.pop("method"), "key `method`: expected a string, found missing"),
    (lambda d: d.update(method="medusa"), "key `method` is 'medusa'"),
    (lambda d: d["engine"].update(backend="sglang"), "key `engine.backend` is 'sglang'"),
    (lambda d: d["engine"].pop("device"), "key `engine.device`: expected a string, found missing"),
    (lambda d: d["drafter"].update(fingerprint=5), "key `drafter.fingerprint`"),
    (lambda d: d["settings"].update(max_new_tokens="6"), "key `settings.max_new_tokens`: expected an integer"),
    (lambda d: d["settings"].update(num_speculative_tokens=[3, "5"]),
     "key `settings.num_speculative_tokens[1]`: expected an integer"),
    (lambda d: d["datasets"][1]["runs"][0].pop("tau"),
     "key `datasets[1].runs[0].tau`: expected a number or null, found missing"),
    (lambda d: d["datasets"][0]["runs"][1].update(lossless="yes"), "key `datasets[0].runs[1].lossless`"),
    (lambda d: d["datasets"][0]["baselines"][0].update(wall_s=True),
     "key `datasets[0].baselines[0].wall_s`: expected a num"),
    (lambda d: d["settings"].update(concurrency=[1, "8"]), "key `settings.concurrency[1]`: expected an integer"),
    (lambda d: d["datasets"][0]["runs"][0].update(speed=1.0),
     "key `datasets[0].runs[0].speed`: unexpected key"),
    (lambda d: d["settings"].update(order="random"), "key `settings.order` is 'random'"),
    (lambda d: d["datasets"][1]["runs"][0]["first_mismatch"].pop("found"),
     "key `datasets[1].runs[0].first_mismatch.found`"),
    (lambda d: d["summary"][0].update(mean_per_position_acceptance=None), "key `summary[0].mean_per_position"),
    (lambda d: d.update(change=[]), "key `change`"),
    (lambda d: d["datasets"].__setitem__(0, 7), "key `datasets[0]`: expected a JSON object, found int 7"),
])
def test_malformed_fields(tmp_path, mutate, message):
    d = make_results(mismatch=True).to_dict()
    mutate(d)
    path = _write(tmp_path, d)
    with pytest.raises(ResultsError) as ei:
        read_results(path)
    assert message in str(ei.value) and path in str(ei.value)


def test_malformed_files(tmp_path):
    with pytest.raises(ResultsError, match=r"not valid JSON .* line 1"):
        read_results(_write(tmp_path, "{not json"))
    with pytest.raises(ResultsError, match="<root>.*expected a JSON object, found list"):
        read_results(_write(tmp_path, "[1, 2]"))
    with pytest.raises(FileNotFoundError):
        read_results(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ResultsError, match="UTF-8"):
        read_results(tmp_path / "bin.json")


def test_unknown_method_refused_when_building():
    with pytest.raises(ResultsError, match="unknown method 'medusa'"):
        build_results(engine=EngineInfo("reference", "v", "cpu"), method="medusa", target=ModelRef("t", None),
                      drafter=ModelRef("d", None), settings=Settings(0.0, 4, 0, [3]), runs=[])


def test_summary_table_text():
    text = format_summary_table(make_results(mismatch=True))
    lines = text.splitlines()
    assert lines[0] == "speedups below are vs no speculation (same prompts, same concurrency)"
    assert lines[1].split()[0] == "dataset" and "n=3" in lines[1] and "n=5" in lines[1]
    a_line = next(line for line in lines if line.startswith("a "))
    assert "3.00 / 2.00x / ok" in a_line and "4.00 / 1.50x / ok" in a_line
    b_line = next(line for line in lines if line.startswith("b "))
    # 2.00x at τ 1.80 is impossible at batch 1 (latency law): marked with ? and explained below the table
    assert "1.80 / 2.00x? / FAIL" in b_line
    assert any(line.startswith("? b n=3 concurrency 1: batch-1 speedup 2.00x exceeds τ 1.80") for line in lines)
    mean = next(line for line in lines if line.startswith("mean (unweighted)"))
    assert "FAIL" in mean and "2.00x?" in mean


def _safetensors(path, header: dict, payload: bytes):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + payload)


def test_target_fingerprint(tmp_path):
    assert target_fingerprint(tmp_path / "nope") is None
    assert target_fingerprint("Qwen/Qwen3-8B") is None
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    _safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                 b"\0" * 8)
    f1 = target_fingerprint(tmp_path)
    assert len(f1) == 64
    _safetensors(tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                 b"\1" * 8)
    assert target_fingerprint(tmp_path) == f1  # headers only: weight bytes are not read
    (tmp_path / "config.json").write_text('{"hidden_size": 65}')
    assert target_fingerprint(tmp_path) != f1
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ResultsError, match="declares 1000 bytes"):
        target_fingerprint(tmp_path)


DATA = os.path.join(os.path.dirname(__file__), "data")


def test_reads_schema_1_file():
    """A file written by dsparkhub's /1 writer (tests/data/results_v1.json) loads, upgraded to /2 in memory."""
    r = read_results(os.path.join(DATA, "results_v1.json"))
    assert r.schema == SCHEMA and r.settings.concurrency == [1] and r.settings.repeats == 1
    ds_a = r.datasets[0]
    assert ds_a.baseline.tokens_per_s == pytest.approx(3.0) and ds_a.baseline.concurrency == 1
    a3 = ds_a.run(3)
    assert a3.tau == pytest.approx(3.0) and a3.concurrency == 1
    # derived on reading: conditional acceptance [4/4, 3/4, 1/3], the latency-law check, the load rows
    assert a3.conditional_acceptance == pytest.approx([1.0, 0.75, 1 / 3])
    assert a3.unreliable == []
    b3 = r.datasets[1].run(3)
    assert b3.speedup == pytest.approx(2.0) and b3.tau == pytest.approx(1.8) and "exceeds τ 1.80" in b3.unreliable[0]
    # n=3's mean includes the impossible figure: n=5 (2.2x... reliable) is the best n
    assert [(x.concurrency, x.best_n) for x in r.load] == [(1, 5)]
    again = results_from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r and again.to_dict()["schema"] == SCHEMA


def _rep(outputs, wall, **kw):
    return RunStats(outputs=[list(o) for o in outputs], wall_s=wall, **kw)


def test_repeats_medians_spread_and_unreliable():
    """Three interleaved repeats: medians of tokens/s, speedup = median of per-repeat ratios, spread flags."""
    base = [_rep(OUT_A, 3.0), _rep(OUT_A, 3.0), _rep(OUT_A, 6.0)]       # 3.0, 3.0, 1.5 tok/s
    steady = [spec(OUT_A, 1.5, 4, [4, 3, 1]) for _ in range(3)]           # 6 tok/s each: ratios 2, 2, 4
    r = build_run_result(3, steady, base, check_lossless=True, settings=Settings(0.0, 6, 0, [3]))
    assert r.tokens_per_s_repeats == pytest.approx([6.0, 6.0, 6.0]) and r.baseline_tokens_per_s == pytest.approx(3.0)
    assert r.speedup_repeats == pytest.approx([2.0, 2.0, 4.0]) and r.speedup == pytest.approx(2.0)
    assert r.speedup_spread == pytest.approx((4.0 - 2.0) / 2.0)
    assert len(r.unreliable) == 1 and "spread by 100%" in r.unreliable[0]
    calm = build_run_result(3, steady, base[:2] + [_rep(OUT_A, 3.1)], check_lossless=True,
                            settings=Settings(0.0, 6, 0, [3]))
    assert calm.unreliable == [] and calm.speedup_spread == pytest.approx((6.0 / (9 / 3.1) - 2.0) / 2.0)
    with pytest.raises(ResultsError, match="2 drafter repeats but 3 baseline repeats"):
        build_run_result(3, steady[:2], base, check_lossless=True)
    # a later repeat that differs breaks losslessness even when the first one matched
    bad = steady[:2] + [spec([OUT_A[0], [20, 21, 99]], 1.5, 4, [4, 3, 1])]
    assert build_run_result(3, bad, base, check_lossless=True).first_mismatch.found == 99


def test_concurrency_axis_best_n_and_where_it_stops_paying():
    def ds(name, c_speed):
        base = {c: [_rep(OUT_A, 1.0, ttft_s=[0.1, 0.1], latency_s=[0.6, 0.3])] for c in c_speed}
        by = {(n, c): [spec(OUT_A, 1.0 / s, 4, [4, 3, 1] if n == 3 else [4, 3, 1, 1, 0])]
              for c, per_n in c_speed.items() for n, s in per_n.items()}
        return name, name + ".jsonl", base, by

    speeds = {1: {3: 1.8, 5: 1.5}, 8: {3: 1.2, 5: 1.4}, 32: {3: 0.8, 5: 0.7}}
    r = build_results(engine=EngineInfo("reference", "v", "cpu"), method="dspark", target=ModelRef("t", None),
                      drafter=ModelRef("d", None),
                      settings=Settings(0.0, 6, 0, [5, 3], concurrency=[32, 1, 8], repeats=1),
                      runs=[ds("a", speeds), ds("b", speeds)])
    assert r.settings.concurrency == [1, 8, 32] and len(r.summary) == 6
    assert [(x.concurrency, x.best_n, x.pays) for x in r.load] == [(1, 3, True), (8, 5, True), (32, 3, False)]
    assert r.stops_paying_at == 32
    assert r.datasets[0].run(5, 8).speedup == pytest.approx(1.4) and r.datasets[0].run(5).concurrency == 1
    lat = r.datasets[0].baseline_at(8).latency
    # per-user: 6 tokens / 0.6 s and 3 / 0.3 s; TPOT: (0.6 - 0.1) / 5 and (0.3 - 0.1) / 2 seconds
    assert lat.per_user_tokens_per_s_mean == pytest.approx(10.0) and lat.ttft_p50_ms == pytest.approx(100.0)
    assert lat.tpot_p50_ms == pytest.approx(100.0) and lat.tpot_p99_ms == pytest.approx(100.0)
    text = format_summary_table(r)
    assert "dataset @ concurrency 8" in text and "concurrency 8: best n = 5" in text
    assert "the drafter does not pay from concurrency 32 on" in text
    assert results_from_dict(json.loads(json.dumps(r.to_dict()))) == r
