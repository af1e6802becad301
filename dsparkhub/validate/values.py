"""Opt-in (``deep=True``) scan of the drafter's floating tensors for NaN / Inf (DSH207)."""

from __future__ import annotations

from pathlib import Path

from dsparkhub.errors import CheckpointFormatError
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.validate.report import Collector

#: safetensors dtype codes whose values can be NaN / Inf, and the torch dtype they are read as (F8_E4M3 has NaN but
#: no Inf; F8_E8M0's 0xFF is NaN).
_NONFINITE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
                     "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}
#: bytes of tensor data read at once by the deep check (memory stays at a few times this, whatever the tensor)
DEEP_CHUNK_BYTES = 16 << 20


def count_nonfinite(path: str | Path, start: int, nbytes: int, dtype: str) -> tuple[int, int, int | None]:
    """Count the NaN and Inf values of one tensor's data, read from its file in :data:`DEEP_CHUNK_BYTES` chunks.

    Args:
        path: the safetensors file.
        start: byte offset of the tensor's data in the file (header included).
        nbytes: bytes of the tensor's data.
        dtype: safetensors dtype code; one of the floating codes of :data:`_NONFINITE_DTYPES`.

    Returns:
        ``(NaN count, Inf count, flat index of the first non-finite element or None)``.

    Raises:
        CheckpointFormatError: the file ends inside the tensor.
    """
    import torch

    td = getattr(torch, _NONFINITE_DTYPES[dtype])
    size = torch.empty((), dtype=td).element_size()
    chunk = max(size, DEEP_CHUNK_BYTES // size * size)
    nan = inf = 0
    first = None
    with open(path, "rb") as f:
        f.seek(start)
        done = 0
        while done < nbytes:
            raw = f.read(min(chunk, nbytes - done))
            if not raw:
                raise CheckpointFormatError(f"the file ends {nbytes - done} bytes before the end of a tensor's data",
                                            path=path)
            x = torch.frombuffer(bytearray(raw), dtype=td)
            x = x if dtype in ("F16", "BF16", "F32", "F64") else x.float()  # isnan / isinf need a wide dtype
            bad_nan, bad_inf = torch.isnan(x), torch.isinf(x)
            n_nan, n_inf = int(bad_nan.sum()), int(bad_inf.sum())
            if (n_nan or n_inf) and first is None:
                first = done // size + int((bad_nan | bad_inf).nonzero()[0])
            nan, inf, done = nan + n_nan, inf + n_inf, done + len(raw)
    return nan, inf, first


def check_values(d: OpenedDraft, out: Collector) -> None:
    """``validate --deep``: every floating tensor of the drafter read back and scanned for NaN / Inf (DSH207)."""
    if d.checkpoint.remote:
        return
    for name in sorted(d.checkpoint.tensors):
        info = d.checkpoint.tensors[name]
        if info.dtype not in _NONFINITE_DTYPES or not info.nbytes:
            continue
        nan, inf, first = count_nonfinite(d.checkpoint.file_path(info), info.start, info.nbytes, info.dtype)
        if nan or inf:
            out.add("DSH207", f"tensor {name!r} holds {nan} NaN and {inf} Inf values out of {info.numel} (first at "
                    f"flat index {first}); vLLM loads them without a word and the drafter proposes garbage",
                    location=f"{d.checkpoint.file_path(info)} tensor {name}", expected="finite values",
                    found=f"{nan} NaN, {inf} Inf", hint="the training run diverged or the file was damaged; "
                                                       "re-export from a healthy step")
