"""The user's own PySpark: ``transform.function``, a DataFrame → DataFrame applied to the
records before the filter, the derived columns, the keys and the aggregations, in both
phases.

Its output columns are known before any record is read: Dagster refuses, when it loads
the file, a key or an aggregation column the function does not return. They are found by
applying the function to an empty DataFrame of the source's columns, in a short-lived
local Spark of its own (a subprocess: the process loading the definitions keeps no JVM),
and kept in a cache keyed by the function's module file, so that later loads (every run
loads the definitions) cost nothing. The same pass reads Spark's analysed plan and
refuses a function that is not record-wise: one that aggregates, sorts, deduplicates,
limits, samples, repartitions, joins or unions would make a chunk's result depend on
where chunks and micro-batches are cut, and the results would no longer be exact.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backlog_dagster.implementations import open_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FIELD = "transform.function"
#: Part of the cache key: a change to what ``describe_output`` keeps leaves old entries.
CACHE_FORMAT = "columns and plan nodes, 1"

#: Spark's logical plan nodes that make a function depend on more than one record.
NOT_RECORD_WISE = {
    "Aggregate": "aggregates",
    "Window": "computes a window over records",
    "Sort": "sorts records",
    "Distinct": "deduplicates records",
    "Deduplicate": "deduplicates records",
    "DeduplicateWithinWatermark": "deduplicates records",
    "GlobalLimit": "limits the records",
    "LocalLimit": "limits the records",
    "Offset": "skips records",
    "Sample": "samples records",
    "Repartition": "repartitions records",
    "RepartitionByExpression": "repartitions records",
    "Join": "joins (use transform.join for reference data)",
    "Union": "unions records",
    "Intersect": "intersects records",
    "Except": "subtracts records",
}
_NODE = re.compile(r"^[\s:+\-|!]*([A-Z]\w+)")


class FunctionError(ValueError):
    """``transform.function`` cannot be used: the message says why and what to do."""


@dataclass(frozen=True)
class FunctionOutput:
    """The columns a function returns for the source's columns: (name, Spark type)."""

    columns: tuple[tuple[str, str], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]


def load_function(spec: str) -> Callable[[DataFrame], DataFrame]:
    """Import ``package.module:name``; say plainly what is missing."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to see
        raise FunctionError(
            f"{spec}: cannot import {module_name}: {type(error).__name__}: {error} (it must "
            "be importable where Dagster loads the project and where runs start)"
        ) from None
    function = getattr(module, attribute, None)
    if function is None:
        raise FunctionError(f"{spec}: {module_name} has no {attribute!r}")
    if not callable(function):
        raise FunctionError(f"{spec}: {attribute} is a {type(function).__name__}, not a function")
    return function


def apply_function(records: DataFrame, spec: str) -> DataFrame:
    """The user's function over ``records``, checked to return a DataFrame.

    Python UDFs of the function's module go to Spark by value, not by name: Spark's
    Python workers then run the code this run loaded, even a worker kept from an earlier
    run (a Connect server started here shares its workers across runs,
    ``spark.connect_main``), and they need not import the module."""
    from pyspark import cloudpickle
    from pyspark.sql import DataFrame

    function = load_function(spec)
    cloudpickle.register_pickle_by_value(sys.modules[spec.partition(":")[0]])
    result = function(records)
    if not isinstance(result, DataFrame):
        raise FunctionError(f"{spec}: returned a {type(result).__name__}, not a DataFrame")
    return result


def function_output(spec: str, input_ddl: str, keep: tuple[str, ...]) -> FunctionOutput:
    """The function's output columns for records of ``input_ddl``: from the cache, else
    from a local Spark in a subprocess. Raises ``FunctionError`` for a function that
    fails on them, is not record-wise, or drops a column of ``keep``."""
    key = _cache_key(spec, input_ddl)
    cached = None if key is None else _cache_dir() / f"{key}.json"
    if cached is not None and cached.exists():
        found = json.loads(cached.read_text())
    else:
        found = _in_subprocess(spec, input_ddl)
        if cached is not None and "error" not in found:
            cached.parent.mkdir(parents=True, exist_ok=True)
            temporary = cached.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(found))
            temporary.replace(cached)
    return checked_output(spec, found, keep)


def checked_output(spec: str, found: dict[str, Any], keep: tuple[str, ...]) -> FunctionOutput:
    """``describe_output``'s finding, refused where the function cannot be used."""
    if "error" in found:
        raise FunctionError(f"{spec}: {found['error']}")
    refused = [NOT_RECORD_WISE[node] for node in found["nodes"] if node in NOT_RECORD_WISE]
    if refused:
        raise FunctionError(
            f"{spec} {', '.join(sorted(set(refused)))}: a function here must work record by "
            "record (filter, add or change columns), as the results merge chunk by chunk "
            "and micro-batch by micro-batch; leave grouping to transform.keys and "
            "transform.aggregations"
        )
    output = FunctionOutput(tuple((name, kind) for name, kind in found["columns"]))
    dropped = [column for column in keep if column not in output.names]
    if dropped:
        raise FunctionError(
            f"{spec} drops {', '.join(dropped)}: keep the event time and the columns whose "
            "names begin with an underscore (each record's bucket, offset and parse state, "
            "by which results commit exactly once and bad records are found)"
        )
    return output


def describe_output(spark: SparkSession, spec: str, input_ddl: str) -> dict[str, Any]:
    """What ``function_output`` keeps: the output columns and the analysed plan's nodes,
    or the error the function raised on empty records of ``input_ddl``."""
    try:
        output = apply_function(spark.createDataFrame([], input_ddl), spec)
        plan = output._jdf.queryExecution().analyzed().toString()
    except FunctionError as error:
        return {"error": str(error).removeprefix(f"{spec}: ")}
    except Exception as error:  # Spark's analysis errors, the user's code
        reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        return {"error": f"fails on the source's columns: {type(error).__name__}: {reason}"}
    nodes = sorted({m.group(1) for m in map(_NODE.match, plan.splitlines()) if m})
    columns = [(f.name, f.dataType.simpleString()) for f in output.schema.fields]
    return {"columns": columns, "nodes": nodes}


#: What PySpark sets in a process once it opened a Spark Connect session.
CONNECT_ENVIRONMENT = frozenset(
    {"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"}
)


def _in_subprocess(spec: str, input_ddl: str) -> dict[str, Any]:
    # Not the settings PySpark leaves in a process that opened a Spark Connect session
    # (a run on a shared Spark): under them the child's local Spark would be refused.
    environment = {k: v for k, v in os.environ.items() if k not in CONNECT_ENVIRONMENT}
    # A JVM that lives for seconds: the quick C1 compiler alone serves it best.
    environment.setdefault(
        "PYSPARK_SUBMIT_ARGS", "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
    )
    environment["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *sys.path])
    done = subprocess.run(
        [sys.executable, "-m", __name__, spec, input_ddl],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    last = done.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"could not be applied in a local Spark: {reason}"}


def _cache_key(spec: str, input_ddl: str) -> str | None:
    """The function's module file, the input columns and PySpark's version, hashed; None
    when the module has no file to key on (it is then computed every time)."""
    from importlib.metadata import version

    module_name = spec.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None or not Path(found.origin).is_file():
        return None
    digest = hashlib.sha256()
    for part in (CACHE_FORMAT, spec, input_ddl, version("pyspark")):
        digest.update(part.encode() + b"\0")
    digest.update(Path(found.origin).read_bytes())
    return digest.hexdigest()[:32]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "backlog-dagster" / "function-outputs"


def main() -> None:
    spec, input_ddl = sys.argv[1], sys.argv[2]
    spark = open_session("local[1]", app_name="backlog-dagster-function-schema")
    try:
        print(json.dumps(describe_output(spark, spec, input_ddl)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
