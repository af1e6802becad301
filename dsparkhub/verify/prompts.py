"""Re-exports :mod:`dsparkhub.prompts.datasets` (prompt datasets for ``verify``), which moved below ``convert`` and
``verify`` so both can read prompts without an import against the flow."""

from dsparkhub.prompts.datasets import (BUILTIN, TOKENIZER_FILES, Dataset, builtin_path, has_tokenizer, load_datasets,
                                        load_tokenizer, parse_dataset_specs, read_jsonl, read_spec, tokenize)
from dsparkhub.prompts.files import PromptFileError, PromptRecord

__all__ = ["BUILTIN", "TOKENIZER_FILES", "Dataset", "PromptFileError", "PromptRecord", "builtin_path", "has_tokenizer",
           "load_datasets", "load_tokenizer", "parse_dataset_specs", "read_jsonl", "read_spec", "tokenize"]
