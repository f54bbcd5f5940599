package org.pylog.spark;

import java.util.List;
import java.util.OptionalLong;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A batch read: planned once (the snapshot), one input partition per slice. */
final class PylogScan implements Scan, Batch, SupportsReportStatistics {
    private final Options options;
    private final CaseInsensitiveStringMap raw;
    private final Pushed pushed;
    private final StructType schema;
    private List<Slice> plan;
    private final long[] rows = {0};

    private final int[] aggregates;
    private final int[] aggregateColumns;

    /** {@code plan}: the plan made already (with its row count in {@code rows}), or null. */
    PylogScan(Options options, CaseInsensitiveStringMap raw, Pushed pushed, StructType schema, int[] aggregates,
              int[] aggregateColumns, List<Slice> plan, long rows) {
        this.plan = plan;
        this.rows[0] = rows;
        this.aggregates = aggregates;
        this.aggregateColumns = aggregateColumns;
        this.options = options;
        this.raw = raw;
        this.pushed = pushed;
        this.schema = schema;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return "pylog " + options.root + " " + String.join(",", options.topics);
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new PylogStream(new Options(raw, true), schema, pushed);
    }

    private synchronized List<Slice> plan() {
        if (plan == null) plan = Planner.batch(options, pushed, rows);
        if (aggregates != null && plan.isEmpty()) {  // one row of partial aggregates (a count of 0)
            plan = List.of(new Slice("", 0, "", 0, 0, 0, 0, false, 0, false));
        }
        return plan;
    }

    @Override
    public InputPartition[] planInputPartitions() {
        return plan().toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new SliceReader.Factory(schema, pushed.micros, aggregates, aggregateColumns);
    }

    @Override
    public Statistics estimateStatistics() {
        List<Slice> p = plan();
        long bytes = 0;
        for (Slice s : p) bytes += s.endPosition - s.startPosition;
        long n = aggregates != null ? p.size() : rows[0];
        long b = bytes;
        return new Statistics() {
            @Override
            public OptionalLong sizeInBytes() {
                return OptionalLong.of(b);
            }

            @Override
            public OptionalLong numRows() {
                return OptionalLong.of(n);
            }
        };
    }
}
