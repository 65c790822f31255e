"""The documented table of server settings against the server itself.

The table (found by its header row in README.md or docs/*.md) must list
exactly the settings `tce-server --print-config` prints, in the same order,
each with the environment variable, flag and default that `tce-server
--help` reports. The server's settings table is the source; the doc follows.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tce.tools import _server

ROOT = Path(__file__).resolve().parent.parent
HEADER = ["key", "environment", "flag", "default", "meaning"]


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row (`\\|` is a literal bar)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _doc_table() -> list[list[str]]:
    """The rows of the one settings table in the docs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines() if path.exists() else []
        for i, line in enumerate(lines):
            if line.startswith("|") and _cells(line) == HEADER:
                rows = []
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    rows.append(_cells(row))
                found.append((path.relative_to(ROOT), rows))
    assert len(found) == 1, f"expected one table headed {HEADER}, found: {[p for p, _ in found]}"
    return found[0][1]


def _server_output(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCE_")}
    p = subprocess.run([_server.server_binary(), *args], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _help() -> dict[str, tuple[str, str | None]]:
    """--help: flag -> (environment variable, default as shown)."""
    entries: dict[str, tuple[str, str | None]] = {}
    flag = None
    for line in _server_output("--help").splitlines():
        if m := re.match(r"  (--[a-z0-9-]+)", line):
            flag = m.group(1)
        elif flag and (m := re.fullmatch(r"\s+\[(TCE_[A-Z0-9_]+)(?:, (.*))?\]", line)):
            entries[flag] = (m.group(1), m.group(2))
            flag = None
    return entries


def _print_config() -> dict[str, str]:
    """--print-config with no TCE_* variables set: key -> default (unquoted)."""
    config = {}
    for line in _server_output("--print-config").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.split(" = ", 1)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        config[key] = value
    return config


def _plain(cell: str) -> str:
    """A doc cell without code marks, and a default's parentheses."""
    cell = cell.replace("`", "")
    return cell[1:-1] if cell.startswith("(") and cell.endswith(")") else cell


@pytest.fixture(scope="module")
def server_settings():
    return _print_config(), _help()


def test_doc_lists_every_setting_of_the_server_in_its_order(server_settings):
    config, _ = server_settings
    keys = [_plain(row[0]) for row in _doc_table() if row[0] != "—"]
    assert len(keys) == len(set(keys)), "a setting is documented twice"
    assert set(keys) == set(config), (
        f"documented, not a setting: {sorted(set(keys) - set(config))}; "
        f"a setting, not documented: {sorted(set(config) - set(keys))}")
    assert keys == list(config), "the doc lists the settings in another order than --help"


def test_doc_gives_each_setting_the_servers_variable_flag_and_default(server_settings):
    config, help_entries = server_settings
    assert set(help_entries) == {"--" + k.replace("_", "-") for k in config} | {"--config"}
    for row in _doc_table():
        assert len(row) == len(HEADER), row
        key, env, flag, default = (_plain(c) for c in row[:4])
        if key == "—":
            assert (env, flag) == ("TCE_CONFIG", "--config"), row
            assert help_entries["--config"] == ("TCE_CONFIG", None)
            continue
        assert flag == "--" + key.replace("_", "-"), row
        assert flag in help_entries, f"{flag} is not in --help"
        help_env, help_default = help_entries[flag]
        assert env == help_env, row
        assert default == help_default, f"{key}: the doc says {default!r}, --help {help_default!r}"
        if config[key]:
            assert default == config[key], f"{key}: the doc says {default!r}, --print-config {config[key]!r}"


def test_help_shows_the_defaults_print_config_prints(server_settings):
    config, help_entries = server_settings
    for key, value in config.items():
        _, shown = help_entries["--" + key.replace("_", "-")]
        if value:  # an empty default is shown as what it means
            assert shown == value, f"{key}: --help says {shown!r}, --print-config {value!r}"
