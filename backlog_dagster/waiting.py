"""Waiting for something to come true: the one polling loop, on tenacity."""

from __future__ import annotations

from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_result, wait_fixed


def until(
    condition: Callable[[], bool],
    timeout_s: float,
    every_s: float,
    gives_up: Callable[[], bool] = lambda: False,
) -> bool:
    """Whether ``condition()`` came true within ``timeout_s`` seconds, asked at once and
    then every ``every_s``; False as soon as ``gives_up()`` (a process it waits on died).
    An exception ``condition`` raises goes to the caller."""

    def stop(state: RetryCallState) -> bool:
        return (state.seconds_since_start or 0.0) >= timeout_s or gives_up()

    retrying = Retrying(
        retry=retry_if_result(lambda came_true: not came_true),
        stop=stop,
        wait=wait_fixed(every_s),
        retry_error_callback=lambda state: False,
    )
    return bool(retrying(condition))
