"""The only networked package: push a release to the Hugging Face Hub and read from it.

Modules: :mod:`~dsparkhub.hub.push` (plan, one commit, resume), :mod:`~dsparkhub.hub.files` (which local files go,
which remote ones are deleted), :mod:`~dsparkhub.hub.remote` (a repo's state, the read-back check, remote checkpoint
headers), :mod:`~dsparkhub.hub.errors` (huggingface_hub errors -> ``HubError``), :mod:`~dsparkhub.hub.datasets`
(prompt files from dataset repos).
"""
