"""A Kafka-protocol cluster on loopback for tests, the demo and the benchmarks:
librdkafka's mock cluster, run in a process of its own.

The librdkafka that confluent-kafka bundles exports its mock cluster
(``rd_kafka_mock_cluster_new`` and friends) but confluent-kafka does not wrap it, so
this module calls it through ``ctypes``. The cluster lives in memory, in the process
that created it, and listens on real TCP ports: Spark's Python workers reach it like
any broker. The process prints ``bootstrap <host:port,...>`` once the cluster is up,
then takes one command per line on stdin and answers ``ok`` or ``error <reason>``:

    topic <name> <partitions>                 create a topic
    down <broker id> / up <broker id>         take a broker down or bring it back
    leader <topic> <partition> <broker id>    move a partition's leader
    delete-records <topic> <partition> <offset>   drop records before offset (retention)

It stops at the end of its input. What the mock does not do is said where it matters
(``README``: what was tested against which broker). It keeps at most 5 MB (or 100,000
message sets) a partition, dropping the oldest beyond (librdkafka hard-codes it): a
retention limit of its own, which ``held_everything`` checks.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def _librdkafka() -> ctypes.CDLL:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        raise RuntimeError(f"no librdkafka bundled with confluent-kafka in {libs}")
    lib = ctypes.CDLL(str(found[0]))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.restype = ctypes.c_int
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    for name, args in {
        "rd_kafka_mock_topic_create": [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_int,
        ],
        "rd_kafka_mock_broker_set_down": [ctypes.c_void_p, ctypes.c_int32],
        "rd_kafka_mock_broker_set_up": [ctypes.c_void_p, ctypes.c_int32],
        "rd_kafka_mock_partition_set_leader": [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.c_int32,
        ],
        "rd_kafka_mock_partition_delete_records": [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.c_int64,
        ],
    }.items():
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = args
    return lib


def serve(brokers: int, lines: Iterator[str], say: Callable[[str], None]) -> None:
    """Run a mock cluster of ``brokers`` brokers until ``lines`` ends."""
    lib = _librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    # The handle only hosts the cluster: not a word about its own missing brokers.
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", error, len(error))
    handle = lib.rd_kafka_new(0, conf, error, len(error))  # a producer
    if not handle:
        raise RuntimeError(f"librdkafka: {error.value.decode()}")
    cluster = lib.rd_kafka_mock_cluster_new(handle, brokers)
    if not cluster:
        raise RuntimeError("librdkafka could not start a mock cluster")
    say(f"bootstrap {lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()}")
    for line in lines:
        words = line.split()
        if not words:
            continue
        try:
            code = _command(lib, cluster, words)
        except (ValueError, IndexError, KeyError):
            say(f"error cannot read {line.strip()!r}")
            continue
        say("ok" if code == 0 else f"error {lib.rd_kafka_err2str(code).decode()}")


def _command(lib: ctypes.CDLL, cluster: int, words: list[str]) -> int:
    verb, args = words[0], words[1:]
    if verb == "topic":
        return int(lib.rd_kafka_mock_topic_create(cluster, args[0].encode(), int(args[1]), 1))
    if verb == "down":
        return int(lib.rd_kafka_mock_broker_set_down(cluster, int(args[0])))
    if verb == "up":
        return int(lib.rd_kafka_mock_broker_set_up(cluster, int(args[0])))
    if verb == "leader":
        return int(
            lib.rd_kafka_mock_partition_set_leader(
                cluster, args[0].encode(), int(args[1]), int(args[2])
            )
        )
    if verb == "delete-records":
        return int(
            lib.rd_kafka_mock_partition_delete_records(
                cluster, args[0].encode(), int(args[1]), int(args[2])
            )
        )
    raise KeyError(verb)


@dataclass
class MockBroker:
    """A running mock cluster process, and its commands."""

    process: subprocess.Popen[str]
    bootstrap: str

    def command(self, line: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"mock broker: {line}: {answer or 'no answer (it stopped)'}")

    def create_topic(self, name: str, partitions: int) -> None:
        self.command(f"topic {name} {partitions}")

    def set_down(self, broker: int) -> None:
        self.command(f"down {broker}")

    def set_up(self, broker: int) -> None:
        self.command(f"up {broker}")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        self.command(f"delete-records {topic} {partition} {before}")


def held_everything(bootstrap_servers: str, topic: str) -> None:
    """Raise, saying why, if the mock dropped records of ``topic`` (its 5 MB a partition)."""
    from backlog_dagster.kafka.topic import KafkaSettings, KafkaTopic

    with KafkaTopic(KafkaSettings(bootstrap_servers, topic)) as kafka:
        dropped = {p: b.earliest for p, b in kafka.bounds().items() if b.earliest > 0}
    if dropped:
        raise RuntimeError(
            f"librdkafka's mock cluster dropped the oldest records of kafka topic {topic} "
            f"(partition: records dropped {dropped}): it keeps 5 MB a partition; use fewer "
            "records or more partitions"
        )


@contextmanager
def mock_broker(brokers: int = 3) -> Iterator[MockBroker]:
    """A mock cluster in a process of its own for the block."""
    command = [sys.executable, "-m", "backlog_dagster.kafka.mock_broker", str(brokers)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().split()
        if first[:1] != ["bootstrap"]:
            raise RuntimeError(f"the mock broker did not start (exit code {process.poll()})")
        yield MockBroker(process, first[1])
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 3, iter(sys.stdin), _say)
