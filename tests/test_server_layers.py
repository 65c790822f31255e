"""The server's layer rule, as docs/architecture.md states it, against the
code: each folder of server_cpp/src is a layer, and a file includes only
headers of its own layer and of the layers below it (tests included: a
test of a lower layer needs nothing above it either). And the Cache's
callers see it through their interfaces: no product file of persist/,
ring/ or rpc/ reaches cache/cache.h, directly or through another header."""

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


# The layers that see the Cache only through their interface (the daemon,
# which makes the Cache, and the tests may include cache/cache.h).
CACHE_CALLERS = ("persist", "ring", "rpc")
CACHE_HEADER = "cache/cache.h"


def _project_includes(path: Path, src: Path) -> list[str]:
    """The project headers `path` includes, as paths relative to `src`."""
    found = []
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m and (src / m.group(1)).is_file():
            found.append(m.group(1))
    return found


def _test_files(src: Path) -> set[str]:
    """The tests (``*_test.cc``) and the headers only tests include."""
    files = {str(p.relative_to(src)) for p in src.rglob("*") if p.suffix in (".h", ".cc")}
    includers: dict[str, set[str]] = {f: set() for f in files}
    for f in files:
        for inc in _project_includes(src / f, src):
            includers.setdefault(inc, set()).add(f)
    tests = {f for f in files if f.endswith("_test.cc")}
    grown = True
    while grown:
        grown = False
        for f in files - tests:
            if f.endswith(".h") and includers[f] and includers[f] <= tests:
                tests.add(f)
                grown = True
    return tests


def _cache_reaches(src: Path = SRC) -> list[str]:
    """Each product file of CACHE_CALLERS that reaches CACHE_HEADER, with
    the chain of includes that gets there."""
    tests = _test_files(src)
    found = []
    for layer in CACHE_CALLERS:
        for path in sorted((src / layer).glob("*")):
            own = str(path.relative_to(src))
            if path.suffix not in (".h", ".cc") or own in tests:
                continue
            chains = {own: [own]}
            todo = [own]
            while todo and CACHE_HEADER not in chains:
                f = todo.pop()
                for inc in _project_includes(src / f, src):
                    if inc not in chains:
                        chains[inc] = chains[f] + [inc]
                        todo.append(inc)
            if CACHE_HEADER in chains:
                found.append(" -> ".join(chains[CACHE_HEADER]))
    return found


def test_the_cache_callers_see_it_through_their_interface():
    reaches = _cache_reaches()
    assert reaches == [], ("include the caller's interfaces (cache/client_store.h, "
                           "cache/persist_source.h, cache/ring_store.h), not cache/cache.h:\n"
                           + "\n".join(reaches))


def test_the_check_finds_cache_h_through_another_header(tmp_path):
    """The walk itself: an include of cache/cache.h, direct or through a
    header, is reported; one from a test, or a header only tests include,
    is not."""
    fake = tmp_path / "server_cpp" / "src"
    for layer in _layers():
        (fake / layer).mkdir(parents=True)
    (fake / "cache" / "cache.h").write_text("")
    (fake / "cache" / "ring_store.h").write_text("")
    (fake / "cache" / "wide.h").write_text('#include "cache/cache.h"\n')
    (fake / "ring" / "a.cc").write_text('#include "cache/ring_store.h"\n')
    (fake / "ring" / "b.h").write_text('#include "cache/wide.h"\n')
    (fake / "rpc" / "c.cc").write_text('#include "cache/cache.h"\n')
    (fake / "persist" / "d_fixture.h").write_text('#include "cache/cache.h"\n')
    (fake / "persist" / "d_test.cc").write_text('#include "persist/d_fixture.h"\n')
    assert _cache_reaches(fake) == [
        "ring/b.h -> cache/wide.h -> cache/cache.h",
        "rpc/c.cc -> cache/cache.h"]


def _interfaces() -> dict[str, int]:
    """Each interface of the Cache that docs/architecture.md lists (its
    table's rows: `Name` (`header`)), with the methods it declares."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = {}
    for name, header in re.findall(r"^\| `(\w+)` \(`(\w+)`\) \|", text, re.M):
        body = (SRC / "cache" / f"{header}.h").read_text()
        cls = re.search(r"\nclass " + name + r" \{(.*?)\n\};", body, re.S)
        assert cls, f"cache/{header}.h declares no class {name}"
        found[name] = len(re.findall(r"\bvirtual\b[^;]*?=\s*0\s*;", cls.group(1), re.S))
    return found


def test_each_interface_of_the_cache_stays_narrow():
    """One interface per concern, 20 methods at most (the architecture's
    rule): a concern that outgrows it is split, not widened."""
    found = _interfaces()
    assert {"ClientStore", "RingStore", "PersistSource", "VersionStore", "PeerVersions"} <= set(found)
    wide = {name: n for name, n in found.items() if n > 20}
    assert wide == {}, f"interfaces over 20 methods: {wide}"
    assert all(n > 0 for n in found.values()), found


def _public_methods(header: str, name: str) -> list[str]:
    """The names of the methods `class name` in `header` declares public
    (inline ones included, overloads each counted), parsed from the text:
    comments and default arguments' braces dropped, inline bodies skipped."""
    text = re.sub(r"//[^\n]*", "", header)
    body = text[text.index(f"\nclass {name} "):]
    body = body[body.index(" public:"):body.index(" private:")]
    body = re.sub(r"=\s*\{\}", "", body)  # `= {}` default arguments
    flat, depth = [], 0
    for ch in body:
        if ch == "{":
            depth += 1
            if depth == 1:
                flat.append(";")
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            flat.append(ch)
    names = []
    for decl in "".join(flat).split(";"):
        m = re.search(r"(~?\w+)\s*\(", decl)
        if not m or m.group(1) in (name, f"~{name}", "operator") or "operator=" in decl:
            continue
        names.append(m.group(1))
    return names


def test_the_cache_keeps_buffers_files_and_the_budget_and_no_more():
    """`class Cache` stays at 35 public methods or fewer (the architecture's
    rule): a new concern becomes a component beside it, with its own state,
    lock and interface, not more methods on it."""
    names = _public_methods((SRC / "cache" / "cache.h").read_text(), "Cache")
    assert {"Allocate", "Commit", "Lookup", "Stats", "sessions", "rings"} <= set(names), names
    assert len(names) <= 35, f"class Cache has {len(names)} public methods: {sorted(names)}"


def test_the_count_sees_every_kind_of_declaration():
    header = """
class Cache : public Base {
 public:
  explicit Cache(Options o);
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  // Comment(with parens);
  Status Wait(const std::string& s, const CallerGone& gone = {}) override EXCLUDES(mu_);
  Sessions* sessions() { return &sessions_; }
  void List(int a);
  void List(int a, int b);
 private:
  void Hidden();
};
"""
    assert _public_methods(header, "Cache") == ["Wait", "sessions", "List", "List"]
