"""The strict schemas of the YAML data files (dsparkhub.layouts.schemas): every shipped file loads; an unknown key, a
wrong type and a missing key in each file kind fail with the file, the key path, what was expected and what was
found; a fuzzed shipped file either loads or raises the project's error, never a raw msgspec / KeyError / TypeError."""

from __future__ import annotations

import copy
import shutil
import tempfile
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsparkhub.errors import DsparkhubError, LayoutError, ManifestError
from dsparkhub.layouts import families, manifests, recipes, schema_errors, schemas
from dsparkhub.layouts.datafiles import converters_dir
from dsparkhub.layouts.writing import DERIVED_TENSORS

CONVERTERS = converters_dir()
FAMILIES = CONVERTERS / "families"
MANIFESTS = manifests.manifests_dir()
KINDS = {  # kind: (folder of shipped files, schema, what, error)
    "recipe": (CONVERTERS, schemas.RecipeSchema, "recipe", LayoutError),
    "family": (FAMILIES, schemas.FamilyTableSchema, "family table", LayoutError),
    "target": (MANIFESTS / "targets", schemas.TargetSchema, "target manifest", ManifestError),
    "release": (MANIFESTS / "releases", schemas.ReleaseSchema, "release manifest", ManifestError),
}


def _read(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _load(kind: str, folder: Path):
    """Load ``folder`` (laid out as the shipped one) with the reader of ``kind``, exercising what callers use."""
    if kind == "recipe":
        for r in recipes.load_recipes(folder):
            r.rules, r.drop, r.stages, r.keeps("fc.weight"), r.is_ignored_file("x.pt")
            r.matches({"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3"})
            for name in r.data.get("fields") or {}:
                r.read_keys(name), r.write_key(name)
            recipes.extra_key_map(r), recipes.block_layout_of(r)
            recipes.keyed({}, r.data.get("variant")), recipes.keyed({}, r.data.get("target_layer_ids_numbering"))
        return
    if kind == "family":
        families._tables(str(folder))
        return
    targets, _ = manifests.load_manifests(folder)
    for t in targets.values():
        manifests.tensor_info(t.embed), t.verified("hidden_size"), t.to_dict()


def _folder_with(kind: str, name: str, data: dict, root: Path) -> Path:
    """A data folder holding the (edited) file ``name`` of ``kind`` and what it needs (a release: its target)."""
    if kind in ("recipe", "family"):
        (root / f"{name}.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
        return root
    (root / "targets").mkdir()
    (root / "releases").mkdir()
    (root / f"{kind}s" / f"{name}.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    if kind == "release" and isinstance(data, dict) and isinstance(data.get("target"), str) \
            and (MANIFESTS / "targets" / f"{data['target']}.yaml").is_file():
        shutil.copy(MANIFESTS / "targets" / f"{data['target']}.yaml", root / "targets")
    return root


def test_every_shipped_data_file_passes_its_schema():
    counts = {}
    for kind, (folder, schema, what, error) in KINDS.items():
        files = sorted(folder.glob("*.yaml"))
        for path in files:
            schema_errors.check(_read(path), schema, what=what, path=path, error=error)
        counts[kind] = len(files)
    assert counts == {"recipe": 14, "family": 8, "target": 9, "release": 6}
    assert len(recipes.load_recipes()) == 14 and len(families._tables(str(FAMILIES))) == 8
    targets, releases = manifests.load_manifests()
    assert (len(targets), len(releases)) == (9, 6)


def test_recipe_derive_names_the_tensors_writing_can_derive():
    (literal,) = typing.get_args(typing.get_type_hints(schemas.Write)["derive"])  # list[Literal[...]]
    assert set(typing.get_args(literal)) == set(DERIVED_TENSORS)


# (kind, shipped file, edit, message fragments: key path, expected, found)
BAD = [
    ("recipe", "vllm", lambda d: d.update(colour="red"), ["unknown recipe key `colour`", "known keys there:"]),
    ("recipe", "k3-dspark", lambda d: d["tensors"]["rename"][2].update(canonical=3),
     ["recipe key `tensors.rename[2].canonical`: expected a string, found int 3"]),
    ("recipe", "vllm", lambda d: d.pop("detect"), ["recipe lacks required key `detect`"]),
    ("recipe", "speculators-eagle3", lambda d: d["fields"]["block_size"].pop("write"),
     ["recipe lacks required key `fields.block_size.write`"]),
    ("recipe", "vllm", lambda d: d["write"]["layout_key"]["sample_from_anchor"].pop("one_plus_n"),
     ["recipe lacks required key `write.layout_key.sample_from_anchor.one_plus_n`"]),
    ("recipe", "deepseek-v4", lambda d: d["tensors"]["stages"]["shared_on_last_stage"].update({"main_norm.": 1}),
     ["recipe key `tensors.stages.shared_on_last_stage['main_norm.']`: expected a string, found int 1"]),
    ("recipe", "vllm", lambda d: d.update(block_layout="sideways"),
     ["recipe key `block_layout`: expected a mapping or one of 'anchor_first', 'one_plus_n', found str 'sideways'"]),
    ("recipe", "vllm", lambda d: d["write"].update(derive=["d2t"]),
     ["recipe key `write.derive[0]`: expected one of 't2d', found str 'd2t'"]),
    ("recipe", "vllm", lambda d: d.update(tensors=None), ["recipe key `tensors`: expected a mapping, found null"]),
    ("recipe", "vllm", lambda d: d.update({1: "x"}), ["recipe keys must be strings, found key int 1"]),
    ("recipe", "k3-dspark", lambda d: d["tensors"]["rename"][0].update(canonical="fc.{i}"),
     ["recipe key `tensors.rename[0]`: expected the same placeholders", "'context_proj.{rest}' -> 'fc.{i}'"]),
    ("recipe", "vllm", lambda d: d["tensors"].update(drop=["t2d", "(unclosed"]),
     ["recipe key `tensors.drop[1]`: expected a regular expression, found '(unclosed'"]),
    ("family", "qwen3", lambda d: d.update(colour="red"), ["unknown family table key `colour`"]),
    ("family", "qwen3", lambda d: d["vars"]["nh"].update(keys="num_attention_heads"),
     ["family table key `vars.nh.keys`: expected a list, found str 'num_attention_heads'"]),
    ("family", "qwen3", lambda d: d["per_layer"][3].pop("shape"),
     ["family table lacks required key `per_layer[3].shape`"]),
    ("family", "qwen3", lambda d: d["per_layer"][3].update(shape="all"),
     ["family table key `per_layer[3].shape`: expected a list or one of 'any', found str 'all'"]),
    ("family", "gemma4", lambda d: d["backbone"][0].update(shape=["H", "A *"]),
     ["family table key `backbone[0].shape[1]`: expected an expression", "found 'A *'"]),
    ("target", "qwen3-8b", lambda d: d["serving"].update(colour="red"), ["unknown target manifest key `serving.colour`"]),
    ("target", "qwen3-8b", lambda d: d.update(hidden_size="4096"),
     ["target manifest key `hidden_size`: expected an integer >= 1, found str '4096'"]),
    ("target", "qwen3-8b", lambda d: d.update(hidden_size=True),
     ["target manifest key `hidden_size`: expected an integer >= 1, found bool True"]),
    ("target", "qwen3-8b", lambda d: d["lm_head"].pop("dtype"), ["target manifest lacks required key `lm_head.dtype`"]),
    ("target", "qwen3-8b", lambda d: d["embed"].update(shape=[151936, -1]),
     ["target manifest key `embed.shape[1]`: expected an integer >= 0, found int -1"]),
    ("target", "kimi-k3", lambda d: d["checkpoint"]["per_layer"][1].update(dtype="BF17"),
     ["target manifest key `checkpoint.per_layer[1].dtype`: expected a safetensors dtype code (", "found str 'BF17'"]),
    ("target", "qwen3-8b", lambda d: d.update(kind="release"),
     ["target manifest key `kind`: expected one of 'target', found str 'release'"]),
    ("release", "lightseek-kimi-k3-dspark", lambda d: d.update(colour="red"), ["unknown release manifest key `colour`"]),
    ("release", "lightseek-kimi-k3-dspark", lambda d: d["published"][0].update(value=[3.49]),
     ["release manifest key `published[0].value`: expected a number or a string, found list [3.49]"]),
    ("release", "lightseek-kimi-k3-dspark", lambda d: d["published"][0].pop("source"),
     ["release manifest lacks required key `published[0].source`"]),
    ("release", "lightseek-kimi-k3-dspark", lambda d: d["facts"]["layout"].update(verified="no"),
     ["release manifest key `facts.layout.verified`: expected true or false, found str 'no'"]),
]


@pytest.mark.parametrize("kind,name,edit,fragments", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_file_names_file_key_expected_and_found(tmp_path, kind, name, edit, fragments):
    shipped, _, _, error = KINDS[kind]
    data = _read(shipped / f"{name}.yaml")
    edit(data)
    with pytest.raises(error) as exc:
        _load(kind, _folder_with(kind, name, data, tmp_path))
    text = str(exc.value)
    assert f"{name}.yaml" in text and exc.value.path.endswith(f"{name}.yaml")
    for fragment in fragments:
        assert fragment in text, text


def test_two_recipes_of_one_name_are_refused(tmp_path):
    shutil.copy(CONVERTERS / "vllm.yaml", tmp_path / "a.yaml")
    shutil.copy(CONVERTERS / "vllm.yaml", tmp_path / "b.yaml")
    with pytest.raises(LayoutError, match=r"recipe name 'vllm' is also the name of .*a\.yaml") as exc:
        recipes.load_recipes(tmp_path)
    assert exc.value.path.endswith("b.yaml")


# ---------------------------------------------------------------------------------------------------- fuzzing

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.sampled_from(["any", "t2d", "anchor_first", "BF16", "H", "{rest}", "(", "{x}"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def _mutations(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    folder = KINDS[kind][0]
    path = draw(st.sampled_from(sorted(folder.glob("*.yaml"))))
    data = copy.deepcopy(_read(path))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(_paths(data))))
        parent = data
        for step in where[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if not where:
            continue
        if action == "delete" and isinstance(parent, (dict, list)):
            del parent[where[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(_VALUES)
        else:
            parent[where[-1]] = draw(_VALUES)
    return kind, path.stem, data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzzed_shipped_file_loads_or_raises_the_projects_error(mutation):
    kind, name, data = mutation
    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder_with(kind, name, data, Path(tmp))
        try:
            _load(kind, folder)
        except DsparkhubError as exc:  # LayoutError / ManifestError: never msgspec's, a KeyError or a TypeError
            assert isinstance(exc, KINDS[kind][3]), exc
            assert exc.path and exc.path.startswith(tmp), exc  # the file (or folder) is named
