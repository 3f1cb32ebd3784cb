"""Where the full suite's time goes: the seconds of each test module (setup, call and
teardown of its tests, from the junit.xml that ``./scripts/test --all`` writes), longest
first.  With ``--dist loadfile`` a module runs whole on one process, so the longest
module bounds the run.

    python scripts/suite_times.py [test-output/junit.xml] [--top N]
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def module_of(classname: str) -> str:
    """``tests.worker.test_x`` or ``tests.worker.test_x.TestCase``: ``tests/worker/test_x.py``."""
    parts = classname.split(".")
    ends = [n for n, part in enumerate(parts) if part.startswith("test_")]
    return "/".join(parts[: ends[0] + 1] if ends else parts) + ".py"


def module_seconds(junit: Path) -> dict[str, tuple[float, int]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for case in ET.parse(junit).iter("testcase"):
        entry = totals[module_of(case.get("classname", ""))]
        entry[0] += float(case.get("time", 0))
        entry[1] += 1
    return {name: (seconds, int(count)) for name, (seconds, count) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", nargs="?", default="test-output/junit.xml", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    times = module_seconds(args.junit)
    total = sum(seconds for seconds, _ in times.values())
    print(f"{'module':70} {'tests':>5} {'seconds':>8}")
    for name, (seconds, count) in sorted(times.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{name:70} {count:5d} {seconds:8.1f}")
    print(f"{'all ' + str(len(times)) + ' modules':70} {'':5} {total:8.1f}")


if __name__ == "__main__":
    main()
