"""Push a release to the Hugging Face Hub: the last writer of the flow, above the card.

Modules: :mod:`~dsparkhub.hub.push` (plan, one commit, resume), :mod:`~dsparkhub.hub.files` (which local files go,
which remote ones are deleted), :mod:`~dsparkhub.hub.remote` (a repo's state, the read-back check). The Hub *reading*
client lives at the bottom of the stack, in ``dsparkhub.io``: :mod:`~dsparkhub.io.hub_checkpoint` (remote checkpoint
headers), :mod:`~dsparkhub.io.hub_datasets` (prompt files from dataset repos), :mod:`~dsparkhub.io.hub_errors`
(huggingface_hub errors -> ``HubError``); ``hub.errors`` / ``hub.datasets`` re-export them.
"""
