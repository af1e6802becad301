"""dsparkhub's header checks refuse exactly what the safetensors library refuses, on files made by
``safetensors.torch.save_file`` and then tampered with (safetensors/src/tensor.rs ``Metadata::validate``: tensors,
sorted by offset, tile the data section with no gap, overlap or trailing byte); and the fast (msgspec) decode gives
what the strict stdlib parse gives, duplicate keys included."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from dsparkhub.io.checkpoint import read_index
from dsparkhub.io.header import _decode_header, _decode_header_strict, parse_header_bytes, read_header
from dsparkhub.cli import main
from dsparkhub.errors import CheckpointFormatError


def _split(path):
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _write(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _saved(path):
    # save_file orders by dtype alignment then name: b (F32) at 0..16, a (BF16) at 16..24, e (empty) at 24..24
    save_file({"a": torch.ones(4, dtype=torch.bfloat16), "b": torch.arange(4, dtype=torch.float32),
               "e": torch.zeros(0, dtype=torch.bfloat16)}, str(path), metadata={"format": "pt"})
    return path


def _gap(header, data):  # a moves 4 bytes on, 4 filler bytes in front of it: the file stays fully covered
    header["a"]["data_offsets"] = [20, 28]
    header["e"]["data_offsets"] = [28, 28]
    return header, data[:16] + b"\0" * 4 + data[16:]


def _trailing(header, data):
    return header, data + b"\0" * 8


def _overlap(header, data):
    header["a"]["data_offsets"] = [12, 20]
    header["e"]["data_offsets"] = [20, 20]
    return header, data[:20]


def _leading_gap(header, data):
    for k in ("a", "b", "e"):
        header[k]["data_offsets"] = [o + 8 for o in header[k]["data_offsets"]]
    return header, b"\0" * 8 + data


def _short(header, data):  # file cut inside the last tensor
    return header, data[:20]


def _untouched(header, data):
    return header, data


def _reordered(header, data):  # entries listed in another order than their offsets: allowed by both
    return {k: header[k] for k in ("e", "a", "__metadata__", "b")}, data


CASES = {"untouched": _untouched, "reordered": _reordered, "gap": _gap, "trailing": _trailing,
         "overlap": _overlap, "leading_gap": _leading_gap, "short": _short}


def _safetensors_refuses(path) -> str | None:
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception as exc:  # noqa: BLE001 - any refusal counts; its text is compared below
        return str(exc)
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_refuses_exactly_what_safetensors_refuses(case, tmp_path):
    header, data = _split(_saved(tmp_path / "orig.safetensors"))
    path = tmp_path / "model.safetensors"
    _write(path, *CASES[case](header, data))
    upstream = _safetensors_refuses(path)
    try:
        read_header(path)
        ours = None
    except CheckpointFormatError as exc:
        ours = str(exc)
    assert (ours is None) == (upstream is None), (case, ours, upstream)
    assert (upstream is None) == (case in ("untouched", "reordered"))


def _header_error(tmp_path, mutate) -> CheckpointFormatError:
    """The error ``read_header`` raises for the saved file after ``mutate(header, data)`` (``_gap``, ...)."""
    header, data = _split(_saved(tmp_path / "orig.safetensors"))
    path = tmp_path / "model.safetensors"
    _write(path, *mutate(header, data))
    with pytest.raises(CheckpointFormatError) as err:
        read_header(path)
    return err.value


def test_gap_error_names_file_tensor_and_offsets(tmp_path):
    err = _header_error(tmp_path, _gap)
    msg = str(err)
    assert "model.safetensors" in msg and "'a'" in msg and "offset 20, expected 16" in msg and "'b' ends" in msg
    assert "InvalidOffset" in msg and "tensor.rs" in err.hint


def test_trailing_error_names_file_last_tensor_and_offsets(tmp_path):
    msg = str(_header_error(tmp_path, _trailing))
    assert "model.safetensors" in msg and "'e'" in msg and "offset 24, expected 32" in msg
    assert "8 trailing bytes" in msg and "MetadataIncompleteBuffer" in msg


def test_remote_headers_still_refuse_gaps():
    """Headers fetched over HTTP have no known file size: gaps are refused, trailing bytes cannot be seen."""
    entry = {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}
    with pytest.raises(CheckpointFormatError, match="expected 0"):
        parse_header_bytes(json.dumps({"x": entry}).encode(), file="r.safetensors", data_size=None)


def _drafter_with_trailing_bytes(tmp_path):
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(tmp_path / "target")
    run = make_deepspec_drafter(tmp_path / "run", target)
    shard = run / "step_100" / "model.safetensors"
    with open(shard, "ab") as f:
        f.write(b"\0" * 16)
    assert _safetensors_refuses(shard)
    return run, target


def test_validate_cli_refuses_a_file_safetensors_refuses(tmp_path):
    run, target = _drafter_with_trailing_bytes(tmp_path)
    res = CliRunner().invoke(main, ["validate", str(run), "--target", str(target)])
    assert res.exit_code == 1, res.output
    assert "16 trailing bytes" in res.output and "model.safetensors" in res.output


def test_push_refuses_a_file_safetensors_refuses(tmp_path):
    from dsparkhub.hub.push import push

    run, target = _drafter_with_trailing_bytes(tmp_path)
    folder = tmp_path / "upload"
    shutil.copytree(run / "step_100", folder)
    with pytest.raises(CheckpointFormatError, match="trailing bytes"):
        push(folder, "alice/broken", endpoint="http://127.0.0.1:9", target=str(target), token="hf_" + "x" * 34)


# ---- the fast decode is the strict decode ----------------------------------------------------------------------

E = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
HEADERS = [
    '{"a":' + E + '}',
    '{"a":' + E + ',"a":' + E + '}',  # duplicate tensor
    '{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}',  # duplicate field
    '{"__metadata__":{"k":"v","k":"w"},"a":' + E + '}',  # duplicate metadata key
    '{"__metadata__":{"url":"http://x:1"},"a:b":' + E + '}',  # colons inside strings, no duplicate
    '{"__metadata__":{"url":"http://x:1"},"a:b":' + E + ',"a:b":' + E + '}',  # same, duplicated
    '{"a\\u003ab":' + E + ',"a:b":' + E + '}',  # an escaped colon and its plain twin: one key, twice
    '{"a\\u003ab":' + E + ',"c":' + E + '}',
    '{"\\u0061":' + E + ',"a":' + E + '}',  # the same key spelled two ways
    '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":1,"y":2}}}',  # duplicate deep inside
    '{"a":' + E + ', "b" : {"dtype" : "U8", "shape" : [0], "data_offsets" : [1, 1]}}',  # whitespace
    '{"a":NaN}', '{"a":1e400}', '{"\\ud800":' + E + '}', '[]', '{"a":[' + '[' * 50 + ']' * 50 + ']}',
]


@pytest.mark.parametrize("text", HEADERS)
def test_fast_decode_equals_strict_decode(text):
    raw = text.encode()
    try:
        strict = ("ok", _decode_header_strict(raw, "f.safetensors"))
    except CheckpointFormatError as exc:
        strict = ("error", str(exc))
    try:
        fast = ("ok", _decode_header(raw, "f.safetensors"))
    except CheckpointFormatError as exc:
        fast = ("error", str(exc))
    assert repr(fast) == repr(strict)  # repr: NaN != NaN


@pytest.mark.parametrize("indent,sort_keys", [(2, True), (None, False)])
def test_index_in_both_formats_reads_the_same(tmp_path, indent, sort_keys):
    index = {"metadata": {"total_size": 10}, "weight_map": {"b.weight": "m-2.safetensors", "a": "m-1.safetensors"}}
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index, indent=indent, sort_keys=sort_keys))
    assert read_index(path) == index


@pytest.mark.parametrize("weight_map", ['{"a": 1}', '[]', '{"a": {"b": "c"}}', 'null'])
def test_index_with_a_bad_weight_map_is_refused_as_before(tmp_path, weight_map):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text('{"metadata": {}, "weight_map": ' + weight_map + '}')
    with pytest.raises(CheckpointFormatError, match="must map tensor names to shard file names"):
        read_index(path)


def test_index_lone_surrogate_still_accepted_like_the_stdlib(tmp_path):
    """msgspec refuses lone surrogates; the stdlib (the reference) takes them: the fallback keeps that."""
    path = tmp_path / "model.safetensors.index.json"
    path.write_text('{"weight_map": {"\\ud800": "m.safetensors"}}')
    assert list(read_index(path)["weight_map"]) == ["\ud800"]


def test_read_index_with_and_without_the_shard_listing_fast_path(tmp_path):
    """Values that are all ``*.safetensors`` files of the folder take the Literal-typed decode; any other value
    (a missing shard, a subfolder path, a non-string) the plain one: the result is json.load's either way."""
    import json

    (tmp_path / "a.safetensors").write_bytes(b"")
    (tmp_path / "b.safetensors").write_bytes(b"")
    for weight_map in ({"x": "a.safetensors", "y": "b.safetensors", "z": "a.safetensors"},
                       {"x": "a.safetensors", "y": "missing.safetensors"}, {"x": "sub/a.safetensors"}):
        path = tmp_path / "model.safetensors.index.json"
        path.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}, indent=2))
        got = read_index(path)
        assert got["weight_map"] == weight_map and list(got["weight_map"]) == list(weight_map)
        assert got["metadata"] == {"total_size": 1}
    path.write_text(json.dumps({"weight_map": {"x": 1}}))
    with pytest.raises(CheckpointFormatError, match="weight_map"):
        read_index(path)
