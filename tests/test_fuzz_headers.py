"""Fuzz every parser of a stranger's checkpoint: safetensors headers, index files, configs (CI-sized slice).

The nightly size is ``python scripts/fuzz_headers.py --examples 10000``. Each ``@example`` below is a case the fuzzer
found that crashed the parser before its fix (kept as a regression test).
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings

from dsparkhub.io.header import read_header
from dsparkhub.errors import CheckpointFormatError
from dsparkhub.testing import fuzz

torch.set_num_threads(1)

CI = settings(max_examples=150, deadline=2000, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return fuzz.make_base(tmp_path_factory.mktemp("fuzz_base"))


@CI
@given(case=fuzz.safetensors_files())
@example(case=(struct.pack("<Q", 58) + b'{"a":{"dtype":[],"shape":[],"data_offsets":[0,0]}}       ', ["regression"]))
@example(case=(struct.pack("<Q", 5006) + b'{"a":' + b"1" * 5000 + b"}", ["regression"]))
def test_safetensors_file_fuzz(case, work):
    blob, _ = case
    fuzz.check_file(blob, work)


@CI
@given(raw=fuzz.header_json())
@example(raw=b'{"a":{"dtype":{},"shape":[1],"data_offsets":[0,1]}}')
@example(raw=b'{"__metadata__": []}')
@example(raw=b'{"__metadata__": 0}')
@example(raw=b'{"a": {"dtype": "U8", "shape": [], "data_offsets": [0, 1], "shape": [1]}}')
def test_raw_header_fuzz(raw):
    fuzz.check_header_bytes(raw, 64)
    fuzz.check_header_bytes(raw, None)


@settings(CI, max_examples=120, deadline=5000)
@given(ops=fuzz.folder_mutations())
@example(ops=[("config_key", "num_hidden_layers", 10**12)])
@example(ops=[("config_key", "num_attention_heads", 0)])
@example(ops=[("config_key", "num_attention_heads", "x")])
@example(ops=[("config_key", "architectures", 3)])
@example(ops=[("config_key", "architectures", {"a": 1})])
@example(ops=[("config_key", "target_layer_ids", [0, 10**30])])
@example(ops=[("config_file", b'{"x": ' + b"[" * 995 + b"0" + b"]" * 995 + b"}")])
@example(ops=[("index", {"fc.weight": "model.safetensors\x00.txt"}, None)])
@example(ops=[("index", {"fc.weight": "a" * 300 + ".safetensors"}, None)])
@example(ops=[("target_config_key", "text_config", [])])
def test_checkpoint_folder_fuzz(ops, base, work):
    fuzz.check_folder(base, ops, work / "folder")


def test_pristine_base_is_accepted(base, work):
    """The fuzz base itself must parse and validate clean, or every folder case would test only the error path."""
    assert fuzz.check_folder(base, [], work / "pristine") == "ok"


@pytest.mark.parametrize("length", [2**64 - 1, 2**63, 2**40, 100_000_001, 99_999_999, 1 << 20])
def test_absurd_header_length_is_never_allocated(tmp_path, length):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b'{"__metadata__": {}}')
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError, match="header length field says") as info:
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, f"reading a {path.stat().st_size}-byte file with length field {length} peaked at {peak}"
    assert str(path) in str(info.value)


@pytest.mark.parametrize("raw, words", [
    (b'{"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}', ["unknown dtype", "'X9'", "tensor 'a'"]),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', ["span 4 bytes", "needs 8"]),
    (b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, '
     b'"b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}', ["overlap"]),
    (b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [60, 64]}}', ["truncated"]),
    (b'{"a": 1, "a": 2}', ["more than once", "'a'"]),
    (b'{"__metadata__": {"format": 1}}', ["__metadata__"]),
    (b'{"__metadata__": ["pt"]}', ["__metadata__", "list"]),
    (b"[" * 100_000, ["not valid JSON"]),
    (b'{"a": ' + b"1" * 5000 + b"}", ["not valid JSON"]),
    (b'{"a": \xff}', ["UTF-8"]),
    (b'{"a": {"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]}}', ["unknown dtype"]),
])
def test_messages_name_the_problem(raw, words):
    from dsparkhub.io.header import parse_header_bytes

    with pytest.raises(CheckpointFormatError) as info:
        parse_header_bytes(raw, file="shard.safetensors", data_size=10)
    text = str(info.value)
    assert "shard.safetensors" in text
    for w in words:
        assert w in text, (w, text)
