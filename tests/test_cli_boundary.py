"""One CLI error boundary (issue 28): an ordered mapping exception class -> renderer in ``dsparkhub.cli.errors``,
installed on every command by the group, instead of a decorator on each command."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from dsparkhub.cli import main
from dsparkhub.cli.errors import ERRORS, EXIT_FAILED, install_boundary
from dsparkhub.errors import LayoutError


def _leaves(group: click.Group):
    for command in group.commands.values():
        yield from _leaves(command) if isinstance(command, click.Group) else [command]


def test_no_entry_of_the_mapping_is_shadowed_by_an_earlier_one():
    classes = [cls for cls, _ in ERRORS]
    assert classes[:2] == [KeyboardInterrupt, BrokenPipeError]
    assert [(a.__name__, b.__name__) for i, a in enumerate(classes) for b in classes[i + 1:] if issubclass(b, a)] == []


def test_every_command_is_behind_the_one_boundary_and_none_carries_its_own():
    leaves = list(_leaves(main))
    assert len(leaves) >= 17 and all(getattr(c.callback, "_dsparkhub_boundary", False) for c in leaves)
    sources = (Path(__file__).resolve().parents[1] / "dsparkhub" / "cli").glob("*.py")
    assert [p.name for p in sources if "@handle_errors" in p.read_text()] == []


def test_a_new_command_gets_the_mapping_from_the_group():
    @click.group()
    def group():
        pass

    @group.command()
    def broken():
        raise LayoutError("no recipe matches", path="x/config.json", hint="pass a layout")

    install_boundary(group)
    install_boundary(group)  # idempotent: wrapped once
    res = CliRunner().invoke(group, ["broken"])
    assert res.exit_code == EXIT_FAILED
    assert res.output.startswith("Error (LayoutError): x/config.json: no recipe matches")
    assert "Hint: pass a layout" in res.output
