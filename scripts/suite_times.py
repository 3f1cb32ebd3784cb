"""Where the full suite's time goes: the seconds of each test module (setup, call and
teardown of its tests, from the junit.xml that ``./scripts/test --all`` writes), longest
first.  With ``--dist loadfile`` a module runs whole on one process, so the longest
module bounds the run.

    python scripts/suite_times.py [test-output/junit.xml ...] [--top N] [--write]

``--write`` keeps the modules' seconds (the mean over the files given) in
``tests/suite_times.json``: the full run starts the longest modules first (tests/conftest.py),
so that no long module is left to run alone at the end.
"""

from __future__ import annotations

import argparse
import json
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


WEIGHTS = Path(__file__).resolve().parents[1] / "tests" / "suite_times.json"


def mean_seconds(junits: list[Path]) -> dict[str, tuple[float, int]]:
    runs = [module_seconds(junit) for junit in junits]
    names = sorted({name for run in runs for name in run})
    return {
        name: (
            sum(run.get(name, (0.0, 0))[0] for run in runs) / len(runs),
            max(run.get(name, (0.0, 0))[1] for run in runs),
        )
        for name in names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", nargs="*", default=[Path("test-output/junit.xml")], type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--write", action="store_true", help=f"write {WEIGHTS.name}")
    args = parser.parse_args()
    times = mean_seconds(args.junit)
    if args.write:
        weights = {name: round(seconds, 1) for name, (seconds, _) in sorted(times.items())}
        WEIGHTS.write_text(json.dumps(weights, indent=1) + "\n")
    total = sum(seconds for seconds, _ in times.values())
    print(f"{'module':70} {'tests':>5} {'seconds':>8}")
    for name, (seconds, count) in sorted(times.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{name:70} {count:5d} {seconds:8.1f}")
    print(f"{'all ' + str(len(times)) + ' modules':70} {'':5} {total:8.1f}")


if __name__ == "__main__":
    main()
