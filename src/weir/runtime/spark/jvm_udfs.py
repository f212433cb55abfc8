"""The route stage's JVM helpers: a Java UDF that numbers rows, compiled in the
driver's JVM by the Janino compiler Spark ships (and compiles its own generated code
with) and added to the SparkContext as a jar so its executors load it too (nothing is
built or shipped with weir but the Java source below, and no Python worker sees the
records), and the batch time kept out of Spark's generated code.

* :func:`row_order` — ``partition << 33 | row``: the index of each row in its Spark
  task, by input partition, as ``monotonically_increasing_id`` numbers them (which
  Spark refuses in a streaming query). The count lives in the UDF instance, and Spark
  deserializes a task's plan for each task attempt, so every task, retry and
  speculative copy counts from 0. A task of 2**33 rows or more fails rather than
  numbering into the partition's bits.
* :func:`opaque_millis` — the batch time outside the generated code. A micro-batch's
  ``current_timestamp()`` becomes a literal of that batch, and Spark writes a
  timestamp or long literal into the whole-stage generated code, so a stage that
  carries the batch time in a column compiles its code again in every batch
  (measured: about a fifth of the keyed-count raw limit's time on ``local[2]``).
  Inside ``reflect`` (an expression Spark evaluates as an object the generated code
  calls, never as code of its own) the literal stays out of the code, which is the same
  in every batch and compiled once.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

from pyspark.sql import Column, SparkSession

__all__ = ["opaque_millis", "row_order"]

_CLASS = "weir.spark.WeirUdfs"
_SOURCE = """
package weir.spark;

import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

public final class WeirUdfs {
    private WeirUdfs() {}

    /** partition << 33 | the row's index in its task (one instance per task attempt). */
    public static final class RowOrder implements UDF1 {
        private static final long serialVersionUID = 1L;
        private long next;

        public Object call(Object partition) {
            if (next >= (1L << 33)) {
                throw new IllegalStateException(
                    "weir: a task of 2**33 rows or more cannot number its rows");
            }
            return Long.valueOf((((Integer) partition).longValue() << 33) | next++);
        }
    }

    public static UserDefinedFunction rowOrder() {
        return functions.udf(new RowOrder(), DataTypes.LongType).asNondeterministic();
    }
}
"""

_lock = threading.Lock()
#: per SparkContext (application id): the row order UDF, a Java UserDefinedFunction
_udfs: dict[str, Any] = {}
_jar_dir: list[Path] = []


def _row_order_udf(spark: SparkSession) -> Any:
    """The compiled class's UDF, its jar added to ``spark``'s context once."""
    sc = spark.sparkContext
    key = sc.applicationId
    with _lock:
        if key in _udfs:
            return _udfs[key]
        jvm: Any = spark._jvm  # py4j: the only way into the driver JVM
        compiler = jvm.org.codehaus.janino.SimpleCompiler()
        compiler.setParentClassLoader(jvm.java.lang.Thread.currentThread()
                                      .getContextClassLoader())
        compiler.cook(_SOURCE)
        if not _jar_dir:
            _jar_dir.append(Path(tempfile.mkdtemp(prefix="weir-udfs-")))
            atexit.register(shutil.rmtree, _jar_dir[0], True)
        digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
        jar = _jar_dir[0] / f"weir-udfs-{digest}.jar"
        if not jar.exists():
            codes = compiler.getBytecodes()
            with zipfile.ZipFile(jar, "w") as z:
                for name in sorted(codes.keySet()):
                    z.writestr(name.replace(".", "/") + ".class", bytes(codes.get(name)))
        sc._jsc.sc().addJar(str(jar))  # (PySpark has no addJar)
        gateway: Any = sc._gateway
        cls = compiler.getClassLoader().loadClass(_CLASS)
        no_types = gateway.new_array(jvm.java.lang.Class, 0)
        no_args = gateway.new_array(jvm.java.lang.Object, 0)
        udf = cls.getMethod("rowOrder", no_types).invoke(None, no_args)
        _udfs[key] = udf
        return udf


def row_order(spark: SparkSession, partition: Column) -> Column:
    """``partition << 33 | row index in the task`` for each row (``partition``: an int
    column, ``spark_partition_id()``); nondeterministic, as Spark must not evaluate it
    twice for a row."""
    from pyspark.sql.classic.column import Column as ClassicColumn
    from pyspark.sql.classic.column import _to_java_column, _to_seq

    udf = _row_order_udf(spark)
    return ClassicColumn(udf.apply(_to_seq(spark.sparkContext, [partition], _to_java_column)))


def opaque_millis(millis: Column) -> Column:
    """``millis`` (an int64 column, typically the batch time) evaluated outside Spark's
    generated code (``String.valueOf`` by ``reflect``, then cast back), so a literal
    in it does not make the code differ from batch to batch."""
    from pyspark.sql import functions as F

    text = F.call_function("reflect", F.lit("java.lang.String"), F.lit("valueOf"),
                           millis.cast("bigint"))
    return text.cast("bigint")
