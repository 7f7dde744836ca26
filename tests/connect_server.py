"""``backlog-dagster spark connect-server`` as a user runs it, for the tests and benches."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from backlog_dagster.spark.servers import SparkServer, free_port


@contextmanager
def connect_server_cli(
    folder: Path,
    master: str | None = None,
    conf: Mapping[str, str] = {},
    warm_up_s: float = 0,
    echo: bool = False,
) -> Iterator[tuple[SparkServer, list[str]]]:
    """The command in a process of its own, with the code and environment this process's
    children get, from when it says it is up until SIGTERM; the block gets the server and
    what the command said (to its end, once the block is over; ``echo`` prints it too).
    """
    port = free_port()
    url = f"sc://127.0.0.1:{port}"
    command = [str(Path(sys.executable).with_name("backlog-dagster")), "spark"]
    command += ["connect-server", "--port", str(port), "--dir", str(folder)]
    command += ["--warm-up", f"{warm_up_s:g}"]
    if master is not None:
        command += ["--master", master]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said: list[str] = []
    assert process.stdout is not None
    output = process.stdout

    def hear(until_up: bool) -> bool:
        for line in output:
            said.append(line)
            if echo:
                print(line, end="", flush=True)
            if until_up and line.startswith(f"Spark Connect server up: {url}"):
                return True
        return False

    # Its later output must not fill the pipe, and is kept.
    listener = threading.Thread(target=hear, args=(False,), daemon=True)
    try:
        # The command gives up by itself when the server does not start.
        if not hear(until_up=True):
            raise RuntimeError("the Connect server exited before it was up:\n" + "".join(said))
        listener.start()
        yield SparkServer("connect server", url, port, folder / "connect-server.log", process), said
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if listener.is_alive():
            listener.join(timeout=10)
