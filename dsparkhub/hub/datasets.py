"""Re-exports :mod:`dsparkhub.io.hub_datasets` (prompt files from Hub dataset repos), which moved below the prompt
readers that use it."""

from dsparkhub.io.hub_datasets import OFFLINE_HINT, fetch_dataset_jsonl, hub_unreachable

__all__ = ["OFFLINE_HINT", "fetch_dataset_jsonl", "hub_unreachable"]
