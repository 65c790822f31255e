"""Rules the tests themselves keep (docs/testing.md, "Writing a timing test").

No test asserts right after a fixed sleep: it waits for the condition
(`helpers.until`) or for an event that proves the server handled the
request, then asserts. A sleep followed at once by an assert passes on an
idle machine and fails under load.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_sleep(stmt: ast.stmt, sleep_names: set[str]) -> bool:
    """`time.sleep(...)`, or `sleep(...)` imported from time, as a statement."""
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    f = stmt.value.func
    if isinstance(f, ast.Attribute):
        return f.attr == "sleep" and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in sleep_names


def sleeps_then_asserts(source: str) -> list[int]:
    """Line numbers of each sleep whose next statement in the same block is
    an assert, or assignments and then an assert (`time.sleep(1); x =
    measure(); assert x < n`)."""
    tree = ast.parse(source)
    sleep_names = {a.asname or a.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and node.module == "time"
                   for a in node.names if a.name == "sleep"}
    found = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if not _is_sleep(stmt, sleep_names):
                    continue
                rest = [s for s in block[i + 1:]
                        if not isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign))][:1]
                if rest and isinstance(rest[0], ast.Assert):
                    found.append(stmt.lineno)
    return sorted(found)


def test_the_check_finds_a_sleep_then_an_assert():
    bad = """
import time
from time import sleep as nap

def test_x(server):
    server.start()
    time.sleep(0.5)
    assert server.ready
    for i in range(3):
        try:
            pass
        finally:
            nap(1)
            assert i
    else:
        time.sleep(1)
        grown = measure()
        assert grown < 64
"""
    assert sleeps_then_asserts(bad) == [7, 13, 16]
    good = """
import time

def test_x(server):
    while not server.ready:
        time.sleep(0.1)
    assert server.ready
    time.sleep(0.1)
    server.poke()
"""
    assert sleeps_then_asserts(good) == []


def test_no_test_asserts_right_after_a_fixed_sleep():
    found = [f"{path.name}:{line}" for path in sorted(TESTS.glob("*.py"))
             for line in sleeps_then_asserts(path.read_text())]
    assert not found, ("a sleep then an assert (wait for the condition with helpers.until, "
                       "see docs/testing.md): " + ", ".join(found))
