"""Static checks of a drafter against its target and vLLM 0.32's contract, from configs and safetensors headers.

Every check adds :class:`Finding`\\ s to one :class:`ValidationReport`; nothing stops at the first problem. Each
finding has a stable code (the table :data:`CODES`), a severity, the file / tensor / key it is about, what was
expected and what was found, and a hint. Sources of the rules: FORMATS.md §1, reference/vllm_dspark_contract.md
(vLLM 0.32 ``qwen3_dspark.py`` load_weights, ``config/speculative.py``, ``spec_decode/utils.py``), DeepSpec
``validate_target_layer_ids`` / ``assert_no_final_target_layer``.

Does not: read tensor data (the exceptions: ``d2t``, a [Vd] int64 table, whose values must be checked; and, opt-in
with ``deep=True``, every floating tensor, scanned for NaN / Inf), or run any model (``dsparkhub.verify``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsparkhub.layouts.reading import OpenedDraft, open_draft
from dsparkhub.layouts.spec import ANCHOR_FIRST, DraftSpec
from dsparkhub.target import TargetSpec, open_target

ERROR, WARNING, INFO = "error", "warning", "info"
_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

#: every finding code, its severity and what it means.
CODES: dict[str, tuple[str, str]] = {
    "DSH101": (ERROR, "Markov head tensors ship but the config has no markov_rank"),
    "DSH102": (ERROR, "mask token missing or outside the drafter's input vocab"),
    "DSH103": (ERROR, "target layer ids not strictly increasing / duplicated"),
    "DSH104": (ERROR, "block size not a positive integer"),
    "DSH105": (ERROR, "Markov head type other than vanilla (vLLM 0.32 runs only the vanilla head)"),
    "DSH106": (WARNING, "sample_from_anchor not written explicitly (vLLM's default differs between readers)"),
    "DSH107": (WARNING, "drafter path contains a substring vLLM uses to guess another method"),
    "DSH108": (WARNING, "confidence head tensors shipped but the config does not enable the head (vLLM drops them)"),
    "DSH201": (ERROR, "a tensor the drafter needs is missing (vLLM would leave it uninitialised, silently)"),
    "DSH202": (ERROR, "a tensor vLLM does not know (vLLM raises on load)"),
    "DSH203": (ERROR, "a tensor's shape disagrees with the drafter's config"),
    "DSH204": (ERROR, "fc input width is not (number of target layers) x (target hidden size)"),
    "DSH205": (ERROR, "reduced draft vocab without lm_head / d2t, or d2t values out of range"),
    "DSH206": (WARNING, "mixed floating dtypes across the drafter's weights"),
    "DSH207": (ERROR, "a tensor holds NaN or Inf values (validate --deep; vLLM loads them and drafts garbage)"),
    "DSH301": (ERROR, "hidden size differs from the target's"),
    "DSH302": (ERROR, "vocab size differs from the target's"),
    "DSH303": (ERROR, "target layer id outside the target's layers"),
    "DSH304": (ERROR, "target layer ids include the target's last layer, whose state the engine (or the layout's "
                      "trainer) reads after the final norm while the other side read it before"),
    "DSH305": (ERROR, "embedding / LM-head copy has another shape or dtype than the target's"),
    "DSH306": (ERROR, "the drafter records a different number of target layers than the target has"),
    "DSH307": (WARNING, "the target's embedding or LM head could not be found in its headers"),
    "DSH311": (ERROR, "a DSpark drafter of one backbone family checked against a target of another family"),
    "DSH313": (WARNING, "target layer ids include the target's last layer: fine for vLLM (pre-norm, as trained), "
                        "but HF output_hidden_states (the reference engine, DeepSpec's evaluator) returns it normed"),
    "DSH401": (WARNING, "num_speculative_tokens larger than what one block was trained to propose"),
    "DSH402": (INFO, "num_speculative_tokens smaller than what one block proposes"),
    "DSH501": (ERROR, "dspark_sts.json holds another number of temperatures than the block size (SGLang's γ)"),
    "DSH502": (ERROR, "dspark_sts.json does not load in SGLang's reader"),
}


#: finding codes of the layouts beyond Qwen3 (Kimi K3, DeepSeek-V4 stages, hidden-state numbering); kept apart from
#: :data:`CODES` until each has a case in tests/test_validate.py (they are exercised in tests/test_layouts.py).
LAYOUT_CODES: dict[str, tuple[str, str]] = {
    "DSH109": (ERROR, "a Kimi K3 MLA DSpark config vLLM 0.32's K3DSparkConfig refuses"),
    "DSH110": (INFO, "num_nextn_predict_layers differs from the mtp.* stages (the stages are trusted)"),
    "DSH111": (ERROR, "the DSpark stage count vLLM 0.32 builds (n_mtp_layers, else 3; V4.1: else "
                      "num_nextn_predict_layers) differs from the mtp.* stages in the checkpoint"),
    "DSH112": (ERROR, "the drafter's stages do not hold the same parameters"),
    "DSH113": (WARNING, "a speculators DSpark / DFlash config without sample_from_anchor (vLLM reads 1+N, speculators "
                        "trains anchor-first by default)"),
    "DSH114": (WARNING, "a speculators DSpark with bidirectional sliding layers, which vLLM 0.32 runs causally when "
                        "served in this layout"),
    "DSH115": (ERROR, "legacy `DSparkDraftModel` architecture on a Qwen3 drafter: vLLM loads it as DeepSeek-V4 "
                      "unless model_type is exactly `qwen3`"),
    "DSH308": (WARNING, "the embedding output (layer id -1 / hidden-state index 0) among the ids: a numbering mix-up?"),
    "DSH309": (WARNING, "target layer ids are the target's usual ids shifted by one (a numbering mix-up)"),
    "DSH310": (WARNING, "the drafter names another target (speculators verifier) than the one it is checked against"),
    # found by `convert`, which compares the copies' bytes (validate reads headers only); tests/conformance
    "DSH312": (ERROR, "a frozen embedding / LM-head copy differs from the target's bytes (trained for another "
                      "target)"),
}
ALL_CODES = {**CODES, **LAYOUT_CODES}


@dataclass
class Finding:
    """One problem (or fact) found by :func:`validate`.

    Attributes:
        code: stable code, see :data:`CODES`.
        severity: ``"error"`` | ``"warning"`` | ``"info"``.
        message: one sentence naming the object.
        location: file, ``tensor NAME`` or ``key NAME``.
        expected: expected value, as text (may be empty).
        found: found value, as text (may be empty).
        hint: how to fix it.
    """

    code: str
    severity: str
    message: str
    location: str = ""
    expected: str = ""
    found: str = ""
    hint: str = ""


@dataclass
class ValidationReport:
    """All findings of one ``validate`` run, sorted by severity then code.

    Attributes:
        draft: drafter path.
        target: target source (None when validated without one).
        layout: detected layout name.
        findings: every finding.
        spec: the drafter's description (JSON summary).
    """

    draft: str
    target: str | None
    layout: str
    findings: list[Finding] = field(default_factory=list)
    spec: dict = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        """Findings of severity error."""
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        """Findings of severity warning."""
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.errors

    @property
    def codes(self) -> set[str]:
        """Codes of all findings."""
        return {f.code for f in self.findings}

    def to_dict(self) -> dict:
        """JSON-friendly report (what ``validate --json`` prints)."""
        return {"draft": self.draft, "target": self.target, "layout": self.layout, "ok": self.ok,
                "errors": len(self.errors), "warnings": len(self.warnings),
                "findings": [asdict(f) for f in self.findings]}


class _Collector:
    def __init__(self):
        self.items: list[Finding] = []

    def add(self, code: str, message: str, *, location="", expected="", found="", hint=""):
        self.items.append(Finding(code, ALL_CODES[code][0], message, location, str(expected), str(found), hint))


def _check_intrinsic(d: OpenedDraft, out: _Collector, n: int | None) -> None:
    spec, cfg = d.spec, d.checkpoint.config
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    if spec.block_size <= 0:
        out.add("DSH104", "block size must be a positive integer", location=cfg_file, expected="> 0",
                found=spec.block_size)
    w1 = spec.tensors.get("markov_head.markov_w1.weight")
    if spec.markov_rank == 0 and w1 is not None:
        out.add("DSH101", "Markov head tensors ship but the config gives no Markov rank (vLLM 0.32 qwen3_dspark.py "
                "reads `markov_rank` unconditionally)", location=f"{cfg_file} key markov_rank",
                expected=f"markov_rank: {w1.shape[-1]} (markov_w1 is {list(w1.shape)})", found="absent or 0",
                hint="add markov_rank to config.json")
    if spec.mask_token_id is None and spec.variant != "eagle3":  # EAGLE-3 drafts autoregressively: no mask slots
        out.add("DSH102", "no mask token: vLLM needs one of dflash_config.mask_token_id, mask_token_id, "
                "dspark_noise_token_id, pard_token, ptd_token_id", location=cfg_file,
                hint="set mask_token_id to the token the drafter was trained with in the masked slots")
    elif spec.mask_token_id is not None and not 0 <= spec.mask_token_id < spec.vocab_size:
        out.add("DSH102", "mask token id is outside the drafter's input vocab", location=f"{cfg_file} key mask_token_id",
                expected=f"0 <= id < {spec.vocab_size}", found=spec.mask_token_id)
    ids = spec.target_layer_ids
    if any(b <= a for a, b in zip(ids, ids[1:])):
        out.add("DSH103", "target layer ids must be strictly increasing without duplicates",
                location=f"{cfg_file} key target_layer_ids", found=ids)
    if spec.variant == "dspark" and spec.markov_head_type not in (None, "vanilla"):
        out.add("DSH105", f"Markov head type {spec.markov_head_type!r}: vLLM 0.32 implements only the vanilla "
                "low-rank head and would fail on its extra tensors", location=f"{cfg_file} key markov_head_type",
                expected="vanilla", found=spec.markov_head_type)
    if spec.variant == "dspark" and "sample_from_anchor" not in cfg \
            and d.recipe.name not in ("speculators", "k3-dspark", "deepseek-v4"):
        out.add("DSH106", f"sample_from_anchor is implicit; this {spec.block_layout} drafter relies on vLLM's native "
                "default (true), while vLLM's speculators reader defaults it to false", location=cfg_file,
                expected=f"sample_from_anchor: {str(spec.block_layout == ANCHOR_FIRST).lower()}", found="absent",
                hint="`dsparkhub convert` writes it explicitly")
    lowered = str(d.checkpoint.path).lower()
    sniff = next((s for s in ("eagle-", "eagle3", "dflash") if s in lowered), None)
    if sniff and spec.variant == "dspark":
        out.add("DSH107", f"the drafter path contains {sniff!r}: if `method` is not passed, vLLM 0.32 loads it as "
                "that method, not DSpark", location=str(d.checkpoint.path),
                hint='always pass "method": "dspark" in --speculative-config, or rename the folder')

    _check_layout_rules(d, out)
    from dsparkhub.layouts.families import expected_tensors

    expected, open_layers = expected_tensors(spec)
    shapes = {e.name: e.shape for e in expected}
    optional = {e.name for e in expected if e.optional}
    present = spec.tensors
    for name, shape in shapes.items():
        if name not in present:
            if name not in optional:
                out.add("DSH201", f"tensor {name!r} is missing", location=f"tensor {name}",
                        expected=list(shape) if shape is not None else "present",
                        hint="vLLM 0.32 does not report missing DSpark tensors; the drafter would run on "
                             "uninitialised memory")
            continue
        found = present[name].shape
        if shape is not None and found != shape:
            if name == "fc.weight":
                A = len(spec.target_layer_ids)
                out.add("DSH204", f"tensor `fc.weight` has shape {list(found)}, expected {list(shape)} = "
                        f"[H, {A} target layers x target hidden {spec.target_hidden_size}]",
                        location="tensor fc.weight", expected=list(shape), found=list(found),
                        hint=f"the drafter's target_layer_ids has {A} entries: {spec.target_layer_ids}")
            else:
                out.add("DSH203", f"tensor {name!r} has shape {list(found)}, expected {list(shape)}",
                        location=f"tensor {name}", expected=list(shape), found=list(found))
    confidence = {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    if open_layers:
        _check_stage_names(spec, out)
    for name in sorted(set(present) - set(shapes)):
        if open_layers and re.match(r"layers\.(\d+)\.", name) and int(name.split(".")[1]) < spec.num_layers:
            continue
        if name in confidence and not spec.confidence_head:
            out.add("DSH108", f"tensor {name!r} ships but enable_confidence_head is false; vLLM drops it",
                    location=f"tensor {name}", hint="set enable_confidence_head: true, or drop the tensor")
        else:
            out.add("DSH202", f"tensor {name!r} is not part of a {spec.family} {spec.variant} drafter with "
                    f"{spec.num_layers} layers", location=f"tensor {name}",
                    hint="vLLM 0.32 raises `There is no module or parameter named ...` on it")
    if spec.draft_vocab_size != spec.vocab_size and "d2t" in present and d.checkpoint.tensors:
        _check_d2t(d, out)
    floats = {t.dtype for n, t in present.items() if t.dtype in ("F16", "BF16", "F32") and n != "d2t"
              and not n.startswith("confidence_head")}
    # DeepSeek-V4 stages mix BF16 / F32 (hyper-connection params, attn_sink) and FP8 by design
    if len(floats) > 1 and spec.family != "deepseek-v4":
        out.add("DSH206", f"weights mix floating dtypes {sorted(floats)}", found=sorted(floats),
                hint="vLLM casts to one dtype at load; make sure the lossy direction is intended")
    _check_sidecar(d, out)
    if n is not None:
        p = spec.proposals_per_block
        if n > p:
            out.add("DSH401", f"num_speculative_tokens {n} exceeds the {p} tokens one trained block proposes "
                    f"({spec.block_layout}, block size {spec.block_size}); the extra positions were never trained",
                    expected=f"<= {p}", found=n)
        elif n < p:
            out.add("DSH402", f"num_speculative_tokens {n} is below the {p} tokens a block was trained to "
                    "propose (allowed by vLLM 0.32)", expected=p, found=n)


def _check_sidecar(d: OpenedDraft, out: _Collector) -> None:
    """The confidence calibration sidecar ``dspark_sts.json`` (``dsparkhub calibrate``), when the folder has one:
    SGLang 0.5.23 refuses to start when it does not decode (``dspark_sts.py`` lines 9-31) or when its length is not
    the runtime γ, which is the drafter's ``block_size`` by default (``dspark_planner.py`` lines 107-113,
    ``dspark_config.py`` lines 295-297)."""
    if d.checkpoint.remote:
        return
    import json

    from dsparkhub.calibrate import STS_FILE, sidecar_problems

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


def _check_layout_rules(d: OpenedDraft, out: _Collector) -> None:
    """Rules specific to one layout: K3DSparkConfig's refusals, V4 stage counts, hidden-state id 0."""
    spec, cfg = d.spec, d.checkpoint.config
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    if d.recipe.name == "k3-dspark":
        # vLLM 0.32 transformers_utils/configs/k3_dspark.py K3DSparkConfig.__init__
        for key in ("mla_use_nope", "mla_use_output_gate", "mla_use_qk_norm", "dspark_bonus_anchor"):
            if cfg.get(key):
                out.add("DSH109", f"`{key}` is true; vLLM's MLA DSpark does not support it",
                        location=f"{cfg_file} key {key}", expected="false", found=cfg.get(key))
        if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None:
            out.add("DSH109", "`q_lora_rank` is null; vLLM's MLA DSpark needs the low-rank query path",
                    location=f"{cfg_file} key q_lora_rank", expected="an integer (1536 for Kimi K3)", found="null")
        if spec.draft_vocab_size != spec.vocab_size:
            out.add("DSH109", "MLA DSpark requires draft_vocab_size == vocab_size (it shares the target's LM head)",
                    location=f"{cfg_file} key draft_vocab_size", expected=spec.vocab_size,
                    found=spec.draft_vocab_size)
        n = cfg.get("num_target_layers")
        if n != len(spec.target_layer_ids):
            out.add("DSH109", "`num_target_layers` must equal len(target_layer_ids) in a K3 config (the target's "
                    "layer count is `target_num_hidden_layers`)", location=f"{cfg_file} key num_target_layers",
                    expected=len(spec.target_layer_ids), found=n)
    archs = cfg.get("architectures") or []
    # (a speculators config is exempt: vLLM 0.32 transformers_utils/configs/speculators/algos.py:175-186 keeps only
    # Qwen3DSparkModel / Qwen3OmniDSparkModel and writes Qwen3DSparkModel otherwise, so speculators 0.9.0's own
    # `DSparkDraftModel` is served as Qwen3)
    if "DSparkDraftModel" in archs and spec.family == "qwen3" and d.recipe.name != "speculators":
        # vLLM 0.32 config/speculative.py:1423-1430 renames DSparkDraftModel to Qwen3DSparkModel only for
        # model_type == "qwen3"; registry.py maps DSparkDraftModel to the DeepSeek-V4 class otherwise. SGLang 0.5.23
        # maps it to its Qwen3-style dense class (models/dspark.py:967, EntryClass :995).
        model_type = cfg.get("model_type")
        if model_type != "qwen3":
            out.add("DSH115", f"architectures {archs} with model_type {model_type!r}: vLLM 0.32 loads this Qwen3 "
                    "drafter as DeepSeek-V4 (it renames DSparkDraftModel to Qwen3DSparkModel only for model_type "
                    "exactly `qwen3`); SGLang 0.5.23 loads it as its Qwen3-style DSparkDraftModel",
                    location=f"{cfg_file} key architectures", expected='["Qwen3DSparkModel"]', found=archs,
                    hint="`dsparkhub convert` writes architectures [\"Qwen3DSparkModel\"] and model_type qwen3")
    if d.recipe.name == "speculators" and "sample_from_anchor" not in cfg:
        # vLLM 0.32 speculators/algos.py update_dspark / update_dflash: config_dict.get("sample_from_anchor", False);
        # speculators' DSparkSpeculatorConfig defaults it to True
        out.add("DSH113", f"sample_from_anchor is absent: vLLM serves this {spec.variant} drafter as 1+N "
                f"({spec.proposals_per_block} proposals per block), while speculators' own DSpark default is "
                "anchor-first; if it was trained anchor-first every slot is shifted by one",
                location=f"{cfg_file} key sample_from_anchor", expected="true or false, written explicitly",
                found="absent", hint="check how it was trained, then convert with --declare-block-layout "
                                     "anchor_first if needed (convert always writes the key)")
    if d.recipe.name == "speculators" and spec.variant == "dspark" and spec.causal is not None:
        # vLLM 0.32 transformers_utils/configs/speculators/algos.py: update_dflash writes dflash_config.causal from
        # sliding_window_non_causal, update_dspark does not, so qwen3_dflash.py:86 falls back to the layer types
        sliding = [i for i, t in enumerate(spec.decoder_config.get("layer_types") or []) if t == "sliding_attention"]
        wrong = [i for i in sliding if i < len(spec.causal) and not spec.causal[i]]
        if wrong:
            out.add("DSH114", f"draft layers {wrong} are bidirectional sliding layers (sliding_window_non_causal: "
                    "true), but vLLM 0.32 serves a speculators DSpark's sliding layers causally (algos.py "
                    "update_dspark sets no `causal`; qwen3_dflash.py:86 then follows layer_types)",
                    location=f"{cfg_file} key sliding_window_non_causal", expected="causal as trained",
                    found="causal in vLLM", hint="serve the output of `dsparkhub convert` (--to vllm writes "
                                                 "is_causal: false, which vLLM reads first)")
    if d.recipe.stages:
        # vLLM 0.32 DSparkDeepseekV4Model.__init__: `n_mtp_layers or 3` (deepseek_v4/nvidia/dspark.py:111); V4.1:
        # `n_mtp_layers or num_nextn_predict_layers or 3` (deepseek_v41/nvidia/dspark.py:89-93). Too few built stages
        # make the extra mtp.{i}.* a KeyError at load; too many leave stages uninitialised.
        v41 = cfg.get("model_type") == "deepseek_v41"
        n_mtp, nextn = cfg.get("n_mtp_layers"), cfg.get("num_nextn_predict_layers")
        key = "n_mtp_layers" if n_mtp else "num_nextn_predict_layers" if v41 and nextn else None
        built = cfg[key] if key else 3
        if built != spec.num_layers:
            source = f"from `{key}`" if key else "its default: n_mtp_layers is absent" + (
                "" if v41 else " and V4 does not read num_nextn_predict_layers")
            out.add("DSH111", f"vLLM 0.32 builds {built} DSpark stages ({source}) but the checkpoint holds "
                    f"{spec.num_layers} (mtp.0 .. mtp.{spec.num_layers - 1})",
                    location=f"{cfg_file} key {key or 'n_mtp_layers'}", expected=spec.num_layers, found=built,
                    hint=f"set n_mtp_layers: {spec.num_layers} (`dsparkhub convert` / `attach` write it)")
        if nextn is not None and nextn != spec.num_layers and key != "num_nextn_predict_layers":
            out.add("DSH110", f"`num_nextn_predict_layers` says {nextn} but the checkpoint holds {spec.num_layers} "
                    f"drafter stages (mtp.0 .. mtp.{spec.num_layers - 1}); vLLM's DSpark path does not read it here",
                    location=f"{cfg_file} key num_nextn_predict_layers", expected=spec.num_layers, found=nextn,
                    hint="vLLM's DSpark path counts stages from n_mtp_layers")
    numbering = d.recipe.data.get("target_layer_ids_numbering")
    keys = d.recipe.read_keys("target_layer_ids")
    if numbering == "hidden_state_index" and -1 in spec.target_layer_ids:
        out.add("DSH308", "hidden-state index 0 (the embedding output) is among the target layer ids; in this "
                "layout ids are layer index + 1", location=f"{cfg_file} key {keys[0] if keys else '?'}",
                found=[i + 1 for i in spec.target_layer_ids],
                hint=f"if the ids were copied from a layer-index config, add 1 to each: "
                     f"{[i + 2 for i in spec.target_layer_ids]}")
    elif -1 in spec.target_layer_ids:
        out.add("DSH308", "layer id -1 (the embedding output) is among the target layer ids: hidden-state indices "
                "converted to layer indices twice? (a one-layer shift keeps τ almost unchanged, so verify will not "
                "show it)", location=f"{cfg_file} key {keys[0] if keys else '?'}", found=spec.target_layer_ids,
                hint=f"if the drafter was trained on layer outputs, the ids are "
                     f"{[i + 1 for i in spec.target_layer_ids]}; DeepSpec allows -1 only for a drafter trained on "
                     "the embedding output")


def _check_stage_names(spec: DraftSpec, out: _Collector) -> None:
    """Every stage of an open-layer family (DeepSeek-V4) must hold the same parameter names."""
    per_stage: dict[int, set[str]] = {i: set() for i in range(spec.num_layers)}
    for name in spec.tensors:
        m = re.match(r"layers\.(\d+)\.(.+)", name)
        if m and int(m.group(1)) in per_stage:
            per_stage[int(m.group(1))].add(m.group(2))
    union = set().union(*per_stage.values()) if per_stage else set()
    for i, names in per_stage.items():
        missing = sorted(union - names)
        if missing:
            out.add("DSH112", f"stage {i} lacks {len(missing)} parameter(s) the other stages hold, e.g. "
                    f"{missing[:3]}", location=f"stage mtp.{i}",
                    expected=f"{len(union)} parameters per stage", found=len(names))


def _check_d2t(d: OpenedDraft, out: _Collector) -> None:
    spec = d.spec
    name = spec.source_names.get("d2t", "d2t")
    info = d.checkpoint.tensors[name]
    if info.dtype != "I64":
        out.add("DSH205", "d2t must be int64 offsets (target_id = draft_id + d2t[draft_id])",
                location="tensor d2t", expected="I64", found=info.dtype)
        return
    if d.checkpoint.remote:
        return
    import torch

    d2t = d.checkpoint.read_tensor(name)
    targets = torch.arange(d2t.numel()) + d2t.reshape(-1)
    bad = ((targets < 0) | (targets >= spec.vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        out.add("DSH205", f"d2t maps draft id {i} to target id {int(targets[i])}, outside the vocab",
                location="tensor d2t", expected=f"0 <= id < {spec.vocab_size}", found=int(targets[i]))
    elif torch.unique(targets).numel() != targets.numel():
        out.add("DSH205", "d2t maps two draft ids to the same target id", location="tensor d2t")


def _check_target(d: OpenedDraft, t: TargetSpec, out: _Collector, engine: str = "vllm") -> None:
    spec = d.spec
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    if spec.target_hidden_size != t.hidden_size:
        out.add("DSH301", "the drafter was built for a target with another hidden size",
                location=f"{cfg_file} key target_hidden_size/hidden_size", expected=t.hidden_size,
                found=spec.target_hidden_size, hint=f"is {t.source} the target this drafter was trained on?")
    if spec.vocab_size != t.vocab_size:
        out.add("DSH302", "the drafter's input vocab differs from the target's", location=f"{cfg_file} key vocab_size",
                expected=t.vocab_size, found=spec.vocab_size, hint=f"is {t.source} the right target?")
    if spec.draft_vocab_size > t.vocab_size:
        out.add("DSH205", "draft vocab larger than the target vocab", location=f"{cfg_file} key draft_vocab_size",
                expected=f"<= {t.vocab_size}", found=spec.draft_vocab_size)
    _check_family(d, t, out)
    L = t.num_hidden_layers
    ids = spec.target_layer_ids
    outside = [i for i in ids if not -1 <= i < L]
    if outside:
        hint = ""
        if max(ids) == L and all(-1 <= i - 1 < L for i in ids):
            hint = (f"ids {ids} look like hidden-state indices (layer index + 1); in layer-index numbering "
                    f"they are {[i - 1 for i in ids]}, which include the target's last layer {L - 1}: its state is "
                    "pre-norm in vLLM but normed in HF output_hidden_states (DSH304 for the reference engine, "
                    "DSH313 for vLLM); ids that stop at layer " + str(L - 2) + " read the same everywhere")
        out.add("DSH303", f"target layer ids {outside} are outside the target's {L} layers",
                location=f"{cfg_file} key target_layer_ids", expected=f"-1 <= id <= {L - 2}", found=ids,
                hint=hint or "layer ids are 0-based decoder-layer indices")
    elif L - 1 in ids:
        _check_final_layer(d, t, out, engine)
    if spec.num_target_layers is not None \
            and spec.layout in ("deepspec", "vllm", "zlab-dflash", "k3-dspark", "speculators") \
            and spec.num_target_layers != L:
        out.add("DSH306", "the drafter records a target with another number of layers",
                location=f"{cfg_file} key num_target_layers", expected=L, found=spec.num_target_layers,
                hint=f"is {t.source} the target this drafter was trained on?")
    named = spec.target_ref.get("name_or_path")
    repo = None
    if t.manifest:
        from dsparkhub.layouts.manifests import get_manifest

        repo = get_manifest(t.manifest).repo_id
    elif not t.local:
        repo = t.source.partition("@")[0]
    if named and repo and named.rstrip("/").lower() != repo.lower():
        out.add("DSH310", f"the drafter's config names its target (verifier) {named!r}, but it is checked against "
                f"{repo!r}", location=f"{cfg_file} key speculators_config.verifier.name_or_path", expected=repo,
                found=named, hint="a drafter only drafts well for the target it was trained on; vLLM serves the "
                                  "verifier named here when given this drafter folder alone")
    usual = t.default_target_layer_ids
    if usual and len(usual) == len(ids) and list(ids) != list(usual):
        for shift in (1, -1):
            if [i + shift for i in ids] == list(usual):
                out.add("DSH309", f"target layer ids {ids} are {t.source}'s usual drafter ids {list(usual)} shifted "
                        f"by {-shift:+d}: hidden-state indices read as layer indices (or the reverse)?",
                        location=f"{cfg_file} key target_layer_ids", expected=list(usual), found=ids,
                        hint="layer index i = HF output_hidden_states[i + 1]; speculators / DeepSeek-V4 ids are "
                             "hidden-state indices")
    for own, ref, label in (("embed_tokens.weight", t.embed, "embedding"), ("lm_head.weight", t.lm_head, "LM head")):
        if ref is None:
            out.add("DSH307", f"the target's {label} tensor was not found in its headers; copies not compared",
                    location=t.source)
            continue
        mine = spec.tensors.get(own)
        if mine is None or (own == "lm_head.weight" and spec.draft_vocab_size != spec.vocab_size):
            continue
        if mine.shape != ref.shape or mine.dtype != ref.dtype:
            out.add("DSH305", f"the drafter's {own} is {mine.dtype} {list(mine.shape)}, the target's {ref.name} is "
                    f"{ref.dtype} {list(ref.shape)}", location=f"tensor {own}",
                    expected=f"{ref.dtype} {list(ref.shape)}", found=f"{mine.dtype} {list(mine.shape)}")


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

    from dsparkhub.errors import CheckpointFormatError

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


def _check_values(d: OpenedDraft, out: _Collector) -> None:
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
#: where each engine reads a target layer's state: ``raw`` = the decoder layer's output before the final norm
#: (vLLM 0.32 model_executor/models/qwen2.py:430-445 ``_maybe_add_hidden_state`` before ``self.norm``, which Qwen3
#: inherits; deepseek_v4/nvidia/model.py:1482-1495), ``normed`` = HF ``output_hidden_states``, whose last entry is
#: the final norm's output (the reference engine; DeepSpec eval/base_evaluator.py:100-112).
ENGINE_FINAL_LAYER_STATE = {"vllm": "raw", "reference": "normed"}


def _check_final_layer(d: OpenedDraft, t: TargetSpec, out: _Collector, engine: str) -> None:
    """The target's last layer among the ids: DSH304 where the engine reads its state otherwise than the layout's
    trainer saw it (recipe key ``final_layer_state``, default ``raw``), else DSH313."""
    spec, L = d.spec, t.num_hidden_layers
    cfg_file = str(Path(d.checkpoint.path) / "config.json")
    trained = d.recipe.data.get("final_layer_state", "raw")
    served = ENGINE_FINAL_LAYER_STATE[engine]
    sources = (d.recipe.data.get("final_layer_state_source")
               or "the layout's trainer is assumed to read decoder-layer outputs, as vLLM does")
    shifted = "; if these are hidden-state indices, subtract 1 from each" if min(spec.target_layer_ids) >= 1 else ""
    if trained != served:
        out.add("DSH304", f"target layer id {L - 1} is the target's last layer: the {engine} engine reads its state "
                f"{'after' if served == 'normed' else 'before'} the final norm "
                f"({'HF output_hidden_states' if served == 'normed' else 'vLLM aux hidden states'}), while this "
                f"{d.recipe.name} drafter was trained on it {'after' if trained == 'normed' else 'before'}",
                location=f"{cfg_file} key target_layer_ids", expected=f"<= {L - 2}", found=spec.target_layer_ids,
                hint=f"{sources}; DeepSpec's evaluator refuses these ids for the same reason "
                     f"(eval/base_evaluator.py:100-112 assert_no_final_target_layer){shifted}")
    else:
        out.add("DSH313", f"target layer id {L - 1} is the target's last layer: {engine} reads its state as the "
                f"{d.recipe.name} trainer did ({served}), but HF output_hidden_states returns it normed, so the "
                "reference engine (`verify --backend reference`) and DeepSpec's evaluator refuse this drafter",
                location=f"{cfg_file} key target_layer_ids", expected=f"<= {L - 2} for every engine",
                found=spec.target_layer_ids,
                hint=f"{sources}; verify it with --backend vllm{shifted}")


def _check_family(d: OpenedDraft, t: TargetSpec, out: _Collector) -> None:
    """A DSpark drafter serves targets of its own backbone family only: vLLM 0.32 has one DSpark class per family
    (qwen3_dspark.py, gemma4_dspark.py, deepseek_v4/*/dspark.py, K3DSparkConfig) and DeepSpec one trainer per target
    family (deepspec/trainer/dspark_trainer.py Qwen3DSparkTrainer / Gemma4DSparkTrainer). DFlash / EAGLE-3 drafters
    are exempt: z-lab ships Qwen3-backbone DFlash drafters for Llama and gpt-oss targets."""
    from dsparkhub.layouts.families import family_of_target

    spec = d.spec
    if spec.variant != "dspark" and spec.layout != "deepspec":
        return
    theirs = family_of_target(t.model_type)
    if theirs is None or theirs == spec.family:
        return
    out.add("DSH311", f"the drafter is a {spec.family} {spec.variant} drafter ({spec.architecture or spec.layout}) "
            f"but the target {t.source} is {t.model_type!r}, a {theirs} model", location=str(
                Path(d.checkpoint.path) / "config.json") + " key architectures",
            expected=theirs, found=spec.family,
            hint=f"a DSpark drafter is trained for one target family and vLLM 0.32 serves a {theirs} target's DSpark "
                 f"drafter with its own class (converters/families/{theirs}.yaml target_model_types); is "
                 f"{t.source} the target this drafter was trained on?")


def validate(draft: str | Path | OpenedDraft, target: str | Path | TargetSpec | None = None, *,
             num_speculative_tokens: int | None = None, layout: str | None = None,
             deep: bool = False, engine: str = "vllm") -> ValidationReport:
    """Check a drafter against vLLM 0.32's contract and, when given, its target — headers and configs only.

    Args:
        draft: drafter folder in any known layout (or an already opened one).
        target: local HF folder, Hub repo id, or an opened :class:`TargetSpec`; None skips the target checks.
        num_speculative_tokens: the n you intend to serve with, checked against the block size.
        layout: force the drafter's layout instead of detecting it.
        deep: also read every floating tensor of the drafter and report NaN / Inf values (DSH207); reads all of
            the drafter's bytes, in 16 MiB chunks.
        engine: the engine that will read the target's hidden states, a key of :data:`ENGINE_FINAL_LAYER_STATE`
            (``"vllm"``, default; ``"reference"``): decides whether the target's last layer among the ids is an
            error (DSH304) or a warning (DSH313).

    Returns:
        :class:`ValidationReport` with every finding; ``report.ok`` is False when any finding is an error.

    Raises:
        dsparkhub.errors.DsparkhubError subclasses when the drafter or target cannot be read at all
        (missing folder, malformed safetensors or config, unknown layout).
    """
    d = draft if isinstance(draft, OpenedDraft) else open_draft(draft, layout=layout)
    t = target if isinstance(target, TargetSpec) or target is None else open_target(target)
    if engine not in ENGINE_FINAL_LAYER_STATE:
        raise ValueError(f"engine {engine!r}: expected one of {sorted(ENGINE_FINAL_LAYER_STATE)}")
    out = _Collector()
    _check_intrinsic(d, out, num_speculative_tokens)
    if deep:
        _check_values(d, out)
    if t is not None:
        _check_target(d, t, out, engine)
    findings = sorted(out.items, key=lambda f: (_ORDER[f.severity], f.code, f.location))
    return ValidationReport(str(d.checkpoint.path), None if t is None else t.source, d.recipe.name, findings,
                            d.spec.summary())

