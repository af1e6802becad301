"""writer: the data layout of new safetensors files, coalesced kernel copies, write-behind."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsparkhub.io import writer
from dsparkhub.io.header import read_header
from dsparkhub.errors import CheckpointFormatError
from dsparkhub.io.writer import SourceBytes, write_safetensors


def _sources(path):
    infos, _ = read_header(path)
    return {n: SourceBytes(str(path), i.start, i.nbytes, i.dtype, i.shape) for n, i in infos.items()}


def _data_order(path):
    infos, _ = read_header(path)
    return [n for n, _ in sorted(infos.items(), key=lambda kv: kv[1].start)]


def _copy_calls(monkeypatch):
    calls = []
    real = writer._copy_range

    def spy(src, src_fd, dst_fd, what, dst):
        calls.append((src.start, src.nbytes, dst, what))
        return real(src, src_fd, dst_fd, what, dst)

    monkeypatch.setattr(writer, "_copy_range", spy)
    return calls


def test_renamed_copies_keep_source_order_and_copy_as_one_range(tmp_path, monkeypatch):
    src = tmp_path / "src.safetensors"
    tensors = {"a.weight": torch.randn(64, 32).to(torch.bfloat16), "b.norm": torch.randn(32),
               "c.bias": torch.randn(7).to(torch.bfloat16), "d.weight": torch.randn(16, 8)}
    save_file(tensors, str(src))
    calls = _copy_calls(monkeypatch)
    out = tmp_path / "out.safetensors"
    s = _sources(src)
    write_safetensors(out, [(f"mtp.0.{n}", s[n]) for n in reversed(list(s))], {"format": "pt"})
    assert len(calls) == 1, calls  # one run covers every tensor's data
    assert calls[0][1] == sum(x.nbytes for x in s.values())
    assert _data_order(out) == [f"mtp.0.{n}" for n in _data_order(src)]
    with safe_open(str(out), "pt") as f:
        for n, t in tensors.items():
            assert torch.equal(f.get_tensor(f"mtp.0.{n}").view(torch.uint8), t.view(torch.uint8)), n


def test_source_order_that_would_misalign_falls_back_to_element_size_order(tmp_path):
    # a file whose 3-byte U8 tensor lies first: after dropping the 1-byte one, source order would put the F32
    # tensor at an odd offset, so the writer lays the data out by decreasing element size instead
    src = tmp_path / "src.safetensors"
    body = {"u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
            "pad": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]},
            "f": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    raw = json.dumps(body).encode()
    raw += b" " * (-len(raw) % 8)
    src.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes([1, 2, 3, 9]) + struct.pack("<2f", 1.5, -2.0))
    s = _sources(src)
    out = tmp_path / "out.safetensors"
    write_safetensors(out, [("u", s["u"]), ("f", s["f"])], {})
    assert _data_order(out) == ["f", "u"]
    infos, _ = read_header(out)
    assert all((i.start - infos["f"].start) % (4 if i.dtype == "F32" else 1) == 0 for i in infos.values())
    with safe_open(str(out), "pt") as f:
        assert f.get_tensor("f").tolist() == [1.5, -2.0] and f.get_tensor("u").tolist() == [1, 2, 3]


def test_computed_tensors_follow_the_copies(tmp_path):
    src = tmp_path / "src.safetensors"
    save_file({"w": torch.randn(8, 4)}, str(src))
    out = tmp_path / "out.safetensors"
    extra = torch.arange(5, dtype=torch.int64)
    write_safetensors(out, [("t2d", extra), ("w", _sources(src)["w"])], {})
    assert _data_order(out) == ["w", "t2d"]
    with safe_open(str(out), "pt") as f:
        assert torch.equal(f.get_tensor("t2d"), extra)


def test_large_copies_step_and_hand_each_step_to_write_back(tmp_path, monkeypatch):
    src = tmp_path / "src.safetensors"
    save_file({"big": torch.randint(0, 255, (3 << 20,), dtype=torch.uint8)}, str(src))
    monkeypatch.setattr(writer, "COPY_STEP", 1 << 20)
    advised = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, adv: (advised.append((off, n, adv)),
                                                                      real(fd, off, n, adv))[1])
    monkeypatch.setattr(writer, "_WRITE_BEHIND_MIN", 1 << 20)
    out = tmp_path / "out.safetensors"
    write_safetensors(out, [("big", _sources(src)["big"])], {})
    behind = [a for a in advised if a[2] == os.POSIX_FADV_DONTNEED]
    assert [n for _, n, _ in behind] == [1 << 20] * 3
    with safe_open(str(out), "pt") as f, safe_open(str(src), "pt") as g:
        assert torch.equal(f.get_tensor("big"), g.get_tensor("big"))


def test_a_source_cut_short_names_the_tensors(tmp_path):
    src = tmp_path / "src.safetensors"
    save_file({"a": torch.randn(64), "b": torch.randn(64)}, str(src))
    s = _sources(src)
    os.truncate(src, src.stat().st_size - 16)
    with pytest.raises(CheckpointFormatError, match="ends before the end of tensors 'a' to 'b'"):
        write_safetensors(tmp_path / "out.safetensors", [("a", s["a"]), ("b", s["b"])], {})


@pytest.mark.parametrize("block", [4096, 3 * 4096, 1 << 20])
def test_direct_writes_give_the_same_bytes_as_the_page_cache_path(tmp_path, monkeypatch, block):
    src = tmp_path / "src.safetensors"
    save_file({"a": torch.randn(300, 7), "b": torch.randint(0, 9, (5001,), dtype=torch.uint8),
               "c": torch.randn(64, 64).to(torch.bfloat16)}, str(src))
    s = _sources(src)
    payloads = [("x.a", s["a"]), ("x.c", s["c"]), ("t2d", torch.arange(1001, dtype=torch.int64)), ("x.b", s["b"])]
    monkeypatch.setattr(writer, "DIRECT_MIN", 1 << 62)
    write_safetensors(tmp_path / "cached.safetensors", payloads, {"format": "pt"})
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(writer, "DIRECT_BLOCK", block)
    used = []
    real = writer._write_direct
    monkeypatch.setattr(writer, "_write_direct", lambda *a: used.append(real(*a)) or used[-1])
    write_safetensors(tmp_path / "direct.safetensors", payloads, {"format": "pt"})
    if used != [True]:
        pytest.skip(f"this filesystem refuses O_DIRECT ({tmp_path})")
    assert (tmp_path / "direct.safetensors").read_bytes() == (tmp_path / "cached.safetensors").read_bytes()


def test_direct_path_names_a_source_cut_short(tmp_path, monkeypatch):
    src = tmp_path / "src.safetensors"
    save_file({"a": torch.randn(4096), "b": torch.randn(4096)}, str(src))
    s = _sources(src)
    os.truncate(src, src.stat().st_size - 100)
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(writer, "DIRECT_BLOCK", 8192)
    with pytest.raises(CheckpointFormatError, match="ends before the end of tensor"):
        write_safetensors(tmp_path / "out.safetensors", [("a", s["a"]), ("b", s["b"])], {})


def test_pieces_that_do_not_tile_the_file_use_the_page_cache_path(tmp_path, monkeypatch):
    src = tmp_path / "src.safetensors"
    save_file({"a": torch.randn(64)}, str(src))
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    s = _sources(src)
    out = tmp_path / "gap.bin"
    assert writer._write_direct(out, b"HEAD", [(s["a"], 4096, "a")], []) is False  # a hole at 4..4096
    writer.write_file(out, b"HEAD", [(s["a"], 4096, "a")])
    data = out.read_bytes()
    assert data[:4] == b"HEAD" and len(data) == 4096 + s["a"].nbytes


def test_a_write_refused_midway_starts_the_file_again_through_the_page_cache(tmp_path, monkeypatch):
    import errno

    src = tmp_path / "src.safetensors"
    save_file({"a": torch.randn(3000), "b": torch.randn(5000)}, str(src))
    s = _sources(src)
    payloads = [("a", s["a"]), ("b", s["b"])]
    write_safetensors(tmp_path / "ref.safetensors", payloads, {})
    monkeypatch.setattr(writer, "DIRECT_MIN", 0)
    monkeypatch.setattr(writer, "DIRECT_BLOCK", 8192)
    calls = []
    real = writer._write_all

    def flaky(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:  # the second O_DIRECT block
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(writer, "_write_all", flaky)
    write_safetensors(tmp_path / "out.safetensors", payloads, {})
    assert len(calls) > 2
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_plan_shards_matches_the_greedy_rule_when_no_tensor_exceeds_the_cap():
    """``plan_shards`` (huggingface_hub's splitter on sizes) groups exactly like the size-capped greedy loop it
    replaced whenever every tensor fits the cap (always the case with the default caps)."""
    import random

    from dsparkhub.io.sharding import plan_shards

    def greedy(items, cap):
        groups, size = [[]], 0
        for name, n in items:
            if groups[-1] and size + n > cap:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += n
        return groups

    rng = random.Random(0)
    for _ in range(2000):
        items = [(f"t{i}", rng.choice([0, 1, 7, 100, rng.randint(0, 3000)])) for i in range(rng.randint(0, 12))]
        cap = max((n for _, n in items), default=0) + rng.randint(0, 500)
        assert plan_shards(items, cap) == greedy(items, cap)
    # a tensor over the cap gets its own shard, before the shard being filled (huggingface_hub's order)
    assert plan_shards([("a", 1), ("big", 10), ("c", 1)], 5) == [["big"], ["a", "c"]]
    assert plan_shards([], 5) == [[]]
