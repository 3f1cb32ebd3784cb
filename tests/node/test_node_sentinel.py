"""The Node.js client's replica fence behind real sentinels (one master, one replica, three
sentinels on loopback, passwords on both): a Node process takes from a pool the Python
package filled.

With the replica up, takes wait for it and are delivered.  With the replica stopped
(SIGSTOP: it acknowledges nothing, and the sentinels still list it as one they could
promote), a take runs on the master but is not delivered: a miss.  The master is then
killed and the stopped replica promoted, as a failover would: the pool is drained from
the new master, and no token is ever handed out twice (the take the master alone held may
be lost with it, its token in the new master's pool again: delivered then, once).  Once no
replica is left that could take over, takes go on without waiting, as in Python."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from npm_cache import missing_node, node_modules
from system_parts import missing

from captcha_tasks.core.outcome import iso
from captcha_tasks.core.poolspec import PoolSpec
from captcha_tasks.state.connections import redis_client, replica_fence
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.pools import PoolStore
from captcha_tasks.testing.processes import wait_until
from harness.sentinel_cluster import SentinelCluster

pytestmark = pytest.mark.system

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "node"
TAKER = PACKAGE / "test" / "fixtures" / "fenced_taker.js"
POOL = "login"
TOKENS = 8


@pytest.fixture(scope="module")
def node_path(output_dir: Path) -> str:
    problem = missing_node()
    if problem:
        missing("Node.js", problem)
    return str(node_modules(PACKAGE, output_dir / "npm-clients-node.log"))


@pytest.fixture
def sentinels(output_dir: Path) -> Iterator[SentinelCluster]:
    # The sentinels mark a silent node down after 2.5 s: the stopped replica is still
    # "promotable" for the one take the test makes while it is stopped.
    deployment = SentinelCluster(
        log_dir=output_dir / "sentinel" / "node-fence",
        password="server-" + os.urandom(4).hex(),
        sentinel_password="sentinel-" + os.urandom(4).hex(),
        down_after_ms=2500,
    )
    with deployment.start():
        yield deployment


class Taker:
    """fixtures/fenced_taker.js: one command line in, one JSON line out."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._log = open(log, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [shutil.which("node") or "node", str(TAKER)],
            cwd=PACKAGE,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def ask(self, line: str) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the Node taker ended (exit {self.process.poll()}): see {self._log.name}"
        return json.loads(answer)

    def take(self) -> Any:
        return self.ask(f"take {POOL}")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self._log.close()


def fill(store: PoolStore) -> set[str]:
    now = time.time()
    store.register(
        PoolSpec.from_dict(
            {
                "name": POOL,
                "method": "turnstile",
                "sitekey": "0x4AAA-node",
                "pageurl": "https://shop.example/",
                "size": 50,
                "ttl": 280,
                "min_remaining": 5,
            }
        )
    )
    tokens = {f"tok-fence-{n}" for n in range(TOKENS)}
    for n, token in enumerate(sorted(tokens)):
        record = {
            "status": "solved",
            "captcha_id": f"fence-{n}",
            "method": "turnstile",
            "source": "api",
            "elapsed_s": 1.0,
            "solved_at": iso(now),
            "expires_at": iso(now + 250),
            "provider": "sandbox",
            "token": token,
        }
        assert store.add(POOL, record, 250)
    return tokens


def pooled(store: PoolStore) -> set[str]:
    """The tokens in the pool now, as the master says."""
    members = cast(list[str], store.db.redis.zrange(store.db.keys.pool_tokens(POOL), 0, -1))
    return {json.loads(member)["token"] for member in members}


def promotable(cluster: SentinelCluster, node: Any) -> bool:
    """Whether every sentinel lists ``node`` as a replica it could promote."""
    for sentinel in cluster.sentinels:
        replicas = sentinel.client().sentinel_slaves(cluster.master_name)
        [entry] = [r for r in replicas if int(r["port"]) == node.port]
        if {"s_down", "o_down"} & set(str(entry["flags"]).split(",")):
            return False
    return True


@pytest.mark.timeout(180)
def test_a_node_take_no_replica_acknowledged_is_a_miss_and_no_token_goes_out_twice(
    node_path: str, sentinels: SentinelCluster, output_dir: Path
) -> None:
    settings = sentinels.settings()
    prefix = "ct-node-fence-" + os.urandom(3).hex()
    store = PoolStore(Db(redis_client(settings), Keys(prefix), replica_fence(settings)))
    tokens = fill(store)
    env = {
        **os.environ,
        **sentinels.env(),
        "CAPTCHAAI_KEY_PREFIX": prefix,
        "NODE_PATH": node_path,
    }
    taker = Taker(env, output_dir / "node-fenced-taker.log")
    delivered: list[str] = []
    try:
        # A replica is up: takes wait for it, and it acknowledges them (the first take is
        # an EVALSHA the fresh master does not know: NOSCRIPT, then EVAL before the WAIT).
        assert taker.ask("needed") is True
        for _ in range(2):
            got = taker.take()
            assert got and "token" in got, got
            delivered.append(got["token"])
        old = sentinels.master()
        [replica] = [node for node in sentinels.nodes if node is not old]

        # The replica stops acknowledging; the sentinels still list it as promotable.
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            before = pooled(store)
            assert taker.take() is None  # a miss: no replica holds this take
            [missed] = before - pooled(store)  # though it ran on the master
            assert promotable(sentinels, replica), "the fence had a replica to wait for"
            old.kill()  # the master goes, and with it the take only it held
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert sentinels.wait_for_new_master(old) is replica

        # No replica left that could take over (the old master is dead): takes go on.
        wait_until(lambda: taker.ask("needed") is False, 30, what="the fence to see no replica")

        def drained() -> bool:
            got = taker.take()
            if got is None:
                return True
            if "token" in got:
                delivered.append(got["token"])
            return False  # a token, or an error while the client follows the new master

        wait_until(drained, 30, interval=0.01, what="the Node taker to drain the pool")
    finally:
        taker.close()

    assert len(delivered) == len(set(delivered)), f"a token went out twice: {delivered}"
    assert set(delivered) <= tokens
    # Every token was delivered once, but for the missed take's, if it was lost with the
    # master's write (the replica may have read it off its socket after SIGCONT).
    assert tokens - {missed} <= set(delivered)
