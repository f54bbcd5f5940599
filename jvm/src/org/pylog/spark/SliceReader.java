package org.pylog.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** Reads one slice: maps its bytes of the store file and checks every frame (CRC32C,
 *  bounds, attributes, offsets) before it becomes a row of the columns asked for. */
final class SliceReader implements PartitionReader<InternalRow> {
    /** Makes a reader per slice in the tasks. */
    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final long[][] micros;
        private final int[] aggregates;
        private final int[] aggregateColumns;

        Factory(StructType schema, long[][] micros, int[] aggregates, int[] aggregateColumns) {
            this.schema = schema;
            this.micros = micros;
            this.aggregates = aggregates;
            this.aggregateColumns = aggregateColumns;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            SliceReader r = new SliceReader((Slice) partition, aggregates != null ? PylogProvider.SCHEMA : schema, micros);
            return aggregates == null ? r : r.aggregating(aggregates, aggregateColumns);
        }
    }

    private static final int KEY = 0;
    private static final int VALUE = 1;
    private static final int TOPIC = 2;
    private static final int PARTITION = 3;
    private static final int OFFSET = 4;
    private static final int TIMESTAMP = 5;
    private static final int TIMESTAMP_TYPE = 6;
    private static final int METADATA = 7;

    private final Slice slice;
    private final int[] columns;
    private final long[][] micros;
    private final boolean allTimes;
    private final UnsafeRowWriter writer;
    private final UTF8String topic;
    private MappedByteBuffer map;
    private int limit;
    private int pos;
    private long expected;
    private boolean done;
    private final Frames.Frame f = new Frames.Frame();
    private byte[] scratch = new byte[256];

    private int[] aggregates;
    private int[] aggregateColumns;
    private boolean aggregated;

    /** This reader, made to give one row of partial aggregates (COUNT, MIN, MAX) of its slice. */
    SliceReader aggregating(int[] kinds, int[] cols) {
        aggregates = kinds;
        aggregateColumns = cols;
        return this;
    }

    SliceReader(Slice slice, StructType schema, long[][] micros) {
        this.slice = slice;
        String[] names = schema.fieldNames();
        columns = new int[names.length];
        for (int i = 0; i < names.length; i++) columns[i] = PylogProvider.SCHEMA.fieldIndex(names[i]);
        this.micros = micros;
        allTimes = micros.length == 1 && micros[0][0] == Long.MIN_VALUE && micros[0][1] == Long.MAX_VALUE;
        writer = new UnsafeRowWriter(columns.length, 64);
        topic = UTF8String.fromString(slice.topic);
        expected = slice.startOffset;
        if (slice.store.isEmpty()) {  // the placeholder of an empty aggregate
            done = true;
            return;
        }
        try (FileChannel ch = Store.open(Paths.get(slice.store))) {
            long size = ch.size();
            if (size < slice.endPosition) {
                if (slice.failOnDataLoss) {
                    throw new IllegalStateException("pylog: " + slice.store + " is shorter than when the query was planned ("
                            + size + " < " + slice.endPosition + " bytes): the log was truncated meanwhile");
                }
                done = true;
                return;
            }
            map = ch.map(FileChannel.MapMode.READ_ONLY, slice.startPosition, slice.endPosition - slice.startPosition);
            map.order(ByteOrder.LITTLE_ENDIAN);
            limit = (int) (slice.endPosition - slice.startPosition);
        } catch (NoSuchFileException e) {
            if (slice.failOnDataLoss) throw Planner.dataLoss(slice.topic, slice.partition, slice.startOffset, -1);
            done = true;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    @Override
    public boolean next() {
        if (aggregates != null) return aggregate();
        return nextFrame(true);
    }

    private boolean aggregate() {
        if (aggregated) return false;
        aggregated = true;
        long count = 0;
        long[] lo = new long[PylogProvider.SCHEMA.size()];
        long[] hi = new long[lo.length];
        java.util.Arrays.fill(lo, Long.MAX_VALUE);
        java.util.Arrays.fill(hi, Long.MIN_VALUE);
        long loTs = Long.MAX_VALUE;
        long hiTs = Long.MIN_VALUE;
        while (nextFrame(false)) {  // offsets increase along a slice: the first and the last
            if (count++ == 0) lo[OFFSET] = f.offset;
            hi[OFFSET] = f.offset;
            loTs = Math.min(loTs, f.timestamp);
            hiTs = Math.max(hiTs, f.timestamp);
        }
        lo[TIMESTAMP] = loTs * 1000;
        hi[TIMESTAMP] = hiTs * 1000;
        lo[PARTITION] = hi[PARTITION] = slice.partition;
        UnsafeRowWriter w = new UnsafeRowWriter(aggregates.length, 0);
        w.reset();
        w.zeroOutNullBytes();
        for (int i = 0; i < aggregates.length; i++) {
            int c = aggregateColumns[i];
            if (aggregates[i] == PylogScanBuilder.AGG_COUNT) w.write(i, count);
            else if (count == 0) w.setNullAt(i);
            else {
                long x = aggregates[i] == PylogScanBuilder.AGG_MIN ? lo[c] : hi[c];
                if (c == PARTITION) w.write(i, (int) x); else w.write(i, x);
            }
        }
        row = w.getRow();
        return true;
    }

    private InternalRow row;

    private boolean nextFrame(boolean fill) {
        while (!done) {
            if (pos >= limit) {
                finish();
                return false;
            }
            int rc = Frames.decode(map, pos, limit, f);
            if (rc == Frames.OK && (slice.compacted ? f.offset < expected : f.offset != expected)) rc = Frames.E_OFFSET;
            if (rc != Frames.OK) {
                throw new CorruptRecordException(slice.store + " at position " + (slice.startPosition + pos)
                        + " (offset " + expected + "): " + Frames.reason(rc));
            }
            if (f.offset >= slice.endOffset) {
                finish();
                return false;
            }
            pos += f.size;
            expected = f.offset + 1;
            if (!allTimes && !Pushed.contains(micros, f.timestamp * 1000)) continue;
            if (fill) fill();
            return true;
        }
        return false;
    }

    private void finish() {
        done = true;
        if (expected < slice.endOffset && !slice.compacted && slice.failOnDataLoss) {
            throw new IllegalStateException("pylog: " + slice.store + " ended at offset " + expected
                    + ", expected records up to " + slice.endOffset + ": the log changed since the query was planned");
        }
    }

    private void bytes(int i, int at, int n, boolean isNull) {
        if (isNull) {
            writer.setNullAt(i);
            return;
        }
        if (scratch.length < n) scratch = new byte[Math.max(n, scratch.length * 2)];
        map.get(at, scratch, 0, n);
        writer.write(i, scratch, 0, n);
    }

    private void fill() {
        writer.reset();
        writer.zeroOutNullBytes();
        int k = f.position + 36;
        int md = k + f.keyLength;
        int v = md + f.metadataLength;
        for (int i = 0; i < columns.length; i++) {
            switch (columns[i]) {
                case KEY: bytes(i, k, f.keyLength, (f.attributes & Frames.ATTR_NULL_KEY) != 0); break;
                case VALUE: bytes(i, v, f.valueLength, (f.attributes & Frames.ATTR_NULL_VALUE) != 0); break;
                case TOPIC: writer.write(i, topic); break;
                case PARTITION: writer.write(i, slice.partition); break;
                case OFFSET: writer.write(i, f.offset); break;
                case TIMESTAMP: writer.write(i, f.timestamp * 1000); break;
                case TIMESTAMP_TYPE: writer.write(i, slice.timestampType); break;
                case METADATA: bytes(i, md, f.metadataLength, (f.attributes & Frames.ATTR_NULL_METADATA) != 0); break;
                default: throw new IllegalStateException("column " + columns[i]);
            }
        }
    }

    @Override
    public InternalRow get() {
        return aggregates != null ? row : writer.getRow();
    }

    @Override
    public void close() {
        map = null;
    }
}
