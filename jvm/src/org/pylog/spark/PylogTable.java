package org.pylog.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A read of topics of a pylog data root; writes are handed to the Python source. */
final class PylogTable implements SupportsRead, SupportsWrite {
    private final StructType schema;
    private final Transform[] partitioning;
    private final Map<String, String> properties;

    PylogTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        this.schema = schema;
        this.partitioning = partitioning;
        this.properties = properties;
    }

    @Override
    public String name() {
        return "pylog";
    }

    @Override
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ,
                TableCapability.BATCH_WRITE, TableCapability.STREAMING_WRITE);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new PylogScanBuilder(new Options(options, false), options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        PythonDataSourceV2 py = PylogProvider.pythonSource();
        Table t;
        try {
            t = py.getTable(info.schema(), partitioning, properties);
        } catch (RuntimeException e) {
            throw new IllegalStateException("pylog: writes go through the Python source, registered as '"
                    + PylogProvider.PYTHON_NAME + "' by pylog.spark.register(spark): " + e.getMessage(), e);
        }
        return ((SupportsWrite) t).newWriteBuilder(info);
    }
}
