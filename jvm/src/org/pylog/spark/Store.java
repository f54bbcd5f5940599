package org.pylog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.NotDirectoryException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** A pylog data root as a reader sees it (docs/format.md): topics, partitions, segments, the
 *  readable end of each partition and its last stable offset, the transaction protocol. */
final class Store {
    static final ObjectMapper JSON = new ObjectMapper();
    static final String TXN_DIR = "~txn";
    static final long NO_UNIT = -1L;  // 2^64 - 1 read as a signed long
    private static final Pattern PARTITION = Pattern.compile("^partition-(0|[1-9][0-9]*)$");
    private static final Pattern STORE = Pattern.compile("^([0-9]{20})\\.log$");
    private static final Pattern TXN_ID = Pattern.compile("^[0-9a-f]{32}$");

    private Store() {}

    /** One segment of a partition as planned: records [base, next) at positions [32, end). */
    static final class Segment {
        final long base;
        long next;
        final Path store;
        long end;
        final boolean compacted;

        Segment(long base, long next, Path store, long end, boolean compacted) {
            this.base = base;
            this.next = next;
            this.store = store;
            this.end = end;
            this.compacted = compacted;
        }
    }

    /** A partition: its segments, first offset, last stable offset and timestamp type. */
    static final class Partition {
        final String topic;
        final int partition;
        final List<Segment> segments = new ArrayList<>();
        long start;
        long stable;
        int timestampType;
        boolean appendTime;

        Partition(String topic, int partition) {
            this.topic = topic;
            this.partition = partition;
        }

        /** The offset after the last readable record (the stable offset ignores transactions). */
        long next() {
            return segments.isEmpty() ? 0 : segments.get(segments.size() - 1).next;
        }
    }

    static Path partitionDir(Path root, String topic, int p) {
        return root.resolve(topic).resolve("partition-" + p);
    }

    /** The partitions of a topic (from topic.json, else the partition-N directories found). */
    static List<Integer> partitionsOf(Path root, String topic) {
        Path d = root.resolve(topic);
        Path meta = d.resolve("topic.json");
        try {
            byte[] data = Files.readAllBytes(meta);
            JsonNode n = JSON.readTree(data);
            JsonNode parts = n == null ? null : n.get("partitions");
            if (n == null || !n.isObject() || n.path("version").asInt(-1) != 1 || parts == null || !parts.isInt()
                    || parts.asInt() < 1) {
                throw new IllegalArgumentException("pylog: topic file of '" + topic + "' has an unknown layout, "
                        + "version or partition count: " + meta);
            }
            List<Integer> out = new ArrayList<>();
            for (int i = 0; i < parts.asInt(); i++) out.add(i);
            return out;
        } catch (NoSuchFileException | NotDirectoryException e) {
            // a bare directory of partition-N logs
        } catch (IOException e) {
            throw new IllegalArgumentException("pylog: topic file of '" + topic + "' is not valid JSON: " + e.getMessage());
        }
        List<Integer> out = new ArrayList<>();
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(d)) {
            for (Path x : ds) {
                Matcher m = PARTITION.matcher(x.getFileName().toString());
                if (m.matches()) out.add(Integer.parseInt(m.group(1)));
            }
        } catch (NoSuchFileException | NotDirectoryException e) {
            // below
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("pylog option topic: no topic '" + topic + "' under " + root);
        }
        Collections.sort(out);
        return out;
    }

    // ---- the transaction protocol ----------------------------------------------------------

    /** What a reader compares before and after it looks at the partitions: the bytes of
     *  {@code ~txn/visible} (the transaction last published) and whether that transaction's
     *  directory still exists. */
    static byte[] visibility(Path root) {
        Path txn = root.resolve(TXN_DIR);
        byte[] data;
        try {
            data = Files.readAllBytes(txn.resolve("visible"));
        } catch (NoSuchFileException | NotDirectoryException e) {
            return new byte[] {2};
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        String id = new String(data, StandardCharsets.US_ASCII).trim();
        boolean exists = TXN_ID.matcher(id).matches() && Files.isDirectory(txn.resolve(id));
        byte[] out = Arrays.copyOf(data, data.length + 1);
        out[data.length] = (byte) (exists ? 1 : 0);
        return out;
    }

    /** {@code fn.get()} between two equal {@link #visibility} reads (called again otherwise),
     *  so that every transaction is in all the partitions it read or in none. */
    static <T> T consistent(Path root, Supplier<T> fn) {
        for (int attempt = 0; ; attempt++) {
            byte[] before = visibility(root);
            T out = fn.get();
            if (Arrays.equals(before, visibility(root))) return out;
            if (attempt >= 3) {
                try {
                    Thread.sleep(Math.min(attempt, 50));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException(e);
                }
            }
        }
    }

    /** The start of the transaction the partition's txn.stable names while that transaction's
     *  directory exists, else -1. */
    static long stableCap(Path root, Path dir) {
        byte[] data;
        Path f = dir.resolve("txn.stable");
        try {
            data = Files.readAllBytes(f);
        } catch (NoSuchFileException e) {
            return -1;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        try {
            JsonNode n = JSON.readTree(data);
            JsonNode txn = n.get("txn");
            JsonNode start = n.get("start");
            if (txn == null || !txn.isTextual() || start == null || !start.isIntegralNumber() || start.asLong() < 0) {
                throw new IOException("bad fields");
            }
            Path t = root.resolve(TXN_DIR).resolve(txn.asText());
            return Files.isDirectory(t) ? start.asLong() : -1;
        } catch (IOException | RuntimeException e) {
            throw new CorruptRecordException(f + ": unreadable stable-offset marker (" + e.getMessage() + ")");
        }
    }

    // ---- partitions ------------------------------------------------------------------------

    private static String timestamps(Path root, String topic, Path dir) {
        for (Path cfg : new Path[] {dir.resolve("config.json"), root.resolve(topic).resolve("topic.json")}) {
            try {
                JsonNode n = JSON.readTree(Files.readAllBytes(cfg));
                JsonNode c = cfg.getFileName().toString().equals("topic.json") ? n.path("config") : n;
                JsonNode t = c.get("timestamps");
                return t != null && t.isTextual() ? t.asText() : "monotonic";
            } catch (NoSuchFileException e) {
                continue;
            } catch (IOException e) {
                throw new IllegalArgumentException("pylog: " + cfg + " is not valid JSON: " + e.getMessage());
            }
        }
        return "monotonic";
    }

    private static long[] readCheckpoint(Path f, String magic, int size) {
        byte[] b;
        try {
            b = Files.readAllBytes(f);
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        if (b.length != size) return null;
        ByteBuffer h = ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
        if (!new String(b, 0, 8, StandardCharsets.US_ASCII).equals(magic)) return null;
        if ((h.getShort(8) & 0xFFFF) != 1 || Frames.crc32c(h, 0, size - 4) != h.getInt(size - 4)) return null;
        long[] out = new long[(size - 20) / 8];
        for (int i = 0; i < out.length; i++) out[i] = h.getLong(16 + 8 * i);
        return out;
    }

    /** Every offset of segment {@code base} below it is known durable. */
    private static long durable(Path dir, long base) {
        long[] rp = readCheckpoint(dir.resolve("recovery-point"), "PYLOGCKP", 28);
        long[] mark = readCheckpoint(dir.resolve("durable-point"), "PYLOGDUR", 44);
        long d = rp == null ? 0 : rp[0];
        if (mark != null && mark[0] == base) d = Math.max(d, mark[1]);
        // not past a write unit the writer's roll from this segment split, nor a truncate
        if (mark != null && mark[2] != NO_UNIT && mark[0] > base) d = Math.min(d, mark[2]);
        long t = truncatePoint(dir);
        return t >= 0 ? Math.min(d, t) : d;
    }

    /** The offset of a truncate under way ({@code truncate-point}), or -1. */
    private static long truncatePoint(Path dir) {
        long[] t = readCheckpoint(dir.resolve("truncate-point"), "PYLOGTRP", 28);
        return t == null ? -1 : t[0];
    }

    private static byte[] raw(Path f) {
        try {
            return Files.readAllBytes(f);
        } catch (NoSuchFileException | NotDirectoryException e) {
            return new byte[0];
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** What a reader compares before and after it looks at a partition's files, as pylog's
     *  read-only Log does (pylog.loader.truncate_state): the bytes of {@code truncate-point}
     *  and of {@code recovery-point} (which counts truncates), and the segment and open write
     *  unit {@code durable-point} names. Two equal reads enclose no part of a truncate and no
     *  change of the split-unit cap. */
    static byte[] partitionState(Path dir) {
        byte[] t = raw(dir.resolve("truncate-point"));
        byte[] rp = raw(dir.resolve("recovery-point"));
        byte[] m = raw(dir.resolve("durable-point"));
        if (m.length == 44) {
            byte[] k = new byte[16];
            System.arraycopy(m, 16, k, 0, 8);
            System.arraycopy(m, 32, k, 8, 8);
            m = k;
        }
        byte[] out = new byte[12 + t.length + rp.length + m.length];
        ByteBuffer b = ByteBuffer.wrap(out);
        b.putInt(t.length).put(t).putInt(rp.length).put(rp).putInt(m.length).put(m);
        return out;
    }

    static FileChannel open(Path p) throws IOException {
        return FileChannel.open(p, StandardOpenOption.READ);
    }

    static long headerOf(FileChannel ch, Path store, long base) throws IOException {
        long flags = Frames.headerFlags(Frames.read(ch, 0, Frames.FILE_HEADER), Frames.STORE_MAGIC, base);
        if (flags < 0) throw new CorruptRecordException(store + ": bad store file header");
        return flags;
    }

    /** A partition as a read-only reader sees it now (docs/format.md; pylog's read-only Log):
     *  sealed segments whole, the last one up to its last whole write unit (or its last
     *  durable record), capped by a transaction being applied, by a write unit a roll split
     *  and by a truncate under way. */
    static Partition open(Path root, String topic, int p) {
        Path dir = partitionDir(root, topic, p);
        for (int attempt = 0; ; attempt++) {
            byte[] before = partitionState(dir);
            Partition out = openOnce(root, topic, p, dir);
            if (Arrays.equals(before, partitionState(dir))) return out;
            if (attempt >= 3) {
                try {
                    Thread.sleep(Math.min(attempt, 50));  // truncates or rolls back to back
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("pylog: interrupted while planning " + dir, e);
                }
            }
        }
    }

    /** {@link #open}'s one look at the files; sound between two equal {@link #partitionState}s. */
    private static Partition openOnce(Path root, String topic, int p, Path dir) {
        Partition out = new Partition(topic, p);
        List<Long> bases = new ArrayList<>();
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(dir)) {
            for (Path x : ds) {
                Matcher m = STORE.matcher(x.getFileName().toString());
                if (m.matches()) bases.add(Long.parseLong(m.group(1)));
            }
        } catch (NoSuchFileException | NotDirectoryException e) {
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        if (bases.isEmpty()) return out;
        Collections.sort(bases);
        String ts = timestamps(root, topic, dir);
        out.appendTime = ts.equals("append-time");
        out.timestampType = out.appendTime ? 1 : 0;
        try {
            for (int i = 0; i + 1 < bases.size(); i++) {
                long b = bases.get(i);
                Path s = dir.resolve(String.format("%020d.log", b));
                try (FileChannel ch = open(s)) {
                    long flags = headerOf(ch, s, b);
                    out.segments.add(new Segment(b, bases.get(i + 1), s, ch.size(), (flags & Frames.HEADER_COMPACTED) != 0));
                } catch (NoSuchFileException e) {
                    // deleted (retention) since the listing: a later look sees the start moved
                    if (!out.segments.isEmpty()) throw e;
                }
            }
            long b = bases.get(bases.size() - 1);
            Path s = dir.resolve(String.format("%020d.log", b));
            Segment tail;
            try (FileChannel ch = open(s)) {
                long flags = headerOf(ch, s, b);
                boolean gaps = (flags & Frames.HEADER_COMPACTED) != 0;
                tail = new Segment(b, b, s, Frames.FILE_HEADER, gaps);
                walkTail(ch, tail, durable(dir, b));
            }
            out.segments.add(tail);
            out.start = out.segments.get(0).base;
            long next = tail.next;
            long cap = stableCap(root, dir);
            if (!out.segments.isEmpty() && out.segments.size() > 1 && tail.next == tail.base) {
                long[] mark = readCheckpoint(dir.resolve("durable-point"), "PYLOGDUR", 44);
                if (mark != null && mark[2] != NO_UNIT && mark[0] >= tail.base && tail.base > mark[2]) {
                    cap = cap < 0 ? mark[2] : Math.min(cap, mark[2]);
                }
            }
            long t = truncatePoint(dir);  // a truncate under way: what it drops never shows
            if (t >= 0) cap = cap < 0 ? t : Math.min(cap, t);
            out.stable = cap < 0 || cap > next ? next : cap;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return out;
    }

    /** The readable end of the last segment: the whole, valid frames from its start, up to the
     *  end of the last whole write unit, or of the last record below the durable point when
     *  that is later (pylog.torn.readable_end). */
    private static void walkTail(FileChannel ch, Segment seg, long durable) throws IOException {
        // a plan before this one walked the file up to a unit end: walk on from there (as a
        // read-only Log's refresh does), unless the file was replaced (a truncate does that)
        String key = seg.store + " " + Files.readAttributes(seg.store, BasicFileAttributes.class).fileKey();
        long[] known = TAILS.get(key);
        long size = ch.size();
        long from = Frames.FILE_HEADER;
        long fromNext = seg.base;
        if (known != null && known[0] <= size) {
            from = known[0];
            fromNext = known[1];
        }
        Walker w = new Walker(ch, size, from, fromNext, seg.compacted);
        long keepPos = w.pos;
        long keepNext = w.next;
        long durPos = w.pos;
        long durNext = w.next;
        while (w.step()) {
            if ((w.frame.attributes & Frames.ATTR_UNIT_CONTINUES) == 0) {
                keepPos = w.pos;
                keepNext = w.next;
            }
            if (w.frame.offset < durable) {
                durPos = w.pos;
                durNext = w.next;
            }
        }
        if (durPos > keepPos) {
            keepPos = durPos;
            keepNext = durNext;
        }
        seg.end = keepPos;
        seg.next = keepNext;
        if (TAILS.size() > 4096) TAILS.clear();
        TAILS.put(key, new long[] {keepPos, keepNext});
    }

    /** Where earlier plans found each last segment's readable end: {position, next offset}. */
    private static final java.util.concurrent.ConcurrentHashMap<String, long[]> TAILS =
            new java.util.concurrent.ConcurrentHashMap<>();

    /** (position, offset) of the first frame of {@code seg} holding an offset >= target (its
     *  end if none), through the offset index as a hint (an entry is used only when the frame
     *  it points at is valid and holds the offset it names). */
    static long[] find(Segment seg, long target) {
        if (target <= seg.base) return new long[] {Frames.FILE_HEADER, seg.base};
        if (target >= seg.next) return new long[] {seg.end, seg.next};
        try (FileChannel ch = open(seg.store)) {
            long[] hint = indexHint(ch, seg, target);
            Walker w = new Walker(ch, seg.end, hint[0], hint[1], seg.compacted);
            long pos = w.pos;
            while (w.step()) {
                if (w.frame.offset >= target) return new long[] {w.framePos, w.frame.offset};
                pos = w.pos;
            }
            return new long[] {pos, w.next};
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static ByteBuffer index(Segment seg) {
        Path idx = seg.store.resolveSibling(String.format("%020d.index", seg.base));
        try (FileChannel ch = open(idx)) {
            long n = ch.size();
            if (n < Frames.FILE_HEADER || n > (64 << 20)) return null;
            ByteBuffer b = Frames.read(ch, 0, (int) n);
            if (Frames.headerFlags(b, Frames.INDEX_MAGIC, seg.base) != 0) return null;
            return b;
        } catch (IOException e) {
            return null;
        }
    }

    /** A valid frame at or before {@code target} to walk from: (position, offset). */
    private static long[] indexHint(FileChannel ch, Segment seg, long target) throws IOException {
        long[] start = {Frames.FILE_HEADER, seg.base};
        ByteBuffer b = index(seg);
        if (b == null) return start;
        int n = (b.limit() - Frames.FILE_HEADER) / 8;
        long rel = target - seg.base;
        int lo = 0;
        int hi = n - 1;
        int found = -1;
        while (lo <= hi) {
            int mid = (lo + hi) >>> 1;
            long r = b.getInt(Frames.FILE_HEADER + 8 * mid) & 0xFFFFFFFFL;
            if (r <= rel) {
                found = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (found < 0) return start;
        long r = b.getInt(Frames.FILE_HEADER + 8 * found) & 0xFFFFFFFFL;
        long pos = b.getInt(Frames.FILE_HEADER + 8 * found + 4) & 0xFFFFFFFFL;
        if (pos < Frames.FILE_HEADER || pos >= seg.end) return start;
        Walker w = new Walker(ch, seg.end, pos, seg.base + r, false);
        return w.step() ? new long[] {pos, seg.base + r} : start;
    }

    /** The frame boundary nearest to, and at most at, {@code pos} after {@code from} (which
     *  holds {@code offset}): (position, offset); {@code from} itself when no frame ends before. */
    static long[] boundaryBefore(Segment seg, long from, long offset, long pos) {
        try (FileChannel ch = open(seg.store)) {
            ByteBuffer b = index(seg);
            long[] best = {from, offset};
            if (b != null) {
                int n = (b.limit() - Frames.FILE_HEADER) / 8;
                for (int i = n - 1; i >= 0; i--) {
                    long r = b.getInt(Frames.FILE_HEADER + 8 * i) & 0xFFFFFFFFL;
                    long q = b.getInt(Frames.FILE_HEADER + 8 * i + 4) & 0xFFFFFFFFL;
                    if (q <= from) break;
                    if (q > pos) continue;
                    Walker w = new Walker(ch, seg.end, q, seg.base + r, false);
                    if (w.step()) return new long[] {q, seg.base + r};
                }
            }
            Walker w = new Walker(ch, pos, from, offset, seg.compacted);
            while (w.step()) {
                best = new long[] {w.pos, w.next};
            }
            return best;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Partitions of the topics read, each opened, as one consistent snapshot. */
    static Map<String, Map<Integer, Partition>> snapshot(Path root, Map<String, List<Integer>> parts) {
        return consistent(root, () -> {
            Map<String, Map<Integer, Partition>> out = new TreeMap<>();
            for (Map.Entry<String, List<Integer>> e : parts.entrySet()) {
                Map<Integer, Partition> m = new TreeMap<>();
                for (int p : e.getValue()) m.put(p, open(root, e.getKey(), p));
                out.put(e.getKey(), m);
            }
            return out;
        });
    }
}
