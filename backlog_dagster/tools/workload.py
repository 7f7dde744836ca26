"""The reference workload: an ``orders`` log (see the project's CONTEXT, "Reference workload").

Records are ``order_id, customer_id, region, amount, event_time``. Customers are
Zipf-skewed over 100,000 ids; a customer's region is a function of the customer; a
customer's orders always land in the same bucket (keyed like a Kafka producer), and
event times increase with small disorder: ``DISORDERED_SHARE`` of records up to 30 s
early-stamped, and ``LATE_SHARE`` later than a 30 s allowed lateness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from backlog_dagster.source.schema import parse_ddl

ORDERS_DDL = (
    "order_id BIGINT NOT NULL, customer_id STRING NOT NULL, region STRING NOT NULL, "
    "amount DOUBLE NOT NULL, event_time TIMESTAMP NOT NULL"
)
ORDERS_SCHEMA = parse_ddl(ORDERS_DDL)
ORDERS_TIMESTAMP = "event_time"

CUSTOMERS = 100_000
REGIONS = 20
ZIPF_EXPONENT = 1.1
DISORDERED_SHARE = 0.03
MAX_DISORDER_US = 30_000_000
LATE_SHARE = 0.003
LATE_RANGE_US = (31_000_000, 300_000_000)

_US_PER_DAY = 86_400_000_000


class Appender(Protocol):
    """Where the workload goes: a topic of the embedded log, or a Kafka producer
    (``backlog_dagster.tools.kafka_workload``)."""

    def buckets(self) -> list[int]: ...

    def append(self, bucket: int, records: pa.Table) -> object: ...


@dataclass(frozen=True)
class Customers:
    """The fixed customer population: ids, regions, buckets and order frequencies."""

    ids: pa.Array
    regions: pa.Array
    buckets: np.ndarray
    weights: np.ndarray

    @classmethod
    def make(cls, buckets: int, seed: int = 7) -> Customers:
        rng = np.random.default_rng(seed)
        index = np.arange(CUSTOMERS)
        ids = pa.array([f"C{i:06d}" for i in index])
        # A multiplicative hash spreads customers over regions and buckets evenly.
        hashed = (index.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
        region_names = pa.array([f"region-{r:02d}" for r in range(REGIONS)])
        regions = region_names.take(pa.array(hashed % np.uint64(REGIONS)))
        ranks = rng.permutation(CUSTOMERS) + 1
        weights = 1.0 / ranks.astype(np.float64) ** ZIPF_EXPONENT
        return cls(
            ids=ids,
            regions=regions,
            buckets=((hashed >> np.uint64(8)) % np.uint64(buckets)).astype(np.int64),
            weights=weights / weights.sum(),
        )


def orders(
    rng: np.random.Generator,
    customers: Customers,
    first_order_id: int,
    count: int,
    start_us: int,
    end_us: int,
) -> tuple[pa.Table, np.ndarray]:
    """``count`` orders with arrival times spread over ``[start_us, end_us)``.

    Returns the table in arrival order and each record's bucket.
    """
    arrival = np.sort(rng.integers(start_us, max(end_us, start_us + 1), count))
    event = arrival.copy()
    disordered = rng.random(count) < DISORDERED_SHARE
    event[disordered] -= rng.integers(0, MAX_DISORDER_US, int(disordered.sum()))
    late = rng.random(count) < LATE_SHARE
    event[late] -= rng.integers(*LATE_RANGE_US, int(late.sum()))
    who = pa.array(rng.choice(CUSTOMERS, size=count, p=customers.weights))
    amount = np.round(rng.lognormal(mean=3.5, sigma=1.0, size=count), 2)
    table = pa.table(
        {
            "order_id": pa.array(np.arange(first_order_id, first_order_id + count)),
            "customer_id": customers.ids.take(who),
            "region": customers.regions.take(who),
            "amount": pa.array(amount),
            "event_time": pa.array(event, type=pa.int64()).cast(
                ORDERS_SCHEMA.field("event_time").type
            ),
        },
        schema=ORDERS_SCHEMA,
    )
    return table, customers.buckets[who.to_numpy()]


def append_by_bucket(topic: Appender, table: pa.Table, buckets: np.ndarray) -> None:
    """Append each bucket's share of ``table``, keeping arrival order within a bucket."""
    for bucket in np.unique(buckets):
        topic.append(int(bucket), table.filter(pa.array(buckets == bucket)))


def produce_backlog(
    topic: Appender,
    records: int,
    days: float,
    *,
    seed: int = 1,
    first_order_id: int = 0,
    chunk: int = 500_000,
    now_us: int | None = None,
    on_progress: Callable[[int], None] = lambda done: None,
) -> int:
    """Append ``records`` orders whose event times span the ``days`` before now.

    Returns the next unused order id.
    """
    rng = np.random.default_rng(seed)
    customers = Customers.make(len(topic.buckets()))
    end = now_us if now_us is not None else time.time_ns() // 1000
    start = end - int(days * _US_PER_DAY)
    done = 0
    while done < records:
        count = min(chunk, records - done)
        low = start + (end - start) * done // records
        high = start + (end - start) * (done + count) // records
        table, buckets = orders(rng, customers, first_order_id + done, count, low, high)
        append_by_bucket(topic, table, buckets)
        done += count
        on_progress(done)
    return first_order_id + records


def produce_live(
    topic: Appender,
    rate: float,
    *,
    seed: int = 2,
    first_order_id: int = 0,
    tick_s: float = 0.1,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[int], None] = lambda done: None,
) -> int:
    """Append orders stamped with the current time at ``rate`` per second until stopped.

    Returns the next unused order id.
    """
    rng = np.random.default_rng(seed)
    customers = Customers.make(len(topic.buckets()))
    next_id = first_order_id
    started = time.monotonic()
    last_us = time.time_ns() // 1000
    while not should_stop():
        due = int((time.monotonic() - started) * rate) - (next_id - first_order_id)
        now_us = time.time_ns() // 1000
        if due > 0:
            table, buckets = orders(rng, customers, next_id, due, last_us, now_us)
            append_by_bucket(topic, table, buckets)
            next_id += due
            last_us = now_us
            on_progress(next_id - first_order_id)
        time.sleep(tick_s)
    return next_id
