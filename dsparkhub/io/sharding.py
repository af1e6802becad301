"""How tensors are grouped into size-capped shards: one rule for every writer (convert, attach).

The grouping is ``huggingface_hub.split_state_dict_into_shards_factory`` (the rule transformers ``save_pretrained``
uses), applied to byte sizes only: tensors are taken in order and a shard is closed when the next tensor would take
it over the cap. A tensor larger than the cap gets a shard of its own, placed before the shard still being filled
(huggingface_hub's order; the loops this replaced closed the shard being filled first, so with a cap below a
tensor's size the shard numbering of the tensors around it differs; every default cap is at least the largest
tensor, where the two agree exactly).
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_shards(sizes: Sequence[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Group tensor names into shards of at most ``max_shard_bytes`` bytes each, keeping their order.

    Args:
        sizes: ``(tensor name, bytes)`` in output order; names must be distinct.
        max_shard_bytes: shard size cap in bytes.

    Returns:
        the names of each shard, in shard order; ``[[]]`` (one empty shard) for no tensors.

    Raises:
        ValueError: a name appears twice.
    """
    from huggingface_hub import split_state_dict_into_shards_factory

    by_name = dict(sizes)
    if len(by_name) != len(sizes):
        seen: set[str] = set()
        twice = next(n for n, _ in sizes if n in seen or seen.add(n))
        raise ValueError(f"tensor {twice!r} is listed twice")
    if not by_name:
        return [[]]
    split = split_state_dict_into_shards_factory(by_name, get_storage_size=int, filename_pattern="{suffix}",
                                                 max_shard_size=max_shard_bytes)
    return list(split.filename_to_tensors.values())
