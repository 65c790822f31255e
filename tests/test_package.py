"""The package's shape: every module imports on its own, tce's modules import
one another without cycles, and each layer imports only the layers below it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tce

PACKAGE = pathlib.Path(tce.__file__).parent

# Layers, lowest first: a module may import its own layer and those below.
LAYERS = [
    ("errors and protocol", ("tce.errors", "tce.v1")),
    ("client core", ("tce.core",)),
    ("internal service API", ("tce._service",)),
    ("public API", ("tce.api", "tce.client", "tce.buffers", "tce.objects")),
    ("integrations", ("tce.integrations",)),
    ("package", ("tce",)),
    ("tools", ("tce.tools", "tce.cli")),
]


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the package (the generated protocol modules aside)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "v1" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()
# Loaded by vLLM inside its own processes, beside vLLM (tests/test_vllm.py
# imports it first in the vLLM environment).
NEEDS_VLLM = {"tce._vllm_engine"}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The tce modules ``name`` imports when it is imported: the imports at
    module level (in ``if``/``try`` blocks too), not those inside functions
    or classes. ``from tce import x`` names the module tce.x when there is
    one, else the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    found.add(sub if sub in MODULES else base)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m == "tce" or m.startswith("tce.")}


def _layer(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


def test_the_package_has_the_layout_the_readme_describes():
    assert {"tce", "tce.api", "tce.errors", "tce._service", "tce.cli", "tce.core",
            "tce.integrations", "tce.tools"} <= set(MODULES)
    for name in MODULES:
        assert _layer(name) >= 0, f"{name} belongs to no layer"


# One interpreter that loads the third-party libraries once (torch takes
# seconds), then imports each tce module in a forked child that has loaded no
# tce module yet: as if that module were the first a program imports.
_IMPORT_EACH = r"""
import os, sys, traceback
import grpc, torch  # noqa: F401
assert not [m for m in sys.modules if m == "tce" or m.startswith("tce.")]
failed = 0
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        print(f"FAILED: import {name}", file=sys.stderr)
        failed += 1
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_first_in_a_fresh_interpreter():
    p = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *sorted(set(MODULES) - NEEDS_VLLM)],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr


def test_no_import_cycles_among_tce_modules():
    graph = {name: {m for m in _imports(name, path) if m in MODULES and m != name}
             for name, path in MODULES.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_each_layer_imports_only_the_layers_below():
    upward = [f"{name} ({LAYERS[_layer(name)][0]}) imports {m} ({LAYERS[_layer(m)][0]})"
              for name, path in MODULES.items() for m in sorted(_imports(name, path))
              if _layer(m) > _layer(name)]
    assert not upward, "\n".join(upward)


def test_the_import_walk_reads_module_level_imports_only(tmp_path):
    """The walk the two tests above rely on."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from tce.core import _knobs\n")
    b.write_text("import tce.api\ntry:\n    from tce import _service\nexcept ImportError:\n    pass\n"
                 "def f():\n    import tce.tools.cli\n")
    assert _imports("tce.core._x", a) == {"tce.core._knobs"}
    assert _imports("tce.core._y", b) == {"tce.api", "tce._service"}


def _private_imports(name: str, path: pathlib.Path) -> list[str]:
    """Every import in ``name`` (at any depth, functions included) of a
    private module of another package, or of a private name from one: a
    name component that starts with ``_``. Its own package's private
    modules are its own business (``tce.integrations._dcp_reader`` may
    import ``tce.integrations._dcp_item``)."""
    own = name if path.name == "__init__.py" else name.rpartition(".")[0]
    shown = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = own.split(".")[: len(own.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from m import x`: the module m.x when there is one, else the name x of m
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if not (target == "tce" or target.startswith("tce.")):
                continue
            module = target if target in MODULES else target.rpartition(".")[0]
            is_package = module in MODULES and MODULES[module].name == "__init__.py"
            package = module if is_package else module.rpartition(".")[0]
            if package == own:
                continue
            if any(part.startswith("_") for part in target.split(".")):
                found.append(f"{shown}:{node.lineno}: {name} imports "
                             f"{target}, private to {package}")
    return found


def test_integrations_and_tools_use_only_public_modules_of_other_packages():
    """What integrations and tools need from the rest of the package is
    public (``tce.client``, ``tce.buffers``, ``tce.objects``, ``tce.api``,
    ``tce.core.dist``, ``tce.errors``, ``tce.v1``), so the private modules
    behind it can change without breaking them."""
    edges = [name for name in MODULES
             if name.startswith(("tce.integrations.", "tce.tools."))]
    assert len(edges) > 10, edges  # the walk found the modules
    found = [line for name in edges for line in _private_imports(name, MODULES[name])]
    assert not found, "\n".join(found)


def test_public_modules_use_no_private_module_of_another_package_but_the_client_core():
    """A public module (``tce``, ``tce.weights``, ``tce.api``, ...) is built
    on the client core's private modules and its own package's; what it
    needs from the integrations comes from their public modules (the
    weight readers of each format through ``tce._weight_formats``' table),
    so an integration's insides can change without touching the public API."""
    public = [name for name in MODULES
              if not any(part.startswith("_") for part in name.split("."))]
    assert {"tce", "tce.weights", "tce.api", "tce.client"} <= set(public)
    found = [line for name in public for line in _private_imports(name, MODULES[name])
             if ", private to tce.core" not in line]
    assert not found, "\n".join(found)


def test_the_private_import_walk_sees_every_form(tmp_path):
    """The walk the test above relies on: imports in functions, relative
    imports, private names, and a package's own private modules."""
    f = tmp_path / "x.py"
    f.write_text("from tce import _service, api\nimport tce.core._knobs\n"
                 "from tce.integrations import _dcp_item\nfrom .._layout import storage_bytes\n"
                 "from tce.api import _secret\n"
                 "def g():\n    from tce.core import _session\n")
    found = _private_imports("tce.integrations.x", f)
    assert [line.split(" imports ")[1].split(",")[0] for line in found] == \
        ["tce._service", "tce.core._knobs", "tce._layout.storage_bytes", "tce.api._secret",
         "tce.core._session"], found
    assert found[0].endswith("x.py:1: tce.integrations.x imports tce._service, private to tce")
