"""The full run starts its longest modules first.

``./scripts/test --all`` hands whole modules to six processes (``--dist loadfile``, with
``--no-loadscope-reorder`` so that pytest-xdist keeps this order instead of its own, by
number of tests). Handed out longest first, no long module (the Node suite, the failover
batch: one test each, over a minute) is left to run alone at the end while the other
processes sit idle. The seconds are each module's last measured time
(``tests/suite_times.json``, written by ``scripts/suite_times.py --write``); a module not
listed there counts as short. Within a module the order is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).with_name("suite_times.json")


def module_path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker: keep the order
        return
    seconds: dict[str, float] = json.loads(WEIGHTS.read_text())
    first_seen = {module: n for n, module in enumerate(dict.fromkeys(map(module_path, items)))}

    def key(item: pytest.Item) -> tuple[float, int]:
        module = module_path(item)
        return (-seconds.get(module, 0.0), first_seen[module])

    items.sort(key=key)  # stable: a module's own tests keep their order
