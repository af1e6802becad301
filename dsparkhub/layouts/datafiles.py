"""The data folders dsparkhub reads (``converters/``, ``manifests/``) and the one loader of their YAML files.

Folder resolution: ``$DSPARKHUB_<KIND>_DIR``, the copy shipped in the wheel (``dsparkhub/_data/<kind>``), or the
repository's own top-level folder. Files are parsed with libyaml's safe loader when PyYAML was built with it (~70x
faster than the pure-Python one; same result) and checked against their strict schema
(:mod:`dsparkhub.layouts.schemas`, :mod:`dsparkhub.layouts.schema_errors`). Does not interpret what a file says (recipes, families, manifests).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from dsparkhub.errors import DsparkhubError
from dsparkhub.layouts.schema_errors import check

#: libyaml's safe loader when PyYAML was built with it (~70x faster than the pure-Python one; same result)
SAFE_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def data_dir(kind: str) -> Path:
    """A top-level data folder (``converters`` or ``manifests``): ``$DSPARKHUB_<KIND>_DIR``, the copy shipped in
    the wheel (``dsparkhub/_data/<kind>``), or the repository's own folder."""
    env = os.environ.get(f"DSPARKHUB_{kind.upper()}_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent  # dsparkhub/
    packaged = package / "_data" / kind
    return packaged if packaged.is_dir() else package.parent / kind


def converters_dir() -> Path:
    """Folder of recipe files: ``$DSPARKHUB_CONVERTERS_DIR``, the copy shipped in the wheel, or the repo's."""
    return data_dir("converters")


def load_yaml_mappings(folder: str | Path, *, what: str, error: type[DsparkhubError],
                       schema: type | None = None) -> list[tuple[Path, dict]]:
    """Every ``*.yaml`` file of ``folder`` (sorted by file name) parsed with :data:`SAFE_YAML`, each checked
    against ``schema`` when one is given.

    Args:
        folder: the folder (a missing folder has no files).
        what: what one file is, for messages (``"recipe"``, ``"family table"``, ``"target manifest"``).
        error: the error class raised (``LayoutError``, ``ManifestError``), with the file as ``path``.
        schema: a Struct of :mod:`dsparkhub.layouts.schemas` (strict types, unknown keys refused), or None.

    Returns:
        ``[(path, mapping)]``: the parsed mappings themselves (the schema only checks them).

    Raises:
        error: a file is not valid YAML, not a mapping, or breaks ``schema`` (the message names the key path, what
            was expected and what was found).
    """
    out = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            data = yaml.load(path.read_text(), Loader=SAFE_YAML)
        except yaml.YAMLError as exc:
            raise error(f"{what} is not valid YAML: {exc}", path=path) from None
        if not isinstance(data, dict):
            raise error(f"{what} must be a mapping, found {type(data).__name__}", path=path)
        if schema is not None:
            check(data, schema, what=what, path=path, error=error)
        out.append((path, data))
    return out
