package org.pylog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

/** A micro-batch read. Offsets as the Python source keeps them: {topic: {"partition": next}},
 *  sorted, so that a checkpoint moves between the two readers. */
final class PylogStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    /** {topic: {partition: next offset}} as JSON text in the Python source's layout. */
    static final class Offsets extends Offset {
        final TreeMap<String, TreeMap<Integer, Long>> map;

        Offsets(TreeMap<String, TreeMap<Integer, Long>> map) {
            this.map = map;
        }

        @Override
        public String json() {
            StringBuilder b = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<String, TreeMap<Integer, Long>> t : map.entrySet()) {
                if (!first) b.append(", ");
                first = false;
                b.append(Store.JSON.valueToTree(t.getKey()).toString()).append(": {");
                boolean f2 = true;
                for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
                    if (!f2) b.append(", ");
                    f2 = false;
                    b.append('"').append(p.getKey()).append("\": ").append(p.getValue());
                }
                b.append('}');
            }
            return b.append('}').toString();
        }

        static Offsets parse(String json) {
            TreeMap<String, TreeMap<Integer, Long>> out = new TreeMap<>();
            try {
                JsonNode n = Store.JSON.readTree(json);
                for (Iterator<Map.Entry<String, JsonNode>> it = n.fields(); it.hasNext(); ) {
                    Map.Entry<String, JsonNode> t = it.next();
                    TreeMap<Integer, Long> m = new TreeMap<>();
                    for (Iterator<Map.Entry<String, JsonNode>> pi = t.getValue().fields(); pi.hasNext(); ) {
                        Map.Entry<String, JsonNode> p = pi.next();
                        m.put(Integer.parseInt(p.getKey()), p.getValue().asLong());
                    }
                    out.put(t.getKey(), m);
                }
            } catch (IOException e) {
                throw new IllegalArgumentException("pylog: bad streaming offsets " + json, e);
            }
            return new Offsets(out);
        }
    }

    private final Options options;
    private final StructType schema;
    private final Pushed pushed;
    private Offsets frozen;

    PylogStream(Options options, StructType schema, Pushed pushed) {
        this.options = options;
        this.schema = schema;
        this.pushed = pushed;
        Planner.partitions(options);  // fail at once on a missing topic
    }

    private Map<String, Map<Integer, Store.Partition>> snapshot() {
        return Store.snapshot(options.rootPath(), Planner.partitions(options));
    }

    private Offsets latest() {
        TreeMap<String, TreeMap<Integer, Long>> out = new TreeMap<>();
        for (Map.Entry<String, Map<Integer, Store.Partition>> t : snapshot().entrySet()) {
            TreeMap<Integer, Long> m = new TreeMap<>();
            for (Store.Partition p : t.getValue().values()) m.put(p.partition, p.stable);
            out.put(t.getKey(), m);
        }
        return new Offsets(out);
    }

    @Override
    public Offset initialOffset() {
        Map<String, Map<Integer, Store.Partition>> snap = snapshot();
        Planner.checkSpec(options.startingOffsets, "startingOffsets", Planner.partitions(options));
        TreeMap<String, TreeMap<Integer, Long>> out = new TreeMap<>();
        for (Map.Entry<String, Map<Integer, Store.Partition>> t : snap.entrySet()) {
            TreeMap<Integer, Long> m = new TreeMap<>();
            for (Store.Partition p : t.getValue().values()) {
                m.put(p.partition, options.startingTimestamp != null ? Planner.offsetForTime(p, options.startingTimestamp)
                        : Planner.resolve(options.startingOffsets, t.getKey(), p.partition, p.start, p.stable, Options.EARLIEST));
            }
            out.put(t.getKey(), m);
        }
        return new Offsets(out);
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        frozen = latest();
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return options.maxOffsetsPerTrigger != null ? ReadLimit.maxRows(options.maxOffsetsPerTrigger) : ReadLimit.allAvailable();
    }

    @Override
    public Offset reportLatestOffset() {
        return latest();
    }

    @Override
    public Offset latestOffset() {
        return latest();
    }

    private long earliest(String topic, int p) {
        return Store.open(options.rootPath(), topic, p).start;
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        Offsets start = (Offsets) startOffset;
        Offsets last = frozen != null ? frozen : latest();
        TreeMap<String, long[]> begin = new TreeMap<>();  // "topic\0partition" -> {start, backlog}
        for (Map.Entry<String, TreeMap<Integer, Long>> t : last.map.entrySet()) {
            for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
                Long s = start.map.getOrDefault(t.getKey(), new TreeMap<>()).get(p.getKey());
                if (s == null) s = Math.min(earliest(t.getKey(), p.getKey()), p.getValue());
                begin.put(t.getKey() + "\0" + p.getKey(), new long[] {s, Math.max(0, p.getValue() - s)});
            }
        }
        if (limit instanceof ReadMaxRows) splitLimit(begin, ((ReadMaxRows) limit).maxRows());
        TreeMap<String, TreeMap<Integer, Long>> end = new TreeMap<>();
        for (Map.Entry<String, long[]> e : begin.entrySet()) {
            String[] k = e.getKey().split("\0");
            end.computeIfAbsent(k[0], x -> new TreeMap<>()).put(Integer.parseInt(k[1]), e.getValue()[0] + e.getValue()[1]);
        }
        for (Map.Entry<String, TreeMap<Integer, Long>> t : start.map.entrySet()) {  // never backwards, never drop
            TreeMap<Integer, Long> e = end.computeIfAbsent(t.getKey(), x -> new TreeMap<>());
            for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
                e.put(p.getKey(), Math.max(e.getOrDefault(p.getKey(), p.getValue()), p.getValue()));
            }
        }
        return new Offsets(end);
    }

    /** Share {@code limit} records among partitions in proportion to their backlog (as the
     *  Python source's _split_limit): backlog[1] becomes what is taken. */
    static void splitLimit(TreeMap<String, long[]> backlog, long limit) {
        long total = 0;
        for (long[] v : backlog.values()) total += v[1];
        if (total <= limit) return;
        TreeMap<String, Long> take = new TreeMap<>();
        long sum = 0;
        for (Map.Entry<String, long[]> e : backlog.entrySet()) {
            long t = java.math.BigInteger.valueOf(e.getValue()[1]).multiply(java.math.BigInteger.valueOf(limit))
                    .divide(java.math.BigInteger.valueOf(total)).longValue();
            take.put(e.getKey(), t);
            sum += t;
        }
        long left = limit - sum;
        List<String> keys = new ArrayList<>(backlog.keySet());
        keys.sort(Comparator.comparingLong((String k) -> -(backlog.get(k)[1] - take.get(k))).thenComparing(k -> k));
        for (String k : keys) {
            if (left <= 0) break;
            if (take.get(k) < backlog.get(k)[1]) {
                take.put(k, take.get(k) + 1);
                left--;
            }
        }
        for (Map.Entry<String, long[]> e : backlog.entrySet()) e.getValue()[1] = take.get(e.getKey());
    }

    @Override
    public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
        Offsets start = (Offsets) startOffset;
        Offsets end = (Offsets) endOffset;
        Path root = options.rootPath();
        List<Slice> out = new ArrayList<>();
        Map<String, Map<Integer, Store.Partition>> opened = new TreeMap<>();
        for (Map.Entry<String, TreeMap<Integer, Long>> t : end.map.entrySet()) {
            for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
                Store.Partition part = Store.open(root, t.getKey(), p.getKey());
                opened.computeIfAbsent(t.getKey(), x -> new TreeMap<>()).put(p.getKey(), part);
                Long s = start == null ? null : start.map.getOrDefault(t.getKey(), new TreeMap<>()).get(p.getKey());
                if (s == null) s = Math.min(part.start, p.getValue());
                if (p.getValue() > s) {
                    if (p.getValue() > part.next()) {
                        throw new IllegalStateException("pylog: topic '" + t.getKey() + "' partition " + p.getKey()
                                + " ends at " + part.next() + ", before the batch's end offset " + p.getValue()
                                + ": the log was truncated");
                    }
                    Planner.slices(part, s, p.getValue(), options.failOnDataLoss, out);
                }
            }
        }
        return Planner.split(out, options.minPartitions, opened).toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new SliceReader.Factory(schema, pushed.micros, null, null);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return Offsets.parse(json);
    }

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}
}
