"""dsparkhub.prompts.datasets: JSONL formats, line-numbered errors, dataset specs, the built-in set, tokenizing."""

from __future__ import annotations

import json

import pytest

from dsparkhub.prompts.datasets import (BUILTIN, PromptFileError, builtin_path, load_datasets, load_tokenizer,
                                      parse_dataset_specs, read_jsonl)

WORDS = ["<unk>", "<bos>", "<user>", "<assistant>", "<nothink>", "hello", "world", "what", "is", "two", "plus"]
CHAT_TEMPLATE = ("{% for m in messages %}<user> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<assistant> {% endif %}"
                 "{% if enable_thinking is defined and enable_thinking is false %}<nothink>{% endif %}")


def make_tokenizer_folder(path, *, chat_template: str | None):
    """A target folder holding only a tiny word-level tokenizer (real tokenizer.json files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(path))
    return path


def write_jsonl(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_formats(tmp_path):
    p = write_jsonl(tmp_path / "mixed.jsonl", [
        {"turns": ["hello world", "second turn ignored"], "id": 3},
        "",
        {"prompt": "what is two plus two"},
        {"prompt_token_ids": [5, 6, 7]},
    ])
    recs = read_jsonl(p)
    assert [(r.text, r.token_ids, r.line) for r in recs] == [
        ("hello world", None, 1), ("what is two plus two", None, 3), (None, [5, 6, 7], 4)]


@pytest.mark.parametrize("line, message", [
    ("{bad json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object, found list"),
    ({"text": "x"}, "line 2: no `turns`, `prompt` or `prompt_token_ids` key (found keys: text)"),
    ({"turns": []}, "line 2: `turns` must be a non-empty list"),
    ({"turns": [{"role": "user"}]}, "line 2: `turns` must be a non-empty list"),
    ({"prompt": 5}, "line 2: `prompt` must be a non-empty string"),
    ({"prompt_token_ids": [1, -2]}, "line 2: `prompt_token_ids` must be a non-empty list of non-negative"),
    ({"prompt_token_ids": [1, True]}, "line 2: `prompt_token_ids`"),
    ({"prompt_token_ids": []}, "line 2: `prompt_token_ids`"),
])
def test_bad_lines_named_with_line_number(tmp_path, line, message):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, line])
    with pytest.raises(PromptFileError) as ei:
        read_jsonl(p)
    assert message in str(ei.value) and str(p) in str(ei.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PromptFileError, match="holds no prompts"):
        read_jsonl(tmp_path / "empty.jsonl")


def test_builtin_set_shipped():
    for name in BUILTIN:
        recs = read_jsonl(builtin_path(name))
        assert len(recs) == 8 and all(r.text and len(r.text) > 20 for r in recs)
        assert len({r.text for r in recs}) == 8
    with pytest.raises(PromptFileError, match="unknown built-in prompt set 'poetry'"):
        builtin_path("poetry")


def test_parse_specs():
    assert parse_dataset_specs(None) == [("math", "builtin:math"), ("code", "builtin:code"), ("chat", "builtin:chat")]
    assert parse_dataset_specs(["gsm=/x/gsm8k.jsonl,/y/mt_bench.jsonl", "builtin:code"]) == [
        ("gsm", "/x/gsm8k.jsonl"), ("mt_bench", "/y/mt_bench.jsonl"), ("code", "builtin:code")]
    assert parse_dataset_specs("hub:org/evals:data/aime25.jsonl,he=hub:org/humaneval") == [
        ("aime25", "hub:org/evals:data/aime25.jsonl"), ("he", "hub:org/humaneval")]
    with pytest.raises(PromptFileError, match="two datasets are named 'q'"):
        parse_dataset_specs("/a/q.jsonl,/b/q.jsonl")
    with pytest.raises(PromptFileError, match="empty name"):
        parse_dataset_specs("=/a/q.jsonl")


def test_token_id_prompts_without_tokenizer(tmp_path):
    p = write_jsonl(tmp_path / "ids.jsonl", [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]},
                                             {"prompt_token_ids": [5, 6]}])
    (ds,) = load_datasets([str(p)], tmp_path, max_prompts=2)
    import hashlib

    source = f"ids.jsonl (sha256 {hashlib.sha256(p.read_bytes()).hexdigest()[:16]})"  # name + hash, no local path
    assert (ds.name, ds.source, ds.prompts) == ("ids", source, [[1, 2, 3], [4]])
    with pytest.raises(PromptFileError, match="max_prompts must be at least 1"):
        load_datasets([str(p)], tmp_path, max_prompts=0)


def test_text_prompt_without_tokenizer_is_refused(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"prompt_token_ids": [1]}, {"prompt": "hello"}])
    with pytest.raises(PromptFileError) as ei:
        load_datasets([str(p)], tmp_path)
    assert "line 2 is a text prompt but the target has no tokenizer" in str(ei.value) and str(p) in str(ei.value)


def test_chat_template_applied(tmp_path):
    target = make_tokenizer_folder(tmp_path / "target", chat_template=CHAT_TEMPLATE)
    p = write_jsonl(tmp_path / "q.jsonl", [{"turns": ["hello world", "plus"]}, {"prompt_token_ids": [9, 9]}])
    (ds,) = load_datasets([f"qa={p}"], target)
    # <user> hello world <assistant> <nothink>: template applied, enable_thinking=False passed, no extra BOS
    assert ds.name == "qa" and ds.prompts == [[2, 5, 6, 3, 4], [9, 9]]
    assert ds.texts == ["hello world", None]


def test_no_chat_template_plain_encoding(tmp_path):
    target = make_tokenizer_folder(tmp_path / "target", chat_template=None)
    assert load_tokenizer(target).chat_template is None
    p = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "what is two plus two"}])
    (ds,) = load_datasets([str(p)], target)
    assert ds.prompts == [[7, 8, 9, 10, 9]]


def test_builtin_tokenized_with_target(tmp_path):
    target = make_tokenizer_folder(tmp_path / "target", chat_template=CHAT_TEMPLATE)
    data = load_datasets(None, target, max_prompts=3)
    assert [d.name for d in data] == ["math", "code", "chat"]
    assert all(len(d.prompts) == 3 and d.prompts[0][0] == 2 and d.prompts[0][-2:] == [3, 4] for d in data)
    assert data[0].source == "builtin:math"


def test_hub_spec_offline_error():
    with pytest.raises(PromptFileError) as ei:
        load_datasets(["hub:someone/evals:gsm8k.jsonl"], None)
    msg = str(ei.value)
    assert "hub:someone/evals:gsm8k.jsonl" in msg and "cannot reach the Hub" in msg and "pass its path" in msg
    with pytest.raises(PromptFileError, match="cannot reach the Hub"):
        load_datasets(["hub:someone/evals"], None)
    with pytest.raises(PromptFileError, match="expected hub:owner/name"):
        load_datasets(["hub:noslash"], None)


def test_hub_target_tokenizer_offline_error(tmp_path):
    p = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "hello"}])
    with pytest.raises(PromptFileError) as ei:
        load_datasets([str(p)], "someone/not-cached-model")
    assert "cannot load the target's tokenizer from someone/not-cached-model" in str(ei.value)
    assert "prompt_token_ids" in str(ei.value)
    # a served model name (no owner/) has no tokenizer here: text prompts are refused, token ids work
    assert load_tokenizer("my-served-model") is None


def test_a_file_that_is_not_utf8_names_the_line(tmp_path):
    from dsparkhub.prompts.datasets import PromptFileError, read_jsonl

    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\xff\xfe{"prompt": "x"}\n')
    with pytest.raises(PromptFileError, match="line 2: not UTF-8"):
        read_jsonl(path)


def test_a_byte_order_mark_is_accepted(tmp_path):
    from dsparkhub.prompts.datasets import read_jsonl

    path = tmp_path / "bom.jsonl"
    path.write_bytes("\ufeff".encode() + b'{"prompt": "a"}\n')
    assert len(read_jsonl(path)) == 1


def test_hub_dataset_unreachable_fails_fast_and_a_cached_file_needs_no_network(monkeypatch):
    """Online mode with an endpoint that does not answer (a closed local port): one probe, no retries."""
    import time
    from pathlib import Path

    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    calls = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda *a, **k: calls.append(a) or [])
    start = time.monotonic()
    with pytest.raises(PromptFileError, match="did not answer") as err:
        load_datasets(["hub:someone/evals"], None)
    assert time.monotonic() - start < 10 and calls == [] and "pass its path" in err.value.hint
    # a file downloaded before is read from the HF cache, no request made
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(constants.HF_HUB_CACHE) / "datasets--someone--evals"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "ids.jsonl").write_text('{"prompt_token_ids": [4, 5]}\n')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (ds,) = load_datasets(["hub:someone/evals:ids.jsonl"], None)
    assert ds.prompts == [[4, 5]] and ds.source == "hub:someone/evals:ids.jsonl"
