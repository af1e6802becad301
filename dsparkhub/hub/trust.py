"""What a push checks about the bytes it uploads, from the pass that hashes them: the weights hold no NaN / Inf,
and the card, results files and calibration sidecar in the folder describe these weights.

The tie is the drafter fingerprint (:func:`dsparkhub.io.hashing.checkpoint_fingerprint`: sha256 over the config
and weight files' hashes), which ``dsparkhub verify`` records as ``drafter.fingerprint`` in a results file,
``dsparkhub card`` prints on the card ("Drafter fingerprint `...`", one per results file, after checking it against
the folder) and ``dsparkhub calibrate`` records as ``provenance.drafter_fingerprint`` in ``dspark_sts.json``. A push
computes it from the hashes it needs anyway (nothing is read twice) and refuses files that claim another one: they
were measured on other weights (the drafter was re-converted, retrained or damaged since).

Does not: read files other than the small text files it checks (hashing and the NaN / Inf count are
:func:`dsparkhub.io.hashing.hash_and_scan`), talk to the Hub, or decide about ``--force`` (``dsparkhub.hub.push``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dsparkhub.errors import CheckpointFormatError, ResultsError
from dsparkhub.io.finite import NonFinite
from dsparkhub.io.hashing import checkpoint_fingerprint, fingerprint_files
from dsparkhub.io.ownership import is_results  # a results file told without pydantic (a push imports no schema)

#: the card's line (dsparkhub/templates/model_card.md.j2): "Drafter fingerprint `<64 hex>` (...)"
CARD_FINGERPRINT = re.compile(r"[Dd]rafter fingerprint\W{0,8}([0-9a-f]{64})\b")
#: results and sidecars are small; a larger JSON file is data, not a claim about the drafter
MAX_CLAIM_BYTES = 16 << 20
SHOWN = 16  # hex digits of a fingerprint shown in messages (as `dsparkhub compare` shows them)


def fingerprint_claims(files: dict[str, Path]) -> list[tuple[str, str]]:
    """Which pushed file says which drafter fingerprint: ``[(repo path, fingerprint)]`` sorted by path.

    Read: ``README.md`` (every "Drafter fingerprint" line of a dsparkhub card); every other ``*.json`` of at most
    :data:`MAX_CLAIM_BYTES` that is a results file (``drafter.fingerprint``, skipped when null: a served model has
    none) or carries ``provenance.drafter_fingerprint`` (``dspark_sts.json``). A file that is not valid UTF-8 / JSON
    claims nothing here (validation and the card judge those).
    """
    claims = []
    for rel, path in sorted(files.items()):
        if rel == "README.md":
            text = path.read_text(encoding="utf-8", errors="replace")
            claims += [(rel, fp) for fp in dict.fromkeys(CARD_FINGERPRINT.findall(text))]
        elif rel.endswith(".json") and path.stat().st_size <= MAX_CLAIM_BYTES:
            try:
                data = json.loads(path.read_bytes())
            except (UnicodeDecodeError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            found = None
            if is_results(data):
                found = (data.get("drafter") or {}).get("fingerprint")
            elif isinstance(data.get("provenance"), dict):
                found = data["provenance"].get("drafter_fingerprint")
            if isinstance(found, str):
                claims.append((rel, found))
    return claims


def fingerprint_mismatch(draft_dir: Path, claims: list[tuple[str, str]], fingerprint: str) -> ResultsError | None:
    """The error for files that claim another drafter fingerprint than the folder's, or None when all agree.

    Args:
        draft_dir: the drafter folder (named in the message with the files its fingerprint covers).
        claims: :func:`fingerprint_claims`.
        fingerprint: the folder's :func:`~dsparkhub.io.hashing.checkpoint_fingerprint`.
    """
    wrong = [(rel, fp) for rel, fp in claims if fp != fingerprint]
    if not wrong:
        return None
    said = "; ".join(f"{rel} says drafter fingerprint {fp[:SHOWN]}" for rel, fp in wrong)
    covered = " + ".join(p.name for p in fingerprint_files(draft_dir))
    return ResultsError(
        f"the card / results to push do not describe these weights: {said}; but {covered} hash to fingerprint "
        f"{fingerprint[:SHOWN]}. The config or weights changed after those files were written (re-converted, "
        "retrained or damaged), so the Hub would show numbers measured on other weights",
        path=draft_dir,
        hint=f"measure these weights again: `dsparkhub verify {draft_dir} --target TARGET --out results.json`, then "
             f"`dsparkhub card {draft_dir} --results results.json`; or pass --force to push anyway (recorded in "
             "the commit message)")


def nonfinite_error(draft_dir: Path, found: list[NonFinite], files: dict[str, Path]) -> CheckpointFormatError | None:
    """The error for weights holding NaN / Inf, naming up to five tensors with their counts; None when clean.

    Args:
        draft_dir: the drafter folder.
        found: :func:`~dsparkhub.io.hashing.hash_and_scan`'s findings (``file`` is ``str(path)``).
        files: the push's ``{repo path: local path}`` (to name each file by its repo path).
    """
    if not found:
        return None
    rel = {str(p): r for r, p in files.items()}
    shown = ", ".join(f"{rel.get(x.file, Path(x.file).name)} tensor `{x.tensor}` ({x.dtype}): {x.count} of "
                      f"{x.numel} values" for x in found[:5])
    more = f" and {len(found) - 5} more tensor(s)" if len(found) > 5 else ""
    return CheckpointFormatError(
        f"the weights hold NaN / Inf values: {shown}{more}. A drafter with non-finite weights proposes tokens the "
        "target never accepts (τ 1.00), so the release would be useless",
        path=draft_dir,
        hint="convert the drafter again from a good training checkpoint (`dsparkhub convert`), or pass --force to "
             "push anyway (recorded in the commit message)")


def check_bytes(draft_dir: Path, files: dict[str, Path], hashes: dict[str, str], found: list[NonFinite], *,
                force: bool) -> tuple[str | None, list[str]]:
    """The push's checks of what it hashed: NaN / Inf first (re-measuring broken weights is no fix), then the
    fingerprint claims.

    Args:
        draft_dir: the drafter folder.
        files: ``{repo path: local path}`` to push.
        hashes: their ``{str(path): sha256}`` (files of the fingerprint that are not pushed are hashed here).
        found: the NaN / Inf findings of the same pass.
        force: report a problem as overridden instead of raising it.

    Returns:
        ``(the folder's drafter fingerprint, or None without a config.json; what force overrode, in words)``.

    Raises:
        CheckpointFormatError: (not ``force``) the weights hold NaN / Inf (:func:`nonfinite_error`).
        ResultsError: (not ``force``) a pushed file names another fingerprint (:func:`fingerprint_mismatch`).
    """
    fingerprint = checkpoint_fingerprint(draft_dir, hashes) if (draft_dir / "config.json").exists() else None
    overridden = []
    for problem, what in ((nonfinite_error(draft_dir, found, files), "NaN / Inf in the weights"),
                          (fingerprint_mismatch(draft_dir, fingerprint_claims(files), fingerprint)
                           if fingerprint else None, "a card / results fingerprint mismatch")):
        if problem is not None:
            if not force:
                raise problem
            overridden.append(what)
    return fingerprint, overridden
