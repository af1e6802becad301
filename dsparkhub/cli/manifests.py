"""Commands on the shipped manifests: ``manifests list|show`` and ``skeleton``."""

from __future__ import annotations

import click

from dsparkhub.cli.options import OVERWRITE_HELP
from dsparkhub.cli.render import echo_json, fmt_bytes


@click.group()
def manifests() -> None:
    """Targets and seed releases dsparkhub knows (manifests/)."""


@manifests.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def manifests_list(as_json: bool) -> None:
    """List target and release manifests."""
    from dsparkhub.layouts.manifests import load_manifests

    targets, releases = load_manifests()
    if as_json:
        echo_json({"targets": {n: t.to_dict() for n, t in targets.items()},
                   "releases": {n: r.to_dict() for n, r in releases.items()}})
        return
    click.echo("targets:")
    for n, t in sorted(targets.items()):
        unverified = sorted(k for k, f in t.facts.items() if not f.get("verified"))
        click.echo(f"  {n:<18} {t.repo_id:<34} {t.model_type:<13} H {t.hidden_size:<5} L {t.num_hidden_layers:<3} "
                   f"V {t.vocab_size:<7}" + (f" unverified: {', '.join(unverified)}" if unverified else ""))
    click.echo("releases:")
    for n, r in sorted(releases.items()):
        click.echo(f"  {n:<30} {r.publisher:<11} target {r.target:<18} {r.layout} ({r.variant}), "
                   f"{len(r.published)} published number(s)")


@manifests.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def manifests_show(name: str, as_json: bool) -> None:
    """Show one manifest, with the provenance of each value."""
    import yaml

    from dsparkhub.layouts.manifests import TargetManifest, get_manifest, unshipped_citations

    m = get_manifest(name)
    data = m.to_dict()
    if as_json:
        echo_json(data)
        return
    data.pop("checkpoint", None)
    facts = data.pop("facts", {})
    click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=116).rstrip())
    click.echo("provenance:")
    unshipped: set[str] = set()
    for k, f in facts.items():
        cites = unshipped_citations(f["source"])
        unshipped.update(cites)
        click.echo(f"  {k}: {'verified' if f['verified'] else 'NOT verified'} — {f['source']}"
                   + (" [*]" if cites else ""))
    from dsparkhub.card.multinode import multinode_commands

    if isinstance(m, TargetManifest) and (commands := multinode_commands(m)):
        click.echo("serve across nodes (vLLM on Ray):\n" + commands)
    if unshipped:
        click.echo(f"  [*] cites the project's working notes ({', '.join(sorted(unshipped))}), which are not in "
                   "this repository: a value resting on them alone cannot be checked from here")


@click.command()
@click.argument("manifest")
@click.option("--out", "out", required=True, type=click.Path(), help="Output folder.")
@click.option("--tiny", is_flag=True, help="Tiny dimensions with random values instead of a real-size sparse file.")
@click.option("--with-drafter", is_flag=True, help="DeepSeek-V4: also write the attached mtp.* drafter stages.")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
def skeleton(manifest: str, out: str, tiny: bool, with_drafter: bool, overwrite: bool) -> None:
    """Write a target checkpoint from a manifest: real names / shapes / dtypes / shards as sparse files."""
    from dsparkhub.skeleton import write_skeleton

    r = write_skeleton(manifest, out, tiny=tiny, with_drafter=with_drafter, overwrite=overwrite)
    if r.manifest and r.manifest != manifest and not r.manifest.startswith(manifest):
        click.echo(f"note: {manifest} is a release; wrote its target {r.manifest}", err=True)
    click.echo(f"wrote {r.out}: {r.num_tensors} tensors in {len(r.files)} shard(s), {fmt_bytes(r.logical_bytes)} "
               f"logical, {fmt_bytes(r.disk_bytes)} on disk" + (" (sparse)" if r.sparse else ""))
