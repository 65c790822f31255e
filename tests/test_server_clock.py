"""The server reads time only through its Clock (server_cpp/src/common/clock.h),
so that every rule that depends on time can be tested by moving a
ManualClock instead of sleeping (docs/testing.md). This walks the server's
product sources for any other way of reading a clock, sleeping, or waiting
with a deadline."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "server_cpp" / "src"

# Reads of time, sleeps and timed waits that bypass the Clock.
_DIRECT = re.compile(
    r"\b(steady_clock|system_clock|high_resolution_clock|gettimeofday|clock_gettime"
    r"|sleep_for|sleep_until|usleep|nanosleep|timespec_get)\b"
    r"|(?<![\w:.>])(std::)?(time|sleep|alarm)\s*\("
    r"|\.wait_(for|until)\s*\(")

# The files allowed to: the Clock's implementation, the CondVar wait it calls,
# and the test library (linked into tests only, never into tce-server).
_ALLOWED = {
    "common/clock.h": "the interface (its real implementation's timed wait)",
    "common/clock.cc": "the real implementation",
    "common/mutex.h": "CondVar's timed wait, private to Clock",
    "common/manual_clock.h": "test library",
    "common/manual_clock.cc": "test library",
    "common/testing.h": "test library (Eventually)",
}


def _direct_reads(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".h", ".cc") or path.name.endswith("_test.cc"):
            continue
        rel = path.relative_to(src).as_posix()
        if rel in _ALLOWED:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if _DIRECT.search(code):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_product_file_reads_the_clock_directly():
    found = _direct_reads()
    assert found == [], "read time through Clock (common/clock.h):\n" + "\n".join(found)


def test_every_allowed_file_exists():
    missing = [rel for rel in _ALLOWED if not (SRC / rel).is_file()]
    assert missing == []


def test_the_walk_finds_each_way_around_the_clock(tmp_path):
    src = tmp_path / "src"
    (src / "ring").mkdir(parents=True)
    lines = [
        "auto t = std::chrono::steady_clock::now();",
        "auto w = std::chrono::system_clock::now();",
        "std::this_thread::sleep_for(std::chrono::milliseconds(5));",
        "usleep(100);",
        "gettimeofday(&tv, nullptr);",
        "clock_gettime(CLOCK_MONOTONIC, &ts);",
        "time_t now = time(nullptr);",
        "cv_.wait_until(lock, deadline);",
        "sleep(1);",
    ]
    fine = [
        "const auto now = clock_->Now();  // steady_clock in a comment is fine",
        "SetIoTimeouts(fd_, left);",
        "uint64_t committed_time(0);",
    ]
    (src / "ring" / "x.cc").write_text("\n".join(lines + fine) + "\n")
    (src / "ring" / "x_test.cc").write_text("usleep(1);\n")
    found = _direct_reads(src)
    assert [f.split(": ", 1)[1] for f in found] == lines
