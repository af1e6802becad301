"""The confidence calibration sidecar ``dspark_sts.json``: what SGLang 0.5.23's reader refuses (DSH501 / DSH502)."""

from __future__ import annotations

import json
from pathlib import Path

from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.validate.report import Collector

STS_FILE = "dspark_sts.json"


def sidecar_problems(data) -> list[str]:
    """What SGLang 0.5.23's reader would refuse in a parsed sidecar (empty list: it loads).

    Reproduces ``DSparkStsCalibration`` (``srt/speculative/dspark_components/dspark_sts.py`` lines 9-31): a JSON
    object; ``temperatures`` required, a non-empty list of numbers all > 0 (``__post_init__``, lines 16-24);
    ``dataset`` a string, ``num_samples`` an integer, ``ece_before`` / ``ece_after`` lists of numbers (msgspec's typed
    decode, line 31; JSON has no NaN, and msgspec rejects null for a float). Unknown keys are ignored by msgspec.
    """
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if not isinstance(data, dict):
        return [f"expected a JSON object, found {type(data).__name__}"]
    out = []
    temps = data.get("temperatures")
    if not isinstance(temps, list) or not temps or not all(number(t) for t in temps):
        out.append("`temperatures` must be a non-empty list of numbers")
    elif any(t <= 0 for t in temps):
        out.append(f"`temperatures` must all be > 0, found {temps}")
    if "dataset" in data and not isinstance(data["dataset"], str):
        out.append("`dataset` must be a string")
    if "num_samples" in data and (not isinstance(data["num_samples"], int) or isinstance(data["num_samples"], bool)):
        out.append("`num_samples` must be an integer")
    for key in ("ece_before", "ece_after"):
        if key in data and (not isinstance(data[key], list) or not all(number(v) for v in data[key])):
            out.append(f"`{key}` must be a list of numbers (no null)")
    return out


def check_sidecar(d: OpenedDraft, out: Collector) -> None:
    """The confidence calibration sidecar ``dspark_sts.json`` (``dsparkhub calibrate``), when the folder has one:
    SGLang 0.5.23 refuses to start when it does not decode (``dspark_sts.py`` lines 9-31) or when its length is not
    the runtime γ, which is the drafter's ``block_size`` by default (``dspark_planner.py`` lines 107-113,
    ``dspark_config.py`` lines 295-297)."""
    if d.checkpoint.remote:
        return
    path = Path(d.checkpoint.path) / STS_FILE
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        data, problems = None, [f"not valid JSON ({exc})"]
    else:
        problems = sidecar_problems(data)
    if problems:
        out.add("DSH502", f"{STS_FILE} would be refused by SGLang's reader: {'; '.join(problems)}",
                location=str(path), hint="re-run `dsparkhub calibrate --overwrite`, or remove the file")
        return
    gamma = len(data["temperatures"])
    if gamma != d.spec.block_size:
        out.add("DSH501", f"{STS_FILE} holds {gamma} temperatures but the drafter's block size is "
                f"{d.spec.block_size}; SGLang refuses a table whose γ differs from the runtime γ",
                location=f"{path} key temperatures", expected=d.spec.block_size, found=gamma,
                hint="re-run `dsparkhub calibrate --overwrite` on this drafter")


