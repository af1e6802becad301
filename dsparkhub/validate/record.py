"""``validation.json``: the settings-independent validation of a drafter folder, written once and handed on.

``convert`` validates its output once and writes this file into it; ``verify``, ``push`` and ``card`` read it
instead of validating again (issue 14). A record is keyed by what the validation read, and a record whose key does
not match the folder and target at hand is never used (the caller validates again):

- the drafter: :func:`drafter_fingerprint`, a sha256 over ``config.json``, ``model.safetensors.index.json``, every
  ``*.safetensors`` file's size and header bytes, ``dspark_sts.json`` and the ``d2t`` tensor's bytes: header-only,
  so it costs a convert ~nothing; with ``deep`` also :func:`~dsparkhub.io.hashing.checkpoint_fingerprint` (the
  data the NaN / Inf scan read);
- the target: :func:`target_identity`, the sha256 of what the target is, not of how its path was spelled (``./t``,
  ``t/`` and ``/abs/t`` are one target): a Hub target's repo id and revision, a local folder's ``config.json`` and
  every tensor header; plus everything of it the rules read (its text config, the embedding / LM-head headers, its
  manifest facts). Nothing of it is stored in clear: no local path is published;
- the dsparkhub version (rules change between versions).

Findings are stored as templates: a location inside the drafter folder as its file name plus the rest (rendered
against the folder's path when read, so the record survives convert's rename of its temporary folder), the
target's source as ``{target}``. :meth:`ValidationRecord.report_for` then gives exactly the report
``validate(folder, target, num_speculative_tokens=n, engine=e)`` gives.

Reading is strict (msgspec, unknown keys refused): :func:`read_record` raises ``CheckpointFormatError`` naming the
file and what is wrong. Consumers treat the record as a cache: :func:`matching_record` turns a malformed, stale or
foreign record into None plus a reason, and they validate again.

Does not: validate (``dsparkhub.validate.validate_base``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import msgspec

from dsparkhub import __version__
from dsparkhub.errors import CheckpointFormatError
from dsparkhub.io.checkpoint import INDEX_NAME
from dsparkhub.io.hashing import checkpoint_fingerprint
from dsparkhub.io.output import replace_text
from dsparkhub.layouts.schema_errors import check
from dsparkhub.layouts.reading import OpenedDraft
from dsparkhub.target import TargetSpec, public_name
from dsparkhub.validate.report import Finding, ValidationReport
from dsparkhub.validate.settings import BasePass, FinalLayer, SettingsFacts
from dsparkhub.validate.sidecar import STS_FILE

VALIDATION_FILE = "validation.json"
SCHEMA = "dsparkhub.validation/1"
_STRICT = {"forbid_unknown_fields": True}


class _Finding(msgspec.Struct, **_STRICT):
    code: str
    severity: str
    message: str
    location: str = ""
    expected: str = ""
    found: str = ""
    hint: str = ""
    in_draft: str | None = None  # the file (or "" for the folder) ``location`` starts with, relative


class _FinalLayer(msgspec.Struct, **_STRICT):
    target_layers: int
    trained: str
    sources: str = ""


class _Facts(msgspec.Struct, **_STRICT):
    variant: str
    block_size: int
    block_layout: str
    proposals_per_block: int
    target_layer_ids: list[int]
    final_layer: _FinalLayer | None = None


class _Key(msgspec.Struct, **_STRICT):
    dsparkhub: str
    drafter: str
    target: str | None
    deep: bool
    data: str | None = None


class _Summary(msgspec.Struct, **_STRICT):
    ok: bool
    errors: list[str]
    warnings: list[str]


class ValidationRecord(msgspec.Struct, **_STRICT):
    """The content of ``validation.json`` (schema :data:`SCHEMA`).

    Attributes:
        schema: :data:`SCHEMA`.
        key: what the record is valid for (see the module docstring).
        target_name: the target's public name (Hub id, manifest or folder name; :func:`dsparkhub.target.public_name`).
        layout: the drafter's detected layout.
        summary: ok and the error / warning codes of the settings-independent findings (shown by the card).
        findings: the settings-independent findings, as templates.
        facts: what the settings rules read.
        spec: the drafter's ``DraftSpec.summary()``.
    """

    schema: str
    key: _Key
    target_name: str | None
    layout: str
    summary: _Summary
    findings: list[_Finding]
    facts: _Facts
    spec: dict

    def base_pass(self, draft: str | Path, target_source: str | None) -> BasePass:
        """The :class:`BasePass` this record stores, rendered for the folder at ``draft`` and the target's source."""
        base = str(draft)
        found = []
        for f in self.findings:
            texts = [_untemplate(x, target_source) for x in (f.message, f.location, f.expected, f.found, f.hint)]
            if f.in_draft is not None:
                texts[1] = (str(Path(base) / f.in_draft) if f.in_draft else base) + texts[1]
            found.append(Finding(f.code, f.severity, texts[0], texts[1], texts[2], texts[3], texts[4]))
        fl = self.facts.final_layer
        facts = SettingsFacts(self.facts.variant, self.layout, self.facts.block_size, self.facts.block_layout,
                              self.facts.proposals_per_block, list(self.facts.target_layer_ids),
                              None if fl is None else FinalLayer(fl.target_layers, fl.trained, fl.sources))
        return BasePass(target_source, self.layout, found, json.loads(json.dumps(self.spec)), facts, self.key.deep)

    def report_for(self, draft: str | Path, target_source: str | None, *, num_speculative_tokens: int | None = None,
                   engine: str = "vllm", deep: bool = False) -> ValidationReport:
        """What ``validate(draft, target, num_speculative_tokens=n, engine=engine, deep=deep)`` returns, where
        ``target_source`` is that target's source (the key's caller checked the record matches).

        Raises:
            ValueError: unknown engine; ``deep`` asked of a record made without the data scan.
        """
        return self.base_pass(draft, target_source).report(str(draft), num_speculative_tokens=num_speculative_tokens,
                                                           engine=engine, deep=deep)


def _template(text: str, source: str | None) -> str:
    escaped = text.replace("{", "{{").replace("}", "}}")
    if source:
        escaped = escaped.replace(source.replace("{", "{{").replace("}", "}}"), "{target}")
    return escaped


_TOKEN = re.compile(r"\{\{|\}\}|\{target\}")


def _untemplate(text: str, source: str | None) -> str:
    return _TOKEN.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), source or ""), text)


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def drafter_fingerprint(d: OpenedDraft) -> str:
    """sha256 over exactly what validation reads of a local drafter folder: ``config.json``, the index, every shard's
    name, size and header bytes (8-byte length + JSON), ``dspark_sts.json`` and the ``d2t`` tensor's bytes.

    Raises:
        CheckpointFormatError: a shard's header length field is cut short (the folder changed under us).
    """
    folder = Path(d.checkpoint.path)
    parts: list[bytes] = []
    for name in ("config.json", INDEX_NAME, STS_FILE):
        p = folder / name
        parts += [name.encode(), p.read_bytes() if p.is_file() else b"\0absent"]
    for name in sorted(d.checkpoint.files):
        with open(folder / name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointFormatError("safetensors file too short for a header", path=folder / name)
            head += f.read(int.from_bytes(head, "little"))
        parts += [name.encode(), str(size).encode(), head]
    if "d2t" in d.checkpoint.tensors:
        parts += [b"d2t", d.checkpoint.tensor_sha256("d2t").encode()]
    return _sha(*parts)


def target_identity(t: TargetSpec | None) -> str | None:
    """sha256 of what the target is and of everything of it the rules read (None for no target).

    A local folder is identified by its content, from what is already open plus one ``stat`` per shard (its
    ``config.json``, index and every shard's name and size; the embedding / LM-head headers are in the facts), not
    by the path it was given under; a Hub target or a manifest by
    its source (``ns/name@rev``, ``manifest:NAME``). So ``validate --save`` with ``--target ./t`` and ``verify`` with
    ``--target /abs/t`` share one record, and a target folder that was changed does not.
    """
    if t is None:
        return None
    head = {k: None if v is None else [v.name, v.dtype, list(v.shape)] for k, v in (("embed", t.embed),
                                                                                   ("lm_head", t.lm_head))}
    facts = {"config": t.config, "local": t.local, "manifest": t.manifest, "defaults": t.default_target_layer_ids,
             **head}
    if t.local and t.manifest is None:
        ck = t.checkpoint  # lazy for a sharded target: its shard headers are not all parsed for this
        sizes = {f: (Path(ck.path) / f).stat().st_size for f in ck.files}
        what = json.dumps({"config": ck.config, "index": ck.index, "shards": sizes}, sort_keys=True,
                          default=str).encode()
    else:
        what = t.source.encode()
    return _sha(what, json.dumps(facts, sort_keys=True, default=str).encode())


def record_key(d: OpenedDraft, t: TargetSpec | None, deep: bool) -> _Key:
    """The key a record of ``d`` against ``t`` carries (the data fingerprint only with ``deep``)."""
    return _Key(__version__, drafter_fingerprint(d), target_identity(t), deep,
                checkpoint_fingerprint(d.checkpoint.path) if deep else None)


def make_record(base: BasePass, d: OpenedDraft, t: TargetSpec | None, *,
                target_name: str | None = None) -> ValidationRecord:
    """The record of a settings-independent pass ``base`` of the local drafter ``d`` against ``t``; ``target_name``
    is the target's Hub repo id when the caller knows it (``--base-model``), else
    :func:`dsparkhub.target.public_name` of its source (a Hub id, manifest name or the folder's own name).

    Raises:
        ValueError: ``d`` is remote, or a finding does not render back to itself (a record must be exact).
    """
    if d.checkpoint.remote:
        raise ValueError("a validation record describes a local drafter folder, not a Hub checkpoint")
    root = str(d.checkpoint.path)
    source = None if t is None else t.source
    inside = [""] + sorted(p.name for p in Path(root).iterdir())
    out = []
    for f in base.findings:
        where, rest = None, f.location
        for name in sorted(inside, key=len, reverse=True):  # the longest file name first
            prefix = str(Path(root) / name) if name else root
            if f.location.startswith(prefix) and (f.location == prefix or f.location[len(prefix)] == " "):
                where, rest = name, f.location[len(prefix):]
                break
        out.append(_Finding(f.code, f.severity, *(_template(x, source) for x in (f.message, rest, f.expected,
                                                                                  f.found, f.hint)), in_draft=where))
    fl = base.facts.final_layer
    facts = _Facts(base.facts.variant, base.facts.block_size, base.facts.block_layout,
                   base.facts.proposals_per_block, list(base.facts.target_layer_ids),
                   None if fl is None else _FinalLayer(fl.target_layers, fl.trained, fl.sources))
    errors = sorted({f.code for f in base.findings if f.severity == "error"})
    warnings = sorted({f.code for f in base.findings if f.severity == "warning"})
    name = None if t is None else target_name or public_name(t.source)
    record = ValidationRecord(SCHEMA, record_key(d, t, base.deep), name,
                              base.layout, _Summary(not errors, errors, warnings), out, facts,
                              json.loads(json.dumps(base.spec)))
    back = record.base_pass(root, source)
    if [vars(x) for x in back.findings] != [vars(x) for x in base.findings]:
        raise ValueError("the validation findings do not render back to themselves; no record is written")
    return record


def write_record(folder: str | Path, record: ValidationRecord) -> Path:
    """Write ``record`` as ``folder/validation.json`` atomically (a temporary file in ``folder``, then
    ``os.replace``, :func:`dsparkhub.io.output.replace_text`), with the mode any other written file gets (0666 less
    the umask).
    Returns the path."""
    path = Path(folder) / VALIDATION_FILE
    replace_text(path, json.dumps(msgspec.to_builtins(record), indent=2) + "\n")
    return path


def read_record(folder: str | Path) -> ValidationRecord | None:
    """``folder/validation.json``, or None when absent.

    Raises:
        CheckpointFormatError: not JSON, another schema, an unknown or missing key, a value of the wrong type (one
            parse; the schema's message is :func:`dsparkhub.layouts.schema_errors.check`'s: the key path, what was
            expected and what was found).
    """
    path = Path(folder) / VALIDATION_FILE
    if not path.is_file():
        return None
    hint = "re-validate with `dsparkhub validate DRAFT --target T --save`"
    try:
        data = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        raise CheckpointFormatError(f"{VALIDATION_FILE} is not valid JSON ({str(exc)[:200]})", path=path,
                                    hint=hint) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise CheckpointFormatError(f"{VALIDATION_FILE}: key `schema` must be {SCHEMA!r}, found {schema!r}",
                                    path=path, hint=hint)
    return check(data, ValidationRecord, what=VALIDATION_FILE, path=path, error=CheckpointFormatError, hint=hint)


def matching_record(d: OpenedDraft, t: TargetSpec | None, *,
                    deep: bool = False) -> tuple[ValidationRecord | None, str | None]:
    """The folder's record when it is valid for ``d`` against ``t``: ``(record, None)``; else ``(None, why)`` with
    ``why`` one line (None when the folder simply has no record).

    A malformed file is treated like a stale one (the caller validates again and says why): the record is a cache,
    never an authority.
    """
    if d.checkpoint.remote:
        return None, None
    try:
        record = read_record(d.checkpoint.path)
    except CheckpointFormatError as exc:
        return None, f"{VALIDATION_FILE} ignored: {exc}"
    if record is None:
        return None, None
    return check_record(record, d, t, deep=deep)


def check_record(record: ValidationRecord, d: OpenedDraft, t: TargetSpec | None, *,
                 deep: bool = False) -> tuple[ValidationRecord | None, str | None]:
    """``(record, None)`` when ``record``'s key matches ``d`` and ``t`` (and holds the data scan when ``deep``), else
    ``(None, why)``."""
    k = record.key
    if k.dsparkhub != __version__:
        return None, f"{VALIDATION_FILE} ignored: written by dsparkhub {k.dsparkhub}, this is {__version__}"
    if deep and not k.deep:
        return None, f"{VALIDATION_FILE} ignored: it does not hold the data scan (--deep)"
    if k.target != target_identity(t):
        return None, f"{VALIDATION_FILE} ignored: it was made against another target (or none)"
    if k.drafter != drafter_fingerprint(d) or (deep and k.data != checkpoint_fingerprint(d.checkpoint.path)):
        return None, f"{VALIDATION_FILE} ignored: the drafter's config or weights changed since it was written"
    return record, None


def validate_reusing(draft: str | Path | OpenedDraft, target: str | Path | TargetSpec | None, *,
                     record: ValidationRecord | None = None, num_speculative_tokens: int | None = None,
                     engine: str = "vllm", layout: str | None = None,
                     note=None) -> tuple[ValidationReport, ValidationRecord | None]:
    """``validate(draft, target, num_speculative_tokens=n, engine=engine)``, from a matching record when there is
    one: ``record`` when given (made in this process, e.g. by ``convert``), else the folder's ``validation.json``;
    a record whose key does not match (or a malformed file) is ignored, ``note`` told why, and the drafter validated
    again. ``draft`` / ``target`` already opened (``open_draft`` / ``open_target``) are used as they are, not read
    again. Returns ``(report, the record used or None)``.

    Raises:
        what :func:`dsparkhub.validate.validate` raises.
    """
    from dsparkhub.layouts.reading import open_draft
    from dsparkhub.target import open_target
    from dsparkhub.validate import validate_base
    from dsparkhub.validate.settings import check_engine

    check_engine(engine)
    d = draft if isinstance(draft, OpenedDraft) else open_draft(draft, layout=layout)
    t = target if isinstance(target, TargetSpec) or target is None else open_target(target)
    if record is not None:
        used, why = check_record(record, d, t) if not d.checkpoint.remote else (None, None)
    else:
        used, why = matching_record(d, t)
    if why and note is not None:
        note(why)
    source, path = None if t is None else t.source, str(d.checkpoint.path)
    if used is not None:
        return used.report_for(path, source, num_speculative_tokens=num_speculative_tokens, engine=engine), used
    return validate_base(d, t).report(path, num_speculative_tokens=num_speculative_tokens, engine=engine), None
