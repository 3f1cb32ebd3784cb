"""A real single-node Apache Kafka broker and bridge processes, for tests and benchmarks.

The broker is the official ``org.apache.kafka:kafka_2.13`` jar and its runtime
dependencies from Maven Central, resolved once by ``mvn`` from ``scripts/kafka/pom.xml``
and cached under ``~/.cache/captcha-tasks/kafka/`` (``$XDG_CACHE_HOME`` respected).  It
runs in KRaft mode (broker and controller in one JVM) on free loopback ports with its log
directory in a temporary folder, which :meth:`KafkaBroker.stop` removes.  Needs Java 17+
and Maven; :func:`missing_tools` says what is absent.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from captcha_tasks.errors import ConfigurationError
from captcha_tasks.testing.processes import ChildProcess, free_port, wait_until

#: The pom that names the broker's artifacts (in a source checkout).
POM = Path(__file__).resolve().parents[1] / "scripts" / "kafka" / "pom.xml"
MIN_JAVA = 17
#: Generous: the first run downloads about 45 MB of jars.
MAVEN_TIMEOUT_S = 600
#: Small and quick to start; a test broker holds little data.
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
)
READY_MARKER = "Kafka Server started"


def java_major(java: str) -> int | None:
    """The major version of a ``java`` binary, or None if it does not say."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def missing_tools() -> str | None:
    """Why a broker cannot be started here (no Java 17+, no Maven, no pom), or None."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None:
        return "no `java` on PATH (the Kafka broker needs Java 17+)"
    if mvn is None:
        return "no `mvn` on PATH (Maven resolves the Kafka broker's jars)"
    major = java_major(java)
    if major is None or major < MIN_JAVA:
        return f"`java` is version {major or 'unknown'}; the Kafka broker needs {MIN_JAVA}+"
    if not POM.exists():
        return f"{POM} is missing (run from a source checkout)"
    return None


def cache_root() -> Path:
    """Where resolved broker jars are kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "captcha-tasks" / "kafka"


def broker_jars(pom: Path = POM, cache: Path | None = None, log: Path | None = None) -> Path:
    """The folder of the broker's jars, resolved with Maven on first use and cached.

    The cache is keyed by the pom's content, so changing the Kafka version there
    resolves the new one.
    """
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    target = (cache or cache_root()) / digest
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
    argv = [
        shutil.which("mvn") or "mvn",
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        _run_logged(argv, log or target.parent / "maven.log", MAVEN_TIMEOUT_S)
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first: its copy is as good as ours.
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _run_logged(argv: list[str], log: Path, timeout: float) -> None:
    with open(log, "ab") as out:
        result = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise ConfigurationError(f"{argv[0]} failed (exit {result.returncode}):\n{tail}")


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """A one-node KRaft broker for tests: replication 1, quick group joins, no auto-create."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=3",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "",
        ]
    )


class KafkaBroker(ChildProcess):
    """``java -cp <jars> kafka.Kafka server.properties`` on free loopback ports."""

    def __init__(self, log_dir: Path | None = None, *, pom: Path = POM) -> None:
        super().__init__("kafka", log_dir)
        self.pom = pom
        self.port = free_port()
        self.controller_port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="captcha-tasks-kafka-"))

    @property
    def bootstrap_servers(self) -> str:
        """``KAFKA_BOOTSTRAP_SERVERS`` for this broker."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> Self:
        """Resolve the jars (first run only), format the log dir and start the broker."""
        problem = missing_tools()
        if problem:
            raise ConfigurationError(problem)
        jars = broker_jars(self.pom, log=self.log_dir / "maven.log")
        classpath = str(jars / "*")
        config = self.data_dir / "server.properties"
        logs = self.data_dir / "logs"
        config.write_text(server_properties(logs, self.port, self.controller_port))
        java = shutil.which("java") or "java"
        # A cluster id is 16 random bytes in URL-safe base64 without padding.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        _run_logged(
            # "--cluster-id=": an id may start with "-", which would read as an option.
            [java, *JVM_OPTIONS, "-cp", classpath, "kafka.tools.StorageTool", "format",
             f"--cluster-id={cluster_id}", f"--config={config}"],
            self.log_path,
            120,
        )  # fmt: skip
        self._spawn([java, *JVM_OPTIONS, "-cp", classpath, "kafka.Kafka", str(config)])
        wait_until(self._started, timeout, interval=0.1, what="the Kafka broker")
        return self

    def _started(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"the Kafka broker exited early:\n{self.log_text()[-3000:]}")
        return READY_MARKER in self.log_text()

    def stop(self, timeout: float = 10) -> None:
        """Stop the broker and delete its data."""
        super().stop(timeout)
        shutil.rmtree(self.data_dir, ignore_errors=True)


class BridgeProcess(ChildProcess):
    """``captcha-tasks kafka-bridge`` as a child process (its settings from ``env``)."""

    READY = "kafka bridge consuming"

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        log_dir: Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        super().__init__(name, log_dir)
        self.env = {**os.environ, **env}
        self.args = list(args)

    def start(self, timeout: float = 60) -> Self:
        argv = [sys.executable, "-m", "captcha_tasks.cli", "kafka-bridge", *self.args]
        self._spawn(argv, self.env)
        wait_until(self._started, timeout, interval=0.1, what=f"bridge {self.name}")
        return self

    def _started(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"bridge {self.name} exited early:\n{self.log_text()[-3000:]}")
        return self.READY in self.log_text()
