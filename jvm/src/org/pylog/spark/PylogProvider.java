package org.pylog.spark;

import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The {@code pylog} format on the JVM: batch and micro-batch reads of a pylog data root.
 *  Writes go to the Python source (registered as {@code pylog-python} by
 *  {@code pylog.spark.register()}), where the store's transaction commit lives. */
public final class PylogProvider implements TableProvider, DataSourceRegister {
    /** The name the Python source is registered under beside this one. */
    public static final String PYTHON_NAME = "pylog-python";
    /** The session setting that chooses the reader behind {@code format("pylog")}. */
    public static final String READER_CONF = "spark.pylog.reader";

    /** The columns of a read: Spark's Kafka source's, plus {@code metadata}. */
    public static final StructType SCHEMA = new StructType()
            .add("key", DataTypes.BinaryType)
            .add("value", DataTypes.BinaryType)
            .add("topic", DataTypes.StringType)
            .add("partition", DataTypes.IntegerType)
            .add("offset", DataTypes.LongType)
            .add("timestamp", DataTypes.TimestampType)
            .add("timestampType", DataTypes.IntegerType)
            .add("metadata", DataTypes.BinaryType);

    /** A provider (Spark makes one per lookup). */
    public PylogProvider() {}

    @Override
    public String shortName() {
        return "pylog";
    }

    /** The session's {@code spark.pylog.reader}: "jvm" (the default) or "python", which hands
     *  every read to the Python source too (as if the jar were not there). */
    static boolean python() {
        String v = SparkSession.active().conf().get(READER_CONF, "jvm").trim().toLowerCase();
        if (v.equals("python")) return true;
        if (v.equals("jvm")) return false;
        throw new IllegalArgumentException("pylog: " + READER_CONF + " must be jvm or python, got '" + v + "'");
    }

    /** True when a read names an option the connector does not read ({@link Options#KNOWN}):
     *  the Python source then reads it, with every option of the contract (docs/spark.md,
     *  "Options"), and refuses a name that is no option at all with its one-line error. */
    static boolean pythonOptions(java.util.Map<String, String> options) {
        for (String k : options.keySet()) {
            if (Options.KNOWN.stream().noneMatch(n -> n.equalsIgnoreCase(k))) return true;
        }
        return false;
    }

    static PythonDataSourceV2 pythonSource() {
        PythonDataSourceV2 py = new PythonDataSourceV2();
        py.setShortName(PYTHON_NAME);
        return py;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return python() || pythonOptions(options) ? pythonSource().inferSchema(options) : SCHEMA;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;  // a write hands its own schema (the Python source checks it)
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        if (python() || pythonOptions(properties)) return pythonSource().getTable(schema, partitioning, properties);
        return new PylogTable(schema, partitioning, properties);
    }
}
