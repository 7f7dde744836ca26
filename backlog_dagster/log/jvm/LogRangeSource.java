package backlogdagster.log;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

import org.apache.arrow.compression.CommonsCompressionFactory;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Batch reads of given offset ranges of the embedded log, inside the JVM.
 *
 * <p>The Python data source (format {@code bucketlog}) hands every record through a Python
 * worker; this reader decodes the same stored Arrow IPC blobs here, straight into the columnar
 * batches Spark reads, so a read costs no Python process. It reads only what it is told:
 * {@code backlog_dagster.log.jvm_reader} resolves the ranges, plans the tasks and passes the
 * schema; everything else (starting offsets, streams, JSON payloads) stays with the Python
 * data source.
 *
 * <p>Options: {@code path} (the topic's directory), {@code timestampColumn} (the column read as
 * {@code _timestamp}), {@code partitions} (tasks separated by {@code ;}, each a list of
 * {@code bucket:start:end} ranges separated by {@code ,}). The schema must be given: payload
 * columns by name, plus any of {@code _bucket}, {@code _offset}, {@code _timestamp},
 * {@code _appended_at}.
 */
public final class LogRangeSource implements TableProvider {

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new IllegalArgumentException(
        "the embedded log's JVM reader needs its schema given (.schema(...))");
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(properties);
    String path = required(options, "path");
    String timestampColumn = required(options, "timestampColumn");
    List<Range[]> tasks = parseTasks(required(options, "partitions"));
    return new RangeTable(schema, path, timestampColumn, tasks);
  }

  private static String required(CaseInsensitiveStringMap options, String name) {
    String value = options.get(name);
    if (value == null) {
      throw new IllegalArgumentException("the embedded log's JVM reader needs option " + name);
    }
    return value;
  }

  static List<Range[]> parseTasks(String spec) {
    List<Range[]> tasks = new ArrayList<>();
    for (String task : spec.split(";")) {
      if (task.isEmpty()) {
        continue;
      }
      String[] pieces = task.split(",");
      Range[] ranges = new Range[pieces.length];
      for (int i = 0; i < pieces.length; i++) {
        String[] parts = pieces[i].split(":");
        if (parts.length != 3) {
          throw new IllegalArgumentException("option partitions: not bucket:start:end: " + pieces[i]);
        }
        ranges[i] = new Range(
            Integer.parseInt(parts[0]), Long.parseLong(parts[1]), Long.parseLong(parts[2]));
      }
      tasks.add(ranges);
    }
    return tasks;
  }

  /** Offsets {@code [start, end)} of one bucket. */
  static final class Range implements Serializable {
    final int bucket;
    final long start;
    final long end;

    Range(int bucket, long start, long end) {
      this.bucket = bucket;
      this.start = start;
      this.end = end;
    }
  }

  /** One Spark task's ranges. */
  static final class Task implements InputPartition {
    final Range[] ranges;

    Task(Range[] ranges) {
      this.ranges = ranges;
    }
  }

  static final class RangeTable implements Table, SupportsRead, ScanBuilder, Scan, Batch {
    private final StructType schema;
    private final String path;
    private final String timestampColumn;
    private final List<Range[]> tasks;

    RangeTable(StructType schema, String path, String timestampColumn, List<Range[]> tasks) {
      this.schema = schema;
      this.path = path;
      this.timestampColumn = timestampColumn;
      this.tasks = tasks;
    }

    @Override
    public String name() {
      return "embedded log " + path;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return this;
    }

    @Override
    public Scan build() {
      return this;
    }

    @Override
    public StructType readSchema() {
      return schema;
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      return tasks.stream().map(Task::new).toArray(InputPartition[]::new);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new ReaderFactory(schema, path, timestampColumn);
    }
  }

  static final class ReaderFactory implements PartitionReaderFactory {
    private final StructType schema;
    private final String path;
    private final String timestampColumn;

    ReaderFactory(StructType schema, String path, String timestampColumn) {
      this.schema = schema;
      this.path = path;
      this.timestampColumn = timestampColumn;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("the embedded log's JVM reader reads columns");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new RangeReader(schema, path, timestampColumn, ((Task) partition).ranges);
    }
  }

  /**
   * Reads a task's ranges blob by blob. Each batch it hands Spark is one stored blob (or the
   * part of it in range) and stays valid until the next call of {@code next}.
   */
  static final class RangeReader implements PartitionReader<ColumnarBatch> {
    /**
     * The blobs that hold offsets [start, end), in order: as the Python reader finds them
     * (backlog_dagster/log/bucket.py), from the last blob starting at or before start.
     */
    private static final String OVERLAPPING =
        "SELECT first_offset, record_count, appended_at, data FROM blobs "
            + "WHERE first_offset >= coalesce("
            + "(SELECT max(first_offset) FROM blobs WHERE first_offset <= ?), 0) "
            + "AND first_offset < ? AND first_offset + record_count > ? "
            + "ORDER BY first_offset";

    private final StructType schema;
    private final String path;
    private final String timestampColumn;
    private final Range[] ranges;
    private final BufferAllocator allocator = new RootAllocator();
    private final List<AutoCloseable> held = new ArrayList<>();
    private int rangeIndex = -1;
    private Connection db;
    private ResultSet blobs;
    private long expected;
    private ColumnarBatch current;

    RangeReader(StructType schema, String path, String timestampColumn, Range[] ranges) {
      this.schema = schema;
      this.path = path;
      this.timestampColumn = timestampColumn;
      this.ranges = ranges;
    }

    @Override
    public boolean next() throws IOException {
      release();
      try {
        while (true) {
          if (blobs != null && blobs.next()) {
            current = decode(ranges[rangeIndex]);
            return true;
          }
          if (blobs != null) {
            finishRange(ranges[rangeIndex]);
          }
          rangeIndex++;
          if (rangeIndex >= ranges.length) {
            return false;
          }
          openRange(ranges[rangeIndex]);
        }
      } catch (SQLException error) {
        throw new IOException("embedded log " + path + ": " + error.getMessage(), error);
      }
    }

    @Override
    public ColumnarBatch get() {
      return current;
    }

    @Override
    public void close() throws IOException {
      release();
      try {
        closeRange();
      } catch (SQLException error) {
        throw new IOException(error);
      }
      allocator.close();
    }

    private void openRange(Range range) throws SQLException, IOException {
      closeRange();
      if (range.start == range.end) {
        return;
      }
      Properties settings = new Properties();
      settings.setProperty("busy_timeout", "60000");
      db = DriverManager.getConnection(
          "jdbc:sqlite:" + path + String.format("/bucket-%05d.sqlite", range.bucket), settings);
      try (PreparedStatement bounds =
              db.prepareStatement("SELECT earliest_offset, next_offset FROM bounds");
          ResultSet row = bounds.executeQuery()) {
        row.next();
        long earliest = row.getLong(1);
        long latest = row.getLong(2);
        if (range.start > range.end) {
          throw outOfRange(range, "empty range [" + range.start + ", " + range.end + ") is reversed");
        }
        if (range.start < earliest) {
          throw outOfRange(range, "offset " + range.start + " is below the earliest offset "
              + earliest + "; retention removed offsets [" + range.start + ", " + earliest + ")");
        }
        if (range.end > latest) {
          throw outOfRange(range, "offset " + range.end + " is past the latest offset " + latest);
        }
      }
      PreparedStatement query = db.prepareStatement(OVERLAPPING);
      query.setLong(1, range.start);
      query.setLong(2, range.end);
      query.setLong(3, range.start);
      blobs = query.executeQuery();
      expected = range.start;
    }

    private void finishRange(Range range) throws SQLException, IOException {
      closeRange();
      if (range.start != range.end && expected != range.end) {
        throw outOfRange(range, "offsets [" + expected + ", " + range.end
            + ") were removed while reading");
      }
    }

    private static IOException outOfRange(Range range, String what) {
      return new IOException("bucket " + range.bucket + ": " + what);
    }

    private void closeRange() throws SQLException {
      if (blobs != null) {
        blobs.getStatement().close();
        blobs = null;
      }
      if (db != null) {
        db.close();
        db = null;
      }
    }

    private ColumnarBatch decode(Range range) throws SQLException, IOException {
      long firstOffset = blobs.getLong(1);
      long recordCount = blobs.getLong(2);
      double appendedAt = blobs.getDouble(3);
      byte[] data = blobs.getBytes(4);
      long low = Math.max(range.start, firstOffset);
      long high = Math.min(range.end, firstOffset + recordCount);
      if (low != expected) {
        throw outOfRange(range, "offsets [" + expected + ", " + low + ") were removed while reading");
      }
      expected = high;
      ArrowStreamReader reader = new ArrowStreamReader(
          new ByteArrayInputStream(data), allocator, CommonsCompressionFactory.INSTANCE);
      held.add(reader);
      if (!reader.loadNextBatch()) {
        throw outOfRange(range, "the blob at offset " + firstOffset + " holds no records");
      }
      VectorSchemaRoot stored = reader.getVectorSchemaRoot();
      int skip = (int) (low - firstOffset);
      int rows = (int) (high - low);
      ColumnVector[] columns = new ColumnVector[schema.fields().length];
      for (int i = 0; i < columns.length; i++) {
        columns[i] = new ArrowColumnVector(
            column(schema.fields()[i], stored, skip, rows, range.bucket, low, appendedAt));
      }
      return new ColumnarBatch(columns, rows);
    }

    /** One output column of the rows [skip, skip + rows) of a stored blob. */
    private FieldVector column(
        StructField field, VectorSchemaRoot stored, int skip, int rows, int bucket, long low,
        double appendedAt) throws IOException {
      switch (field.name()) {
        case "_bucket": {
          IntVector out = keep(new IntVector(field.name(), allocator));
          out.allocateNew(rows);
          for (int i = 0; i < rows; i++) {
            out.set(i, bucket);
          }
          out.setValueCount(rows);
          return out;
        }
        case "_offset": {
          BigIntVector out = keep(new BigIntVector(field.name(), allocator));
          out.allocateNew(rows);
          for (int i = 0; i < rows; i++) {
            out.set(i, low + i);
          }
          out.setValueCount(rows);
          return out;
        }
        case "_appended_at": {
          // As the Python reader rounds it: seconds to microseconds, halves to even.
          long micros = (long) Math.rint(appendedAt * 1_000_000.0);
          TimeStampMicroTZVector out = keep(new TimeStampMicroTZVector(field.name(), allocator, "UTC"));
          out.allocateNew(rows);
          for (int i = 0; i < rows; i++) {
            out.set(i, micros);
          }
          out.setValueCount(rows);
          return out;
        }
        case "_timestamp":
          return slice(stored, timestampColumn, skip, rows);
        default:
          return slice(stored, field.name(), skip, rows);
      }
    }

    private FieldVector slice(VectorSchemaRoot stored, String name, int skip, int rows)
        throws IOException {
      FieldVector vector = stored.getVector(name);
      if (vector == null) {
        throw new IOException("embedded log " + path + ": no column " + name + " in the topic");
      }
      if (skip == 0 && rows == stored.getRowCount()) {
        return vector;
      }
      TransferPair pair = vector.getTransferPair(allocator);
      pair.splitAndTransfer(skip, rows);
      return keep((FieldVector) pair.getTo());
    }

    private <T extends AutoCloseable> T keep(T resource) {
      held.add(resource);
      return resource;
    }

    /** Frees the batch handed out last: Spark has read it by the next call. */
    private void release() {
      current = null;
      for (int i = held.size() - 1; i >= 0; i--) {
        try {
          held.get(i).close();
        } catch (Exception error) {
          throw new UncheckedIOException(new IOException(error));
        }
      }
      held.clear();
    }
  }
}
