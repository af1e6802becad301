"""``dsparkhub hub serve``: the local Hub of :mod:`dsparkhub.testing.hub_server` (the one the tests and ``quickstart``
push to), started for a user to rehearse a push against: ``dsparkhub push DRAFT --repo USER/NAME --endpoint URL
--token TOKEN`` with what it prints. It speaks the classic LFS upload path of huggingface_hub, not xet (hence the
``HF_HUB_DISABLE_XET=1`` it prints: huggingface_hub 2.4 uploads through xet whenever ``hf_xet`` is installed), and keeps
repositories in memory: they are gone when it stops (file bytes stay under ``--dir`` when one is given)."""

from __future__ import annotations

import click



@click.group()
def hub() -> None:
    """A local Hugging Face Hub to rehearse a push against."""


@hub.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0 = a free one).")
@click.option("--dir", "root", type=click.Path(file_okay=False),
              help="Folder for the uploaded file bytes (default: a temporary folder removed on exit).")
@click.option("--user", default="local", show_default=True,
              help="The token's user: repos are created under this namespace (use your real one to rehearse the "
                   "exact repo id).")
@click.option("--token", help="Token to accept (default: a fresh random one, printed).")
def serve(port: int, root: str | None, user: str, token: str | None) -> None:
    """Start the local Hub on 127.0.0.1 and print the endpoint and token to push with; Ctrl-C stops it."""
    import secrets  # here, not at import: every `dsparkhub` start imports this module (~10 ms of stdlib)
    import tempfile
    import threading
    from contextlib import ExitStack

    from dsparkhub.testing.hub_server.hub import LocalHub

    token = token or "hf_local" + secrets.token_hex(16)
    with ExitStack() as stack:
        folder = root or stack.enter_context(tempfile.TemporaryDirectory(prefix="dsparkhub-localhub-"))
        server = LocalHub(folder, tokens={token: user}).start(port)
        stack.callback(server.stop)
        click.echo(f"local Hub at {server.url} (files under {folder}; repos are kept in memory until it stops)")
        click.echo(f"  user      {user}")
        click.echo(f"  token     {token}")
        # huggingface_hub uploads through xet whenever hf_xet is installed; this server speaks the LFS path only
        click.echo(f"  rehearse  HF_HUB_DISABLE_XET=1 dsparkhub push DRAFT --repo {user}/NAME --endpoint {server.url} "
                   f"--token {token}")
        click.echo("Ctrl-C stops it")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            click.echo(f"\nstopped the local Hub at {server.url}", err=True)
