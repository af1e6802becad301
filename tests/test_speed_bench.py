"""dsparkhub.prompts.speed_bench: SPEED-Bench records (the published `turns` columns and chat-list `messages`),
one dataset per category, line-numbered errors, and per-category rows in a verify results file."""

from __future__ import annotations

import json

import pytest

from dsparkhub.verify import runner
from dsparkhub.verify.settings import VerifySettings
from dsparkhub.prompts.datasets import PromptFileError, load_datasets, parse_dataset_specs
from dsparkhub.prompts.speed_bench import read_speed_bench
from test_prompts import CHAT_TEMPLATE, make_tokenizer_folder, write_jsonl
from test_verify_cli import FakeBackend, make_drafter, no_validate

# the columns of nvidia/SPEED-Bench's qualitative config (dataset card), and a chat-list export
REAL = {"question_id": "q1", "category": "math", "sub_category": "algebra", "turns": ["what is two plus two"],
        "source": "x", "src_id": "1", "difficulty": "easy", "multiturn": False}


def test_groups_by_category_in_order(tmp_path):
    p = write_jsonl(tmp_path / "sb.jsonl", [
        REAL,
        {"category": "coding", "messages": [{"role": "system", "content": "hello"},
                                            {"role": "user", "content": "world"},
                                            {"role": "assistant", "content": "is"}]},
        "",
        {**REAL, "question_id": "q2", "turns": ["hello", "a second turn is not measured"]},
    ])
    groups = read_speed_bench(p)
    assert [c for c, _ in groups] == ["math", "coding"]
    math, coding = groups[0][1], groups[1][1]
    assert [r.text for r in math] == ["what is two plus two", "hello"] and math[0].messages is None
    # the chat list up to and including the first user message: the system prompt is kept, the reply dropped
    assert coding[0].messages == [{"role": "system", "content": "hello"}, {"role": "user", "content": "world"}]


def test_load_datasets_one_per_category(tmp_path):
    target = make_tokenizer_folder(tmp_path / "target", chat_template=CHAT_TEMPLATE)
    p = write_jsonl(tmp_path / "sb.jsonl", [
        {"category": "qa", "turns": ["hello world"]},
        {"category": "chat", "messages": [{"role": "system", "content": "two"}, {"role": "user", "content": "plus"}]},
    ])
    assert parse_dataset_specs([f"speed-bench:{p}"]) == [("speed-bench", f"speed-bench:{p}")]
    qa, chat = load_datasets([f"speed-bench:{p}"], target)
    assert (qa.name, chat.name) == ("speed-bench/qa", "speed-bench/chat")
    assert qa.prompts == [[2, 5, 6, 3, 4]]  # <user> hello world <assistant> <nothink>
    assert chat.prompts == [[2, 9, 2, 10, 3, 4]]  # both messages through the chat template
    assert qa.source.startswith("speed-bench:sb.jsonl (sha256 ") and qa.source.endswith("category qa")
    assert str(tmp_path) not in qa.source
    named = load_datasets([f"sb=speed-bench:{p}"], target, max_prompts=1)[0]
    assert named.name == "sb/qa"


@pytest.mark.parametrize("line, message", [
    ({"turns": ["x"]}, "line 1: SPEED-Bench records need a non-empty string `category`"),
    ({"category": "math"}, "line 1: no `turns` or `messages` key"),
    ({"category": "math", "messages": [{"role": "assistant", "content": "x"}]}, "non-empty user message"),
    ({"category": "math", "turns": []}, "`turns` must be a non-empty list"),
    ("{not json", "line 1: not valid JSON"),
])
def test_errors_name_the_line(tmp_path, line, message):
    p = write_jsonl(tmp_path / "bad.jsonl", [line])
    with pytest.raises(PromptFileError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_speed_bench(p)


def test_parquet_and_missing(tmp_path):
    with pytest.raises(PromptFileError, match="is parquet") as ei:
        read_speed_bench(tmp_path / "test-00000.parquet")
    assert "to_json" in ei.value.hint
    with pytest.raises(PromptFileError, match="does not exist"):
        read_speed_bench(tmp_path / "none.jsonl")


def test_per_category_rows_in_results(tmp_path):
    draft = make_drafter(tmp_path / "draft")
    target = tmp_path / "target"
    target.mkdir()
    p = write_jsonl(tmp_path / "sb.jsonl", [
        {"category": "math", "turns": ["x"]}, {"category": "code", "turns": ["y"]}, {"category": "math", "turns": ["z"]},
    ])
    # text prompts, so a tokenizer: one that maps each prompt to fixed ids
    class Tok:
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(c) % 50 for c in text]}

    res = runner.run_verify(draft, target, VerifySettings(num_speculative_tokens=[2], datasets=[f"speed-bench:{p}"],
                                                          max_new_tokens=4),
                            backend=FakeBackend(), progress=False, validate_fn=no_validate, tokenizer=Tok())
    assert [d.name for d in res.datasets] == ["speed-bench/math", "speed-bench/code"]
    assert [d.run(2).prompts for d in res.datasets] == [2, 1]
    assert json.loads(json.dumps(res.to_dict()))["summary"][0]["num_speculative_tokens"] == 2
