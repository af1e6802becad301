"""``python -m dsparkhub.cli``: the same as the ``dsparkhub`` command."""

from dsparkhub.cli import main

main()
