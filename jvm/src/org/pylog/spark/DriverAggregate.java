package org.pylog.spark;

import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.connector.read.LocalScan;
import org.apache.spark.sql.types.StructType;

/** COUNT, MIN and MAX answered whole in the driver, with no Spark job: a read small enough
 *  (at most {@link #MAX_BYTES} of store files in its plan) is walked frame by frame (every
 *  frame's CRC and bounds checked, as a task does) faster than a job with a shuffle starts.
 *  Spark plans it as a local relation of one row. */
final class DriverAggregate implements LocalScan {
    /** The session setting: plans up to this many bytes (default 256 MiB) are aggregated in
     *  the driver; bigger ones by tasks, one row of partial aggregates per slice (0: always by
     *  tasks). At about 1.5 GB/s a walk of 256 MiB takes about what a two-stage job costs to
     *  schedule on a few cores, so beyond it the tasks win. */
    static final String MAX_BYTES_CONF = "spark.pylog.driverAggregateBytes";
    static final long MAX_BYTES = 256L << 20;

    static long maxBytes() {
        String v = org.apache.spark.sql.SparkSession.active().conf().get(MAX_BYTES_CONF, Long.toString(MAX_BYTES)).trim();
        try {
            long n = Long.parseLong(v);
            if (n >= 0) return n;
        } catch (NumberFormatException e) {
            // the error below
        }
        throw new IllegalArgumentException("pylog: " + MAX_BYTES_CONF + " must be a number of bytes >= 0, got '" + v + "'");
    }

    private final List<Slice> plan;
    private final StructType schema;
    private final long[][] micros;
    private final int[] aggregates;
    private final int[] aggregateColumns;

    DriverAggregate(List<Slice> plan, StructType schema, long[][] micros, int[] aggregates, int[] aggregateColumns) {
        this.plan = plan;
        this.schema = schema;
        this.micros = micros;
        this.aggregates = aggregates;
        this.aggregateColumns = aggregateColumns;
    }

    static long bytes(List<Slice> plan) {
        long n = 0;
        for (Slice s : plan) n += s.endPosition - s.startPosition;
        return n;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return "pylog aggregate in the driver over " + plan.size() + " slices";
    }

    @Override
    public InternalRow[] rows() {
        int n = aggregates.length;
        long[] acc = new long[n];
        boolean[] seen = new boolean[n];
        // the slices' partial rows, walked on the driver's cores at once (as tasks would be)
        List<InternalRow> parts = plan.parallelStream().map(s -> {
            SliceReader r = new SliceReader(s, PylogProvider.SCHEMA, micros).aggregating(aggregates, aggregateColumns);
            try {
                return r.next() ? r.get().copy() : null;
            } finally {
                r.close();
            }
        }).collect(java.util.stream.Collectors.toList());
        for (InternalRow part : parts) {
            if (part == null) continue;
            {
                for (int i = 0; i < n; i++) {
                    if (aggregates[i] == PylogScanBuilder.AGG_COUNT) {
                        acc[i] += part.getLong(i);
                        seen[i] = true;
                    } else if (!part.isNullAt(i)) {
                        long x = aggregateColumns[i] == PylogScanBuilder.PARTITION_COLUMN ? part.getInt(i) : part.getLong(i);
                        boolean min = aggregates[i] == PylogScanBuilder.AGG_MIN;
                        acc[i] = !seen[i] ? x : min ? Math.min(acc[i], x) : Math.max(acc[i], x);
                        seen[i] = true;
                    }
                }
            }
        }
        UnsafeRowWriter w = new UnsafeRowWriter(n, 0);
        w.reset();
        w.zeroOutNullBytes();
        for (int i = 0; i < n; i++) {
            if (aggregates[i] == PylogScanBuilder.AGG_COUNT) w.write(i, acc[i]);
            else if (!seen[i]) w.setNullAt(i);
            else if (aggregateColumns[i] == PylogScanBuilder.PARTITION_COLUMN) w.write(i, (int) acc[i]);
            else w.write(i, acc[i]);
        }
        return new InternalRow[] {w.getRow().copy()};
    }
}
