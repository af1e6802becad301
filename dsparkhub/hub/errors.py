"""Re-exports :mod:`dsparkhub.io.hub_errors` (huggingface_hub errors -> ``HubError``), which moved below the target
so the Hub reading client (:mod:`dsparkhub.io.hub_checkpoint`) need not import this package."""

from dsparkhub.io.hub_errors import HUB_ERRORS, hub_error, is_upload_failure, redactor

__all__ = ["HUB_ERRORS", "hub_error", "is_upload_failure", "redactor"]
