"""The declared pipeline: typed, frozen models of what a user writes in ``defs.yaml``.

Every field has a description, which Dagster shows in its docs tab and ``dg`` shows in
``dg list components``. Validation errors name the field path; Dagster adds the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Literal

from dateutil.parser import isoparse
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from backlog_dagster import extras

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: object) -> object:
    """``30``, ``"30s"``, ``"500ms"``, ``"5m"``, ``"1h"``, ``"2d"`` → seconds."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(
                f"{value!r} is not a duration: write a number of seconds or e.g. "
                "'500ms', '30s', '5m', '1h', '2d'"
            )
        return float(match[1]) * _SECONDS[match[2]]
    return value


#: A duration in seconds, written as a number or with a unit. Its JSON schema (what
#: ``dg check yaml`` and editors check against) says both forms.
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number"},
                {"type": "string", "pattern": _DURATION.pattern},
            ],
            "description": "Seconds, or a number with a unit: '500ms', '30s', '5m', '1h', '2d'.",
        }
    ),
]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_identifier(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain name (letters, digits and _; not a digit first)")
    return name


#: A column or table name: plain, so it needs no quoting anywhere.
Identifier = Annotated[str, AfterValidator(check_identifier)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def check_spark_conf(conf: dict[str, str]) -> dict[str, str]:
    for key in conf:
        if not key.startswith("spark."):
            raise ValueError(f"{key!r} is not a Spark setting (they start with 'spark.')")
    return conf


def _as_text(value: object) -> object:
    """YAML's ``4`` or ``true`` as the text Spark reads (``4``, ``true``)."""
    if isinstance(value, dict):
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    return value


#: A phase's Spark settings, ``{spark.executor.memory: 2g, ...}``.
SparkConf = Annotated[dict[str, str], BeforeValidator(_as_text), AfterValidator(check_spark_conf)]
_SPARK_CONF_HELP = (
    "Spark settings for this phase's runs, shown in each run's config. Launch settings "
    "(spark.executor.memory, spark.executor.cores, spark.cores.max, spark.driver.memory) "
    "take effect where a run starts its own Spark (local[*], a standalone cluster); a "
    "Spark Connect server fixed them when it started, and a run refuses them there. "
    "Session settings (spark.sql.*) apply everywhere."
)


class FromEnv(Frozen):
    """A setting read from an environment variable when a run starts (Dagster's ``EnvVar``).

    A secret written this way is in no YAML file, run config, metadata or log line.
    """

    env: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable that holds the value.",
    )


#: A URL part that carries a secret: Spark Connect's ``;token=`` or a ``user:password@``.
_SECRET_IN_URL = re.compile(r";\s*token\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


#: The secret's own text in a URL or connection string: after ``token=``, between
#: ``user:`` and ``@``, after ``password=``.
_SECRET_TEXT = re.compile(
    r"(?P<before>;\s*token\s*=\s*|(?:^|\s)password\s*=\s*)(?P<secret>[^;\s]+)"
    r"|(?P<user>://[^/@\s:]*:)(?P<password>[^/@\s]*)(?=@)",
    re.IGNORECASE,
)


def masked(value: object) -> object:
    """``value`` with any written secret replaced by ``***``: what validation errors show.

    Dagster prints a refused value beside the error; a refused secret must not be.
    """
    if isinstance(value, str):
        return _SECRET_TEXT.sub(lambda m: f"{m['before'] or m['user']}***", value)
    return value


def no_written_secret(value: str | FromEnv) -> str | FromEnv:
    if isinstance(value, str) and _SECRET_IN_URL.search(value):
        raise ValueError(
            "holds a secret (a token or a password); write {env: NAME} and set the "
            "environment variable NAME to the URL instead, so the secret stays out of the "
            "file, the UI and the logs"
        )
    return value


class StartAt(Frozen):
    """Where the pipeline starts reading the first time (or after a reset).

    Neither field set (or the string ``earliest`` in YAML): each bucket's earliest offset.
    """

    timestamp: str | None = Field(
        None,
        description="ISO-8601 time with zone: start each bucket at its first record at or "
        "after it.",
    )
    offsets: dict[int, int] | None = Field(
        None, description="Start offset per bucket; buckets left out start at their earliest."
    )

    @model_validator(mode="after")
    def _one_of(self) -> StartAt:
        if self.timestamp is not None and self.offsets is not None:
            raise ValueError("give one of timestamp or offsets, not both")
        if self.timestamp is not None:
            try:
                moment = isoparse(self.timestamp)
            except ValueError:
                raise ValueError(f"timestamp {self.timestamp!r} is not an ISO-8601 time") from None
            if moment.tzinfo is None:
                raise ValueError("timestamp needs a time zone, e.g. 2026-11-20T00:00:00+00:00")
        return self

    @property
    def timestamp_us(self) -> int:
        assert self.timestamp is not None
        return int(isoparse(self.timestamp).timestamp() * 1_000_000)


def _earliest(value: object) -> object:
    return {} if value == "earliest" else value


#: librdkafka settings the Kafka source sets itself: a pipeline may not.
KAFKA_OWN_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "isolation.level",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "auto.offset.reset",
        "enable.partition.eof",
    }
)
#: A librdkafka setting that holds a secret: only ``{env: NAME}`` may give it.
_KAFKA_SECRET = re.compile(r"password|secret|jaas|token|\.pem$|key\.pem|private", re.IGNORECASE)


def _kafka_properties(value: object) -> object:
    """YAML's numbers and booleans as the text librdkafka reads; ``{env: …}`` as is."""
    if isinstance(value, dict):
        return {
            k: (str(v).lower() if isinstance(v, bool) else v if isinstance(v, dict) else str(v))
            for k, v in value.items()
        }
    return value


def check_kafka_properties(properties: dict[str, str | FromEnv]) -> dict[str, str | FromEnv]:
    for key, value in properties.items():
        if key in KAFKA_OWN_SETTINGS:
            raise ValueError(
                f"{key!r} is set by backlog-dagster itself (bootstrap.servers and "
                "isolation.level have fields of their own)"
            )
        if _KAFKA_SECRET.search(key) and isinstance(value, str):
            raise ValueError(
                f"{key!r} holds a secret; write {{env: NAME}} and set the environment "
                "variable NAME instead, so it stays out of the file, the UI and the logs"
            )
    return properties


class KafkaSourceConfig(Frozen):
    """A Kafka topic: its partitions are the buckets, Kafka offsets the offsets."""

    bootstrap_servers: Annotated[str | FromEnv, AfterValidator(no_written_secret)] = Field(
        description="host:port[,host:port…] of brokers; {env: NAME} reads it from that "
        "environment variable when a run starts."
    )
    topic: str = Field(min_length=1, description="The topic to read.")
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        "read_committed",
        description="read_committed: only committed transactions' records, up to the last "
        "stable offset; read_uncommitted: every record up to the high watermark.",
    )
    value_format: Literal["json", "raw"] = Field(
        "json",
        description="json: each value is a JSON object read against source.record_schema "
        "(bad ones to the dead letters); raw: the columns key, value (BINARY), headers and "
        "timestamp, to parse in transform.columns.",
    )
    properties: Annotated[
        dict[str, str | FromEnv],
        BeforeValidator(_kafka_properties),
        AfterValidator(check_kafka_properties),
    ] = Field(
        default_factory=dict,
        description="librdkafka settings passed through, e.g. security.protocol, "
        "sasl.mechanism, sasl.username, ssl.ca.location; a secret (sasl.password, "
        "ssl.key.password, …) only as {env: NAME}.",
    )

    def describe(self) -> str:
        servers = (
            self.bootstrap_servers
            if isinstance(self.bootstrap_servers, str)
            else f"${self.bootstrap_servers.env}"
        )
        return f"kafka topic {self.topic} at {servers}"


class ArchiveConfig(Frozen):
    """Older records of the source in files, in Kafka Connect's layout
    (``<path>/<topic>/partition=<p>/<topic>+<p>+<startOffset>.<ext>``)."""

    path: str = Field(description="The archive's root folder (relative: under the data root).")
    format: Literal["parquet", "json"] = Field(
        "parquet", description="parquet, or json (one record a line)."
    )


class SourceConfig(Frozen):
    kind: Literal["bucketlog", "kafka"] = Field(
        "bucketlog",
        description="bucketlog: a topic of the embedded bucketed log (source.path); kafka: a "
        "Kafka topic (source.kafka).",
    )
    path: str | None = Field(
        None, description="kind bucketlog: the directory of the topic in the embedded log."
    )
    kafka: KafkaSourceConfig | None = Field(None, description="kind kafka: the topic to read.")
    archive: ArchiveConfig | None = Field(
        None,
        description="Where the source's older records are kept in files: the backlog reads "
        "each bucket's offsets the archive holds from there, the rest from the source.",
    )
    event_time: str = Field(description="The TIMESTAMP column that times each record.")
    record_schema: str | None = Field(
        None,
        description="Spark DDL of the record columns to read; default: every stored column. "
        "Required for a JSON payload.",
    )
    start: Annotated[StartAt, BeforeValidator(_earliest)] = Field(
        default_factory=StartAt,
        description="'earliest' (the default), {timestamp: …} or {offsets: {bucket: offset}}.",
    )
    idle_timeout: Duration = Field(
        60,
        gt=0,
        description="A bucket with nothing left to read and no record appended for this long "
        "is idle: it does not hold the pipeline in backlog by watermark lag (FLIP-328).",
    )
    on_bad_record: Literal["dead_letter", "fail"] = Field(
        "dead_letter",
        description="dead_letter: a record that does not parse or lacks a value the "
        "transform needs goes to the <table>_dead_letters table with its bucket, offset, "
        "payload and reason, and the run goes on; fail: the run stops, naming the record.",
    )
    on_truncation: Literal["fail", "skip"] = Field(
        "fail",
        description="When retention removed records the pipeline had not read yet. fail: "
        "stop with an error naming the buckets and offsets; skip: go on from the earliest "
        "offset the log holds, logging and counting the records skipped.",
    )

    @model_validator(mode="after")
    def _where(self) -> SourceConfig:
        if self.kind == "bucketlog" and self.path is None:
            raise ValueError("source.path is required: the directory of the topic")
        if self.kind == "bucketlog" and self.kafka is not None:
            raise ValueError("source.kafka is for kind kafka; this source is a bucketlog")
        if self.kind == "kafka" and self.kafka is None:
            raise ValueError("source.kafka is required for kind kafka: bootstrap_servers, topic")
        if self.kind == "kafka" and self.path is not None:
            raise ValueError("source.path is for kind bucketlog; a kafka source has source.kafka")
        if self.kind == "kafka" and self.archive is not None and self.archive.format != "parquet":
            raise ValueError(
                "source.archive in front of a kafka topic must be parquet (Kafka Connect's "
                "ParquetFormat, the record's fields as columns): its files are read by "
                "Spark's Parquet reader"
            )
        return self

    def describe(self) -> str:
        """Where the records come from, for descriptions and messages (no secret)."""
        if self.kafka is not None:
            return self.kafka.describe()
        return f"topic {self.path}"


class WindowConfig(Frozen):
    size: Duration = Field(gt=0, description="Event-time window length, e.g. '1m'.")
    slide: Duration | None = Field(
        None,
        gt=0,
        description="Sliding windows: a new window every slide (at most the size), each "
        "record counting in every window it falls in. Left out: tumbling windows.",
    )
    allowed_lateness: Duration = Field(
        0, ge=0, description="How late a record may be and still update its window."
    )

    @model_validator(mode="after")
    def _slide_within_size(self) -> WindowConfig:
        if self.slide is not None and self.slide > self.size:
            raise ValueError(
                f"slide ({self.slide:g} s) is longer than size ({self.size:g} s): windows "
                "would leave records out; make slide at most size"
            )
        return self

    @property
    def sliding(self) -> bool:
        return self.slide is not None and self.slide != self.size

    @property
    def size_us(self) -> int:
        return round(self.size * 1_000_000)

    @property
    def slide_us(self) -> int:
        """A new window every this many µs (the size, for tumbling windows)."""
        return round((self.slide or self.size) * 1_000_000)


AggregateFunction = Literal["count", "sum", "min", "max", "avg", "count_distinct", "quantiles"]


class Aggregation(Frozen):
    name: Identifier = Field(description="Output column name.")
    function: AggregateFunction = Field(
        description="count, sum, min, max, avg; count_distinct (an estimate, from a "
        "HyperLogLog sketch) or quantiles (estimates, from a KLL sketch)."
    )
    column: str | None = Field(
        None, description="Input column (or SQL expression); omit for count of records."
    )
    quantiles: list[Annotated[float, Field(gt=0, lt=1)]] | None = Field(
        None,
        min_length=1,
        description="With function quantiles: which, e.g. [0.5, 0.99]; a column each, "
        "named <name>_p50, <name>_p99.",
    )

    @model_validator(mode="after")
    def _column_needed(self) -> Aggregation:
        if self.function != "count" and self.column is None:
            raise ValueError(f"{self.function} needs a column")
        if (self.function == "quantiles") != (self.quantiles is not None):
            raise ValueError(
                "quantiles: [0.5, 0.99] goes with function quantiles, and only with it"
            )
        return self

    @property
    def outputs(self) -> list[str]:
        """The result columns it makes: its name, or one per quantile (``name_p99``)."""
        if self.quantiles is None:
            return [self.name]
        return [f"{self.name}_p{f'{q * 100:g}'.replace('.', '_')}" for q in self.quantiles]


class JoinConfig(Frozen):
    path: str | None = Field(
        None,
        description="A Parquet or CSV file (or a folder of Parquet files) of reference "
        "data; relative paths as the source's.",
    )
    table: Identifier | None = Field(
        None, description="Or a table in the sink's database (its schema, for PostgreSQL)."
    )
    on: list[Identifier] = Field(
        min_length=1, description="The columns both sides share; each key once in the table."
    )
    columns: list[Identifier] = Field(min_length=1, description="The columns to add.")
    refresh: Duration = Field(
        300, gt=0, description="Realtime reads the table again this often (seconds)."
    )

    @model_validator(mode="after")
    def _one_place(self) -> JoinConfig:
        if (self.path is None) == (self.table is None):
            raise ValueError("name the reference data by path or by table (one of them)")
        return self

    def describe(self) -> str:
        return f"join.path {self.path}" if self.path is not None else f"join.table {self.table}"


class TransformConfig(Frozen):
    function: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Your own PySpark, as package.module:name: a function from DataFrame to "
        "DataFrame applied to the records first (before filter, columns, keys and "
        "aggregations), in both phases. It must work record by record and keep the "
        "columns whose names begin with an underscore.",
    )
    join: JoinConfig | None = Field(
        None,
        description="Enrich each record with reference data (after the function, before "
        "the filter): a left join on join.on, adding join.columns.",
    )
    filter: str | None = Field(None, description="Keep records where this SQL predicate holds.")
    columns: dict[str, str] = Field(
        default_factory=dict, description="Derived columns: name → SQL expression."
    )
    keys: list[str] = Field(
        default_factory=list,
        description="Columns to group by. Leave keys and aggregations out for a stateless "
        "pipeline: every record (after the function, join, filter and columns) lands in "
        "the results table once.",
    )
    window: WindowConfig | None = Field(
        None, description="Optional event-time window (tumbling, or sliding with slide)."
    )
    aggregations: list[Aggregation] = Field(
        default_factory=list, description="What to compute per key (with keys)."
    )

    @model_validator(mode="after")
    def _grouped_or_stateless(self) -> TransformConfig:
        if self.keys and not self.aggregations:
            raise ValueError(
                "keys without aggregations: add aggregations to compute per key, or leave "
                "keys out too for a stateless pipeline that keeps every record"
            )
        if self.aggregations and not self.keys:
            raise ValueError("aggregations need keys: the columns to group by")
        if self.stateless and self.window is not None:
            raise ValueError(
                "a window groups records for aggregations, and this pipeline has none "
                "(stateless: it keeps every record); leave window out, or add keys and "
                "aggregations"
            )
        return self

    @property
    def stateless(self) -> bool:
        """No keys and no aggregations: each record is a result row of its own."""
        return not self.keys and not self.aggregations

    @model_validator(mode="after")
    def _distinct_names(self) -> TransformConfig:
        for name in self.columns:
            check_identifier(name)
        names = [*self.keys, *(o for a in self.aggregations for o in a.outputs)]
        if self.window is not None:
            names += ["window_start", "window_end"]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"output column name(s) used twice: {', '.join(repeated)}")
        return self


class SqliteSinkConfig(Frozen):
    kind: Literal["sqlite"] = Field(
        "sqlite", description="sqlite: an embedded database file, readable while written."
    )
    path: str = Field(description="The database file.")
    table: Identifier = Field(description="The results table.")

    def describe(self) -> str:
        return f"{self.path}:{self.table}"


#: A libpq keyword/value setting that carries a secret: ``password=…``.
_PASSWORD_SETTING = re.compile(r"(^|\s)password\s*=", re.IGNORECASE)


def no_password(value: str | FromEnv) -> str | FromEnv:
    if isinstance(value, str) and _PASSWORD_SETTING.search(value):
        raise ValueError(
            "holds a password; write {env: NAME} and set the environment variable NAME "
            "to the connection string instead (or keep the password in ~/.pgpass or "
            "PGPASSWORD), so it stays out of the file, the UI and the logs"
        )
    return no_written_secret(value)


def _with_extra(extra: str) -> Callable[[str], str]:
    """A validator that refuses a value needing ``extra`` where it is not installed."""

    def installed(value: str) -> str:
        said = extras.problem(extra)
        if said is not None:
            raise ValueError(said)
        return value

    return installed


def _connect_installed(value: str | FromEnv) -> str | FromEnv:
    """A Spark Connect URL written in the file needs the connect extra (one read from the
    environment is checked when a run starts, ``spark.resource``)."""
    if isinstance(value, str) and value.startswith("sc://"):
        _with_extra("connect")(value)
    return value


class PostgresSinkConfig(Frozen):
    # ``schema`` is also a (deprecated) method of pydantic's BaseModel: the field is
    # ``db_schema`` in Python and ``schema`` in YAML.
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    kind: Annotated[Literal["postgres"], AfterValidator(_with_extra("postgres"))] = Field(
        description="postgres: tables in a PostgreSQL database (the postgres extra: "
        "pip install 'backlog-dagster[postgres]')."
    )
    dsn: Annotated[str | FromEnv, AfterValidator(no_password)] = Field(
        description="libpq connection string or postgresql:// URL, without a password "
        "(~/.pgpass or PGPASSWORD supply one); {env: NAME} reads it from that environment "
        "variable when a run starts (needed when it carries a password)."
    )
    db_schema: Identifier = Field(
        "public", alias="schema", description="Schema of the tables (created if missing)."
    )
    table: Identifier = Field(description="The results table.")

    def describe(self) -> str:
        where = self.dsn if isinstance(self.dsn, str) else f"${self.dsn.env}"
        return f"{where}:{self.db_schema}.{self.table}"


def _validated_by_kind(value: object) -> object:
    """The sink validated as the model its ``kind`` names (``sqlite`` when left out).

    Done here rather than by pydantic's tagged union, whose errors would name the tag
    (``sink.sqlite.path``): these name the field as written (``sink.path``).
    """
    if isinstance(value, dict):
        kinds: dict[object, type[Frozen]] = {
            "sqlite": SqliteSinkConfig,
            "postgres": PostgresSinkConfig,
        }
        model = kinds.get(value.get("kind", "sqlite"))
        if model is not None:
            return model.model_validate(value)
    return value


#: Where results and progress go; ``kind`` chooses.
SinkConfig = Annotated[
    SqliteSinkConfig | PostgresSinkConfig,
    BeforeValidator(_validated_by_kind),
    Field(discriminator="kind"),
]


class BacklogConfig(Frozen):
    boundary: Literal["markers", "none"] = Field(
        "markers",
        description="markers: the backlog lasts until every bucket reaches its end offset as "
        "it was when the pipeline started; none: only watermark_lag_threshold decides.",
    )
    watermark_lag_threshold: Duration | None = Field(
        None,
        gt=0,
        description="Also in backlog while now minus the watermark exceeds this (FLIP-328); "
        "in realtime, a lag above it for switch.grace_period sends the pipeline back into "
        "backlog. Unset: the lag decides nothing.",
    )
    checkpoint_interval: Duration = Field(
        0,
        ge=0,
        description="Commit progress about this often during the backlog; 0: only at its end "
        "(a failure restarts the backlog from its start).",
    )
    residual_records: int = Field(
        100_000,
        ge=0,
        description="With boundary markers: a backlog run that reaches its markers with more "
        "than this many records appended after them (what arrived while it ran) takes new "
        "markers at the log's end and reads on in batch, for as long as each round leaves "
        "fewer than the one before, so realtime starts with little to catch up. 0: the "
        "switch comes at the first markers.",
    )
    shuffle_partitions: int | Literal["auto"] = Field(
        "auto", description="Shuffle partitions of the batch plan; auto sizes them to the data."
    )
    records_per_shuffle_partition: int = Field(
        2_000_000, gt=0, description="With auto: about this many input records per partition."
    )
    adaptive_query_execution: bool = Field(
        True,
        description="Spark's adaptive query execution (and its coalescing of shuffle "
        "partitions) in the batch plan.",
    )
    spark_conf: SparkConf = Field(default_factory=dict, description=_SPARK_CONF_HELP)


class RealtimeConfig(Frozen):
    checkpoint_interval: Duration = Field(
        5, gt=0, description="Micro-batch commit cadence of the realtime phase."
    )
    shuffle_partitions: int = Field(
        1,
        gt=0,
        description="Shuffle partitions of each micro-batch's aggregation. A micro-batch is "
        "small (see max_records_per_trigger): one reduce task was no slower than four "
        "(bench/realtime.py) and leaves cores to other pipelines; raise it for micro-batches "
        "of millions of records.",
    )
    max_records_per_trigger: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        "auto",
        description="Read limit per micro-batch. A micro-batch that starts behind (the "
        "first after the switch takes what arrived meanwhile) reads at most this many "
        "records, so it commits soon; realtime then catches up at most this many records "
        "per checkpoint_interval. auto: 250,000 records per second of the interval, at "
        "least 100,000; null for no limit.",
    )
    checkpoint_location: str = Field(
        "checkpoints",
        description="Folder for the streaming query's checkpoint, one per run (removed when "
        "the run ends; the sink, not the checkpoint, holds progress). A relative path "
        "resolves under the data root.",
    )
    spark_conf: SparkConf = Field(default_factory=dict, description=_SPARK_CONF_HELP)


class SwitchConfig(Frozen):
    """The sensor that watches progress against the markers and switches the phase."""

    running_by_default: bool = Field(
        True, description="Start the sensor with the code location (no click in the UI)."
    )
    interval: Duration = Field(5, gt=0, description="Seconds between the sensor's ticks.")
    status_every: Duration = Field(
        5,
        gt=0,
        description="How often runs beat their heartbeat, the backlog run publishes its "
        "progress and the realtime run refreshes its offsets, lag and watermark.",
    )
    report_every: Duration = Field(
        30,
        gt=0,
        description="How often the backlog's progress (from the sensor) and the realtime "
        "status (from the run) are written as asset observations; a change worth knowing "
        "(a new bucket, late or bad records) is written at once.",
    )
    keeps_up_window: Duration = Field(
        180,
        gt=0,
        description="In realtime, an offset lag that grew over this long fails the keeps_up "
        "check (a warning): realtime does not keep up with the input.",
    )
    heartbeat_timeout: Duration = Field(
        60,
        gt=0,
        description="A backlog or realtime run silent this long (its process died), or "
        "launched this long ago and not started, is marked failed and restarted; one being "
        "cancelled is marked cancelled.",
    )
    continue_as_realtime: bool = Field(
        True,
        description="The backlog run goes on as the realtime run: once its backlog has ended "
        "and the switch is due, its Spark (and its session on a shared server) runs the "
        "realtime query, so no second Spark driver waits beside the backlog and none starts "
        "at the switch. One Spark serves both phases, launched with the backlog's settings: "
        "the realtime phase's spark_conf may set spark.sql.* keys of its own, and launch "
        "settings only as the backlog's. Off: the sensor starts the realtime run at the "
        "switch, or a standby does (standby).",
    )
    standby: bool = Field(
        False,
        description="With continue_as_realtime off: start the realtime run while the backlog "
        "runs, so its Spark is warm and it switches the moment the backlog ends (costs a "
        "second Spark driver, or session, meanwhile).",
    )
    standby_lead: Duration | None = Field(
        None,
        ge=0,
        description="null: the standby starts with the backlog run. A duration: it starts "
        "once the backlog run is reading (its Spark is up) and, when the backlog's ETA to "
        "the switch is known, once that is under this, so a long backlog does not hold a "
        "second Spark driver all along. Leave it longer than a run launch and a Spark start "
        "on a loaded machine, or the switch waits for the standby.",
    )
    grace_period: Duration = Field(
        60,
        ge=0,
        description="In realtime, the watermark lag must stay above the threshold this long "
        "before the pipeline goes back into backlog.",
    )
    min_time_in_realtime: Duration = Field(
        120,
        ge=0,
        description="No way back into backlog sooner than this after the switch to realtime; "
        "doubled for each way back in the last hour, so a pipeline that flaps slows down.",
    )

    @model_validator(mode="after")
    def _one_way_to_start_realtime(self) -> SwitchConfig:
        if self.standby and self.continue_as_realtime:
            raise ValueError(
                "standby and continue_as_realtime are both on: a standby would start the "
                "realtime run beside the backlog run, which goes on as the realtime run "
                "itself; set continue_as_realtime: false to use a standby"
            )
        return self


class PipelineConfig(Frozen):
    """One declared pipeline: a source, a transform (a keyed aggregation, or stateless), a
    sink and two phases."""

    # A refused spark_master may hold a secret: errors name the field, not the value.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _mask_written_secrets(cls, data: object) -> object:
        """Settings that may carry a secret are validated masked: a written secret is
        refused all the same, and the refusal shows ``***`` where Dagster shows the value
        (it prints each refused value, whatever ``hide_input_in_errors`` says)."""
        if not isinstance(data, dict):
            return data
        data = {**data}
        if "spark_master" in data:
            data["spark_master"] = masked(data["spark_master"])
        sink = data.get("sink")
        if isinstance(sink, dict) and "dsn" in sink:
            data["sink"] = {**sink, "dsn": masked(sink["dsn"])}
        source = data.get("source")
        kafka = source.get("kafka") if isinstance(source, dict) else None
        if isinstance(source, dict) and isinstance(kafka, dict):
            kafka = {**kafka}
            if "bootstrap_servers" in kafka:
                kafka["bootstrap_servers"] = masked(kafka["bootstrap_servers"])
            if isinstance(kafka.get("properties"), dict):
                kafka["properties"] = {
                    k: "***" if _KAFKA_SECRET.search(str(k)) and isinstance(v, str) else v
                    for k, v in kafka["properties"].items()
                }
            data["source"] = {**source, "kafka": kafka}
        return data

    name: Identifier = Field(description="The pipeline's name; prefixes its assets and jobs.")
    source: SourceConfig = Field(description="Where the records come from.")
    transform: TransformConfig = Field(
        description="What is computed from them: keys, window, aggregations, or none."
    )
    sink: SinkConfig = Field(description="Where results and progress go; kind chooses.")
    backlog: BacklogConfig = Field(
        BacklogConfig(), description="How the backlog phase reads up to the markers."
    )
    realtime: RealtimeConfig = Field(
        RealtimeConfig(), description="How the realtime phase streams from the markers."
    )
    switch: SwitchConfig = Field(
        SwitchConfig(), description="How the sensor decides the phase and keeps runs going."
    )
    spark_master: Annotated[
        str | FromEnv, AfterValidator(no_written_secret), AfterValidator(_connect_installed)
    ] = Field(
        "local[*]",
        description="Spark master: local[*], a cluster URL or sc://… (Spark Connect); "
        "{env: NAME} reads it from that environment variable when a run starts (needed when "
        "it carries a token).",
    )

    @model_validator(mode="after")
    def _one_spark_for_both_phases(self) -> PipelineConfig:
        if not self.switch.continue_as_realtime:
            return self
        differ = sorted(
            key
            for key, value in self.realtime.spark_conf.items()
            if not key.startswith("spark.sql.") and self.backlog.spark_conf.get(key) != value
        )
        if differ:
            raise ValueError(
                "switch.continue_as_realtime: the backlog run's Spark goes on as the realtime "
                "run's, so realtime.spark_conf cannot launch it differently (not as in "
                f"backlog.spark_conf: {', '.join(differ)}); give both phases the same value, "
                "or turn continue_as_realtime off"
            )
        return self

    @model_validator(mode="after")
    def _lag_strategy(self) -> PipelineConfig:
        threshold = self.backlog.watermark_lag_threshold
        if self.backlog.boundary == "none" and threshold is None:
            raise ValueError(
                "backlog.boundary is none but backlog.watermark_lag_threshold is not set: "
                "nothing would decide when the backlog ends; set one of them"
            )
        window = self.transform.window
        if threshold is not None and window is not None and threshold <= window.allowed_lateness:
            raise ValueError(
                f"backlog.watermark_lag_threshold ({threshold:g} s) must exceed "
                f"transform.window.allowed_lateness ({window.allowed_lateness:g} s): the "
                "watermark always lags by the allowed lateness, so the lag could never fall "
                "to the threshold"
            )
        return self
