package org.pylog.spark;

import java.util.List;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.expressions.aggregate.Max;
import org.apache.spark.sql.connector.expressions.aggregate.Min;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** Column pruning, exact filters on topic, partition, offset and timestamp, and partial
 *  aggregates (COUNT, MIN/MAX of offset, partition and timestamp: one row per slice, which
 *  Spark combines). */
final class PylogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters,
        SupportsPushDownAggregates {
    private final Options options;
    private final CaseInsensitiveStringMap raw;
    private final Pushed pushed = new Pushed();
    private StructType schema = PylogProvider.SCHEMA;
    private int[] aggregates;  // per output column: AGG_COUNT, AGG_MIN or AGG_MAX, and the column (below)
    private int[] aggregateColumns;

    static final int AGG_COUNT = 0;
    static final int AGG_MIN = 1;
    static final int AGG_MAX = 2;
    static final int PARTITION_COLUMN = PylogProvider.SCHEMA.fieldIndex("partition");

    private List<Slice> plan;  // planned when Spark asks whether the aggregates go whole
    private final long[] rows = {0};
    private boolean complete;

    private static int column(org.apache.spark.sql.connector.expressions.Expression e, boolean anyNonNull) {
        if (!(e instanceof NamedReference) || ((NamedReference) e).fieldNames().length != 1) return -1;
        String n = ((NamedReference) e).fieldNames()[0];
        if (n.equals("offset") || n.equals("timestamp") || n.equals("partition")) return PylogProvider.SCHEMA.fieldIndex(n);
        if (anyNonNull && (n.equals("topic") || n.equals("timestampType"))) return PylogProvider.SCHEMA.fieldIndex(n);
        return -1;
    }

    @Override
    public boolean pushAggregation(Aggregation a) {
        if (!supported(a)) return false;
        AggregateFunc[] fs = a.aggregateExpressions();
        int[] kinds = new int[fs.length];
        int[] cols = new int[fs.length];
        StructType out = new StructType();
        for (int i = 0; i < fs.length; i++) {
            AggregateFunc f = fs[i];
            if (f instanceof CountStar || (f instanceof Count && !((Count) f).isDistinct()
                    && column(((Count) f).column(), true) >= 0)) {
                kinds[i] = AGG_COUNT;
                cols[i] = -1;
                out = out.add("agg" + i, DataTypes.LongType, false);
                continue;
            }
            org.apache.spark.sql.connector.expressions.Expression c = f instanceof Min ? ((Min) f).column()
                    : f instanceof Max ? ((Max) f).column() : null;
            int col = c == null ? -1 : column(c, false);
            if (col < 0) return false;
            kinds[i] = f instanceof Min ? AGG_MIN : AGG_MAX;
            cols[i] = col;
            out = out.add("agg" + i, PylogProvider.SCHEMA.fields()[col].dataType(), true);
        }
        aggregates = kinds;
        aggregateColumns = cols;
        schema = out;
        return true;
    }

    private static boolean supported(Aggregation a) {
        if (a.groupByExpressions().length != 0) return false;
        for (AggregateFunc f : a.aggregateExpressions()) {
            boolean count = f instanceof CountStar
                    || (f instanceof Count && !((Count) f).isDistinct() && column(((Count) f).column(), true) >= 0);
            org.apache.spark.sql.connector.expressions.Expression c = f instanceof Min ? ((Min) f).column()
                    : f instanceof Max ? ((Max) f).column() : null;
            if (!count && (c == null || column(c, false) < 0)) return false;
        }
        return true;
    }

    /** Whole in the driver when the read is small (Spark asks before it pushes the aggregates,
     *  after the filters): {@link DriverAggregate}; else one row per slice, which Spark adds up. */
    @Override
    public boolean supportCompletePushDown(Aggregation a) {
        if (!supported(a)) return false;
        long most = DriverAggregate.maxBytes();
        if (most == 0) return false;
        plan = Planner.batch(options, pushed, rows);
        complete = DriverAggregate.bytes(plan) <= most;
        return complete;
    }

    PylogScanBuilder(Options options, CaseInsensitiveStringMap raw) {
        this.options = options;
        this.raw = raw;
    }

    @Override
    public void pruneColumns(StructType required) {
        if (aggregates == null) schema = required;
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        return pushed.push(filters);
    }

    @Override
    public Filter[] pushedFilters() {
        return pushed.accepted.toArray(new Filter[0]);
    }

    @Override
    public Scan build() {
        if (complete && aggregates != null) {
            return new DriverAggregate(plan, schema, pushed.micros, aggregates, aggregateColumns);
        }
        return new PylogScan(options, raw, pushed, schema, aggregates, aggregateColumns, plan, rows[0]);  // (one plan)
    }
}
