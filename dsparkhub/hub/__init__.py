"""The only networked package: push a release to the Hugging Face Hub and read remote checkpoint headers."""
