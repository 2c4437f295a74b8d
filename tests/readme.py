"""The README's shell commands, as its ```sh blocks type them: read by the unit test that
checks each parses, and by the lab test that runs the everyday ones against the lab."""

from __future__ import annotations

import shlex


def readme_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, words) of each command in the README's ```sh blocks: comments dropped,
    continued lines joined, an optional part's brackets removed (``[--limit x]``)."""
    commands: list[tuple[int, list[str]]] = []
    in_block, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() == "```sh"
            continue
        if not in_block or not (pending or line.strip()):
            continue
        start = start or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        unbracketed = [word.strip("[]") for word in words if word.strip("[]")]
        commands.append((start, unbracketed))
        start = 0
    return commands


def section_commands(text: str, heading: str) -> list[tuple[int, list[str]]]:
    """The commands of the ```sh blocks under ``heading`` (a ``## `` line), up to the next
    heading of that level."""
    lines = text.splitlines()
    start = lines.index(heading)
    end = next(
        (index for index in range(start + 1, len(lines)) if lines[index].startswith("## ")),
        len(lines),
    )
    blank = "\n" * start
    return readme_commands(blank + "\n".join(lines[start:end]))
