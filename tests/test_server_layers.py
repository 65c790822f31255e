"""The server's layer rule, as docs/architecture.md states it, against the
code: each folder of server_cpp/src is a layer, and a file includes only
headers of its own layer and of the layers below it (tests included: a
test of a lower layer needs nothing above it either)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "server_cpp" / "src"


def _layers() -> dict[str, int]:
    """Each layer's height, from the rule's line in docs/architecture.md
    (``daemon → rpc → ... → common``; ``a / b`` share a height and include
    neither each other)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rule = next(line for line in text.splitlines() if line.count("→") >= 3)
    levels = [level.split("/") for level in rule.split("→")]
    height = {}
    for i, level in enumerate(reversed(levels)):
        for name in level:
            height[name.strip()] = i
    return height


def _violations(height: dict[str, int], src: Path = SRC) -> list[str]:
    found = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        own = path.relative_to(src).parts[0]
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([a-z_]+)/', line)
            if not m or m.group(1) not in height or m.group(1) == own:
                continue
            if height[m.group(1)] >= height[own]:
                found.append(f"{path.relative_to(src)}:{n}: {own}/ includes {m.group(1)}/ "
                             f"({line.strip()})")
    return found


def test_every_folder_of_the_server_is_a_layer_of_the_rule():
    height = _layers()
    folders = {p.name for p in SRC.iterdir() if p.is_dir()}
    assert folders == set(height), (folders, height)


def test_no_layer_includes_a_layer_above_it_or_beside_it():
    violations = _violations(_layers())
    assert violations == [], "\n".join(violations)


def test_the_check_finds_an_include_from_below(tmp_path):
    """The walk itself: a cache/ file including rpc/ is reported."""
    fake = tmp_path / "server_cpp" / "src"
    for layer in _layers():
        (fake / layer).mkdir(parents=True)
    (fake / "cache" / "x.cc").write_text('#include "cache/cache.h"\n#include "rpc/service.h"\n')
    (fake / "persist" / "y.cc").write_text('#include "meta/meta_store.h"\n')
    found = _violations(_layers(), fake)
    assert [f.split(": ", 1)[1] for f in found] == [
        'cache/ includes rpc/ (#include "rpc/service.h")',
        'persist/ includes meta/ (#include "meta/meta_store.h")']
