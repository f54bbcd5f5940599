package org.pylog.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** Column pruning and exact filters on topic, partition, offset and timestamp. */
final class PylogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    private final Options options;
    private final CaseInsensitiveStringMap raw;
    private final Pushed pushed = new Pushed();
    private StructType schema = PylogProvider.SCHEMA;

    PylogScanBuilder(Options options, CaseInsensitiveStringMap raw) {
        this.options = options;
        this.raw = raw;
    }

    @Override
    public void pruneColumns(StructType required) {
        schema = required;
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
        return new PylogScan(options, raw, pushed, schema);
    }
}
