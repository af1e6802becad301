"""Hypothesis strategies and per-case checks for fuzzing everything dsparkhub parses from a stranger's checkpoint.

Used by ``tests/test_fuzz_headers.py`` (a CI-sized slice) and ``scripts/fuzz_headers.py`` (the nightly size, with
counts). Three families of cases:

- **safetensors files** (:func:`safetensors_files`): a plausible header (real dtype codes, consistent offsets) that
  is then broken in one or more ways — truncated file, header length field larger than the file or absurdly large,
  invalid UTF-8 / JSON, unknown dtypes, shapes whose byte size disagrees with the offsets, overlapping or
  out-of-file offsets, duplicate names, ``__metadata__`` of the wrong type, deeply nested JSON, giant integers;
- **raw headers** (:func:`header_json`): arbitrary JSON (and raw bytes) fed to ``parse_header_bytes``;
- **checkpoint folders** (:func:`folder_mutations`): a real tiny DeepSpec drafter + Qwen3 target
  (``dsparkhub.testing.factories``) with its ``config.json``, ``model.safetensors`` header or an added
  ``model.safetensors.index.json`` mutated, run through ``open_checkpoint`` / ``open_draft`` / ``validate``.

The contract every check asserts: the call either succeeds with a result whose invariants hold, or raises a
:class:`dsparkhub.errors.DsparkhubError` subclass with a non-empty message. Anything else propagates (and fails the
test). Memory is bounded by checking the ``tracemalloc`` peak of each header read against the file's size.

Does not: fuzz tensor *data* (never parsed, only copied) or the Hub (``tests/test_push*.py``).
"""

from __future__ import annotations

import json
import shutil
import signal
import struct
import threading
import tracemalloc
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from hypothesis import strategies as st

from dsparkhub.io.checkpoint import INDEX_NAME
from dsparkhub.io.header import DTYPE_BITS, parse_header_bytes, read_header
from dsparkhub.errors import DsparkhubError

#: outcome counts per family, filled by the check functions (read by ``scripts/fuzz_headers.py``).
COUNTS: Counter = Counter()

NAMES = ["fc.weight", "norm.weight", "hidden_norm.weight", "layers.0.self_attn.q_proj.weight", "d2t",
         "embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight", "__metadata__", "", "a" * 300]
BAD_DTYPES = ["F128", "bf16", "", "Q4_K", None, 16, 1.5, [], {}, ["BF16"], {"BF16": 1}, True]
#: JSON values that are wrong in interesting ways wherever they land.
WEIRD_SCALARS = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 2, 3, 7, 2**31, 2**53, 2**63, 2**64 + 5, 10**12, -(2**63)]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["BF16", "../x", "/etc/passwd", "model.safetensors", "Qwen3DSparkModel", "vanilla", "1e999"]))
JSON_VALUES = st.recursive(WEIRD_SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=12)


#: seconds one case may take before it counts as a hang (generous: CI machines are slow and shared).
CASE_SECONDS = 10.0


class FuzzHang(AssertionError):
    """A case ran longer than :data:`CASE_SECONDS`."""


@contextmanager
def time_limit(seconds: float = CASE_SECONDS):
    """Fail with :class:`FuzzHang` when the block runs longer than ``seconds`` (SIGALRM; main thread only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise FuzzHang(f"case still running after {seconds} s (hang)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _nest(depth: int, leaf: str = "0") -> str:
    return "[" * depth + leaf + "]" * depth


@st.composite
def _tensor_entries(draw):
    """``[(name, entry_dict)]`` with consistent offsets, before any breakage."""
    n = draw(st.integers(0, 4))
    entries, pos = [], 0
    for _ in range(n):
        dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        numel = 1
        for d in shape:
            numel *= d
        nbytes = (numel * DTYPE_BITS[dtype] + 7) // 8
        entries.append([draw(st.sampled_from(NAMES)), {"dtype": dtype, "shape": shape,
                                                        "data_offsets": [pos, pos + nbytes]}])
        pos += nbytes
    return entries, pos


BREAKS = ["unknown_dtype", "shape_mismatch", "overlap", "past_end", "bad_offsets", "bad_shape", "dup_name",
          "bad_metadata", "deep_json", "giant_int", "bad_utf8", "bad_json", "not_object", "entry_not_object",
          "random_bytes"]
FILE_BREAKS = ["truncate_file", "len_too_big", "len_absurd", "len_small", "short_file", "extra_data",
               "missing_data"]


@st.composite
def safetensors_files(draw) -> tuple[bytes, list[str]]:
    """A (usually broken) safetensors file as bytes, and the list of breakages applied (for counting)."""
    entries, data_len = draw(_tensor_entries())
    breaks = draw(st.lists(st.sampled_from(BREAKS + FILE_BREAKS), max_size=3, unique=True))
    meta = {"format": "pt"}
    for b in breaks:
        if not entries and b in ("unknown_dtype", "shape_mismatch", "overlap", "past_end", "bad_offsets",
                                 "bad_shape", "dup_name", "entry_not_object"):
            continue
        i = draw(st.integers(0, max(0, len(entries) - 1)))
        e = entries[i][1] if entries else None
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            if b not in ("bad_metadata", "entry_not_object"):
                continue  # an earlier break already replaced this entry
        if b == "unknown_dtype":
            e["dtype"] = draw(st.sampled_from(BAD_DTYPES))
        elif b == "shape_mismatch":
            e["shape"] = list(e["shape"]) + [draw(st.integers(2, 9))] if isinstance(e["shape"], list) else [3]
        elif b == "overlap" and len(entries) > 1:
            other = entries[(i + 1) % len(entries)][1]
            offs = other.get("data_offsets") if isinstance(other, dict) else None
            if isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs):
                span = other["data_offsets"][1] - other["data_offsets"][0]
                start = max(0, other["data_offsets"][0] - draw(st.integers(0, 3)))
                e["data_offsets"] = [start, start + span]
        elif b == "past_end":
            shift = draw(st.sampled_from([1, 7, 2**20, 2**40, 2**63]))
            offs = e["data_offsets"]
            e["data_offsets"] = [o + shift for o in offs] if isinstance(offs, list) and all(
                type(o) is int for o in offs) else [shift, shift]
        elif b == "bad_offsets":
            e["data_offsets"] = draw(st.one_of(JSON_VALUES, st.sampled_from([[5, 1], [-4, 0], [0], [0, 1, 2],
                                                                                [0.0, 4.0], [False, True], "0,4"])))
        elif b == "bad_shape":
            e["shape"] = draw(st.one_of(JSON_VALUES, st.sampled_from([[-1], [1.5], [True], "4", [2**64], [[2]],
                                                                        [2**60, 2**60], None])))
        elif b == "entry_not_object":
            entries[i][1] = draw(JSON_VALUES)
        elif b == "dup_name":
            entries.append([entries[i][0], dict(e) if isinstance(e, dict) else e])
        elif b == "bad_metadata":
            meta = draw(st.one_of(JSON_VALUES, st.sampled_from([[], 0, "", "pt", {"format": 1},
                                                                 {"format": None}, {"a": {"b": "c"}}])))
    body = ", ".join(f"{json.dumps(name)}: {json.dumps(entry)}" for name, entry in entries)
    if meta is not None or "bad_metadata" in breaks:
        body = (f'"__metadata__": {json.dumps(meta)}' + (", " if body else "")) + body
    text = "{" + body + "}"
    if "deep_json" in breaks:
        depth = draw(st.sampled_from([50, 900, 990, 1100, 5000, 100_000]))
        where = draw(st.sampled_from(["meta", "value", "top"]))
        text = (_nest(depth) if where == "top" else
                text[:-1] + (", " if body else "") + f'"deep": {_nest(depth)}' + "}" if where == "value" else
                '{"__metadata__": {"x": ' + _nest(depth, '"s"') + "}}")
    if "giant_int" in breaks:
        text = text[:-1] + (", " if body else "") + '"g": {"dtype": "U8", "shape": [' + "9" * \
            draw(st.sampled_from([20, 400, 4301, 20000])) + '], "data_offsets": [0, 1]}}'
    if "not_object" in breaks:
        text = json.dumps(draw(JSON_VALUES))
    raw = text.encode("utf-8")
    if "bad_json" in breaks and raw:
        cut = draw(st.integers(0, len(raw) - 1))
        raw = raw[:cut] + draw(st.sampled_from([b"", b"}", b",", b"\x00", b"'", b"NaN", b'"\\ud800"']))
    if "bad_utf8" in breaks:
        pos = draw(st.integers(0, len(raw)))
        raw = raw[:pos] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + raw[pos:]
    if "random_bytes" in breaks:
        raw = draw(st.binary(max_size=64))
    raw += b" " * draw(st.integers(0, 7))  # safetensors pads headers to 8 bytes with spaces
    data = bytes(data_len)
    if "extra_data" in breaks:
        data += bytes(draw(st.integers(1, 64)))
    if "missing_data" in breaks and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    n = len(raw)
    if "len_too_big" in breaks:
        n = len(raw) + len(data) + draw(st.integers(1, 1 << 20))
    if "len_absurd" in breaks:
        n = draw(st.sampled_from([2**64 - 1, 2**63, 2**40, 100_000_001, 99_999_999]))
    if "len_small" in breaks:
        n = draw(st.integers(0, len(raw)))
    blob = struct.pack("<Q", n) + raw + data
    if "short_file" in breaks:
        blob = blob[:draw(st.integers(0, 7))]
    if "truncate_file" in breaks and blob:
        blob = blob[:draw(st.integers(0, len(blob) - 1))]
    return blob, breaks


def header_json():
    """Raw header bytes: arbitrary JSON objects / values, or arbitrary bytes."""
    tensorish = st.dictionaries(st.sampled_from(NAMES + ["x", "y"]), st.one_of(
        JSON_VALUES, st.fixed_dictionaries({"dtype": st.one_of(st.sampled_from(sorted(DTYPE_BITS)), JSON_VALUES),
                                            "shape": st.one_of(st.lists(st.integers(-2, 2**64), max_size=3),
                                                               JSON_VALUES),
                                            "data_offsets": st.one_of(st.lists(st.integers(-2, 2**64), min_size=2,
                                                                               max_size=2), JSON_VALUES)})),
        max_size=4)
    return st.one_of(tensorish.map(lambda d: json.dumps(d).encode()), JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=128))


def _check_tensors(tensors: dict, file_size: int | None) -> None:
    spans = []
    for name, t in tensors.items():
        assert t.dtype in DTYPE_BITS, (name, t.dtype)
        assert all(type(d) is int and d >= 0 for d in t.shape), (name, t.shape)
        assert t.nbytes == (t.numel * DTYPE_BITS[t.dtype] + 7) // 8
        if file_size is not None:
            assert t.start + t.nbytes <= file_size, (name, t.start, t.nbytes, file_size)
        spans.append((t.start, t.start + t.nbytes))
    spans.sort()
    assert all(b1 >= e0 for (_, e0), (b1, _) in zip(spans, spans[1:])), spans


def _expect_own_error(exc: DsparkhubError) -> str:
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} with an empty message"
    assert len(text) < 20_000, f"error message of {len(text)} characters is not a clear message"
    return type(exc).__name__


def check_file(blob: bytes, folder: Path) -> str:
    """Write ``blob`` as a safetensors file and read its header; return the outcome (``ok`` or the error type).

    Asserts: only DsparkhubError escapes, accepted headers satisfy every invariant, and the ``tracemalloc`` peak
    stays within a small multiple of the file's size (a length field of 2**64 is never allocated).
    """
    path = folder / "fuzz.safetensors"
    path.write_bytes(blob)
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        with time_limit():
            tensors, meta = read_header(path)
        outcome = "ok"
        _check_tensors(tensors, len(blob))
        assert isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    except DsparkhubError as exc:
        outcome = _expect_own_error(exc)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        if not tracing:
            tracemalloc.stop()
    assert peak < 64 * len(blob) + (4 << 20), f"header read of a {len(blob)}-byte file peaked at {peak} bytes"
    COUNTS[f"file:{outcome}"] += 1
    return outcome


def check_header_bytes(raw: bytes, data_size: int | None) -> str:
    """``parse_header_bytes`` on arbitrary bytes; return the outcome."""
    try:
        with time_limit():
            tensors, _ = parse_header_bytes(raw, file="fuzz.safetensors", data_size=data_size)
        _check_tensors(tensors, None if data_size is None else 8 + len(raw) + data_size)
        outcome = "ok"
    except DsparkhubError as exc:
        outcome = _expect_own_error(exc)
    COUNTS[f"header:{outcome}"] += 1
    return outcome


# ---- checkpoint folders ---------------------------------------------------------------------------------------

CONFIG_KEYS = ["architectures", "hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "block_size", "target_layer_ids",
               "markov_rank", "mask_token_id", "enable_confidence_head", "confidence_head_with_markov",
               "num_target_layers", "draft_vocab_size", "markov_head_type", "tie_word_embeddings", "attention_bias",
               "target_hidden_size", "dflash_config", "sample_from_anchor", "text_config", "rope_parameters"]
INDEX_SHARDS = ["model.safetensors", "../model.safetensors", "/etc/passwd", "missing.safetensors", "",
                "sub/../../x.safetensors", "model.safetensors\x00.txt", "a" * 300 + ".safetensors", ".", "..",
                "config.json", "step_100", "C:\\x.safetensors"]


@st.composite
def folder_mutations(draw) -> list[tuple]:
    """A list of mutations ``(where, what, *args)`` applied by :func:`apply_mutations` to a drafter/target pair."""
    ops = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["config_key", "config_key", "config_key", "config_del", "config_file",
                                     "index", "header_entry", "header_bytes", "target_config_key",
                                     "target_index"]))
        if kind in ("config_key", "target_config_key"):
            value = draw(st.one_of(JSON_VALUES, st.sampled_from(
                [0, -1, 10**9, 10**15, 2**63, [], [0, 1, 2], [2, 1], [-5], ["1"], [1.0], {"target_layer_ids": "x"},
                 ["Qwen3DSparkModel"], "Qwen3DSparkModel", ["DFlashDraftModel"], ["Qwen3DSparkModel", 3]])))
            ops.append((kind, draw(st.sampled_from(CONFIG_KEYS)), value))
        elif kind == "config_del":
            ops.append((kind, draw(st.sampled_from(CONFIG_KEYS))))
        elif kind == "config_file":
            ops.append((kind, draw(st.one_of(
                JSON_VALUES.map(lambda v: json.dumps(v).encode()), st.binary(max_size=32),
                st.sampled_from([b"", b"\xff\xfe", b"{" * 5000, b'{"a": ' + b"7" * 5000 + b"}",
                                 ('{"x": ' + _nest(995) + "}").encode()])))))
        elif kind in ("index", "target_index"):
            wm = draw(st.one_of(
                st.just("real"), JSON_VALUES,
                st.dictionaries(st.sampled_from(NAMES), st.one_of(st.sampled_from(INDEX_SHARDS), JSON_VALUES),
                                max_size=3)))
            ops.append((kind, wm, draw(st.one_of(st.none(), JSON_VALUES))))
        elif kind == "header_entry":
            ops.append((kind, draw(st.integers(0, 10**6)), draw(st.sampled_from(
                ["dtype", "shape", "data_offsets", "delete", "duplicate", "metadata"])), draw(JSON_VALUES)))
        else:
            ops.append((kind, draw(st.sampled_from(["flip", "truncate", "length"])), draw(st.integers(0, 2**32)),
                        draw(st.integers(0, 255))))
    return ops


def _rewrite_header(path: Path, edit) -> None:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header = edit(header)
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])


def apply_mutations(draft: Path, target: Path, ops: list[tuple]) -> None:
    """Apply :func:`folder_mutations` output to a drafter step folder and a target folder (both copies)."""
    for op in ops:
        kind = op[0]
        if kind in ("config_key", "config_del", "target_config_key"):
            cfg_path = (target if kind == "target_config_key" else draft) / "config.json"
            try:
                cfg = json.loads(cfg_path.read_bytes())
            except ValueError:
                continue
            if not isinstance(cfg, dict):
                continue
            if kind == "config_del":
                cfg.pop(op[1], None)
            else:
                cfg[op[1]] = op[2]
            cfg_path.write_text(json.dumps(cfg))
        elif kind == "config_file":
            (draft / "config.json").write_bytes(op[1])
        elif kind in ("index", "target_index"):
            folder = draft if kind == "index" else target
            wm = op[1]
            if wm == "real":
                try:
                    names = read_header(folder / "model.safetensors")[0]
                except DsparkhubError:
                    names = {}
                wm = {k: "model.safetensors" for k in names}
            index = {"weight_map": wm} if op[2] is None else {"metadata": op[2], "weight_map": wm}
            (folder / INDEX_NAME).write_text(json.dumps(index))
        elif kind == "header_entry":
            _, pick, field, value = op

            def edit(h, pick=pick, field=field, value=value):
                names = sorted(k for k in h if k != "__metadata__")
                if field == "metadata":
                    h["__metadata__"] = value
                    return h
                if not names:
                    return h
                name = names[pick % len(names)]
                if field == "delete":
                    del h[name]
                elif field == "duplicate":
                    body = json.dumps(h)[1:-1]
                    return ("{" + body + ", " + json.dumps(name) + ": " + json.dumps(h[name]) + "}").encode()
                else:
                    h[name][field] = value
                return h

            try:
                _rewrite_header(draft / "model.safetensors", edit)
            except (ValueError, struct.error):  # an earlier mutation already broke the header
                pass
        else:
            _, how, pos, byte = op
            path = draft / "model.safetensors"
            blob = bytearray(path.read_bytes())
            if not blob:
                continue
            (n,) = struct.unpack("<Q", bytes(blob[:8]).ljust(8, b"\0"))
            if how == "flip":  # inside the header, where parsing happens
                i = 8 + pos % max(1, min(n, len(blob) - 8))
                if i < len(blob):
                    blob[i] = byte
            elif how == "truncate":
                del blob[pos % len(blob):]
            else:
                blob[:8] = struct.pack("<Q", (n + pos - 2**31) % 2**64)
            path.write_bytes(bytes(blob))


def make_base(folder: Path) -> tuple[Path, Path]:
    """Build the pristine tiny target and DeepSpec drafter run once; returns ``(target, run)``."""
    from dsparkhub.testing.factories import make_deepspec_drafter, make_qwen3_target

    target = make_qwen3_target(folder / "target", hidden=16, layers=4, vocab=64, heads=2, kv_heads=1, head_dim=8,
                               intermediate=32)
    run = make_deepspec_drafter(folder / "run", target, layers=1, target_layer_ids=(0, 2), block_size=4,
                                markov_rank=4)
    return target, run


def check_folder(base: tuple[Path, Path], ops: list[tuple], work: Path, n: int | None = None) -> str:
    """Copy the base pair into ``work``, mutate it, then open / validate it; return the outcome.

    Every public parser on the path runs: ``open_checkpoint`` (drafter and target), ``open_draft``, ``validate``
    with the target and a ``num_speculative_tokens``.
    """
    from dsparkhub.io.checkpoint import open_checkpoint
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.validate import validate

    if work.exists():
        shutil.rmtree(work)
    target = Path(shutil.copytree(base[0], work / "target"))
    run = Path(shutil.copytree(base[1], work / "run", symlinks=True))
    step = run / "step_100"
    apply_mutations(step, target, ops)
    outcome = "ok"
    with time_limit():
        try:
            open_checkpoint(step, require_config=False)
        except DsparkhubError as exc:
            outcome = _expect_own_error(exc)
        try:
            d = open_draft(run)
            report = validate(d, str(target), num_speculative_tokens=n)
            assert isinstance(report.ok, bool)
            json.dumps(report.to_dict(), default=str)
            outcome = outcome if outcome != "ok" else ("ok" if report.ok else "findings")
        except DsparkhubError as exc:
            outcome = _expect_own_error(exc)
    COUNTS[f"folder:{outcome}"] += 1
    return outcome
