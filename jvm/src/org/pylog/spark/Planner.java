package org.pylog.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/** A read's plan: the offsets per partition (one consistent snapshot) and the slices. */
final class Planner {
    /** Java maps at most 2 GiB at once: a slice covers at most this many bytes of a store. */
    static final long MAX_SLICE_BYTES = 1L << 30;

    private Planner() {}

    static IllegalStateException dataLoss(String topic, int p, long offset, long start) {
        return new IllegalStateException("pylog: offset " + offset + " of topic '" + topic + "' partition " + p
                + " is no longer in the log (it starts at " + start + "; retention removed it). "
                + "Set option failOnDataLoss=false to skip to the earliest offset");
    }

    /** The partitions of the topics read (every one, before filters). */
    static Map<String, List<Integer>> partitions(Options o) {
        Map<String, List<Integer>> out = new TreeMap<>();
        for (String t : o.topics) out.put(t, Store.partitionsOf(o.rootPath(), t));
        return out;
    }

    @SuppressWarnings("unchecked")
    static void checkSpec(Object spec, String name, Map<String, List<Integer>> known) {
        if (!(spec instanceof Map)) return;
        for (Map.Entry<String, Map<Integer, Long>> e : ((Map<String, Map<Integer, Long>>) spec).entrySet()) {
            List<Integer> ps = known.get(e.getKey());
            if (ps == null) {
                throw Options.err(name, "topic '" + e.getKey() + "' is not one of the topics read ("
                        + String.join(", ", known.keySet()) + ")");
            }
            for (int p : e.getValue().keySet()) {
                if (!ps.contains(p)) throw Options.err(name, "topic '" + e.getKey() + "' has no partition " + p);
            }
        }
    }

    @SuppressWarnings("unchecked")
    static long resolve(Object spec, String topic, int p, long lo, long hi, long dflt) {
        long v = dflt;
        if (spec instanceof String) v = spec.equals("earliest") ? Options.EARLIEST : Options.LATEST;
        else if (spec instanceof Map) {
            Map<Integer, Long> m = ((Map<String, Map<Integer, Long>>) spec).get(topic);
            if (m != null && m.containsKey(p)) v = m.get(p);
        }
        return v == Options.EARLIEST ? lo : v == Options.LATEST ? hi : v;
    }

    /** The first offset whose timestamp (ms) is >= ts, clamped to [start, stable]. */
    static long offsetForTime(Store.Partition part, long ts) {
        for (Store.Segment s : part.segments) {
            try (FileChannel ch = Store.open(s.store)) {
                Walker w = new Walker(ch, s.end, Frames.FILE_HEADER, s.base, s.compacted);
                while (w.step()) {
                    if (w.frame.timestamp >= ts) return Math.max(part.start, Math.min(w.frame.offset, part.stable));
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        return part.stable;
    }

    /** The slices of records [a, b) of one partition. */
    static void slices(Store.Partition part, long a, long b, boolean fail, List<Slice> out) {
        if (a >= b) return;
        if (a < part.start) {
            if (fail) throw dataLoss(part.topic, part.partition, a, part.start);
            a = part.start;
        }
        for (Store.Segment s : part.segments) {
            long x = Math.max(a, s.base);
            long y = Math.min(b, s.next);
            if (x >= y) continue;
            long[] f = Store.find(s, x);
            long endPos = y < s.next ? Store.find(s, y)[0] : s.end;
            long pos = f[0];
            long off = f[1];
            while (pos < endPos) {
                long cut = endPos;
                long cutOff = y;
                if (endPos - pos > MAX_SLICE_BYTES) {
                    long[] q = Store.boundaryBefore(s, pos, off, pos + MAX_SLICE_BYTES);
                    if (q[0] > pos) {
                        cut = q[0];
                        cutOff = q[1];
                    }
                }
                out.add(new Slice(part.topic, part.partition, s.store.toString(), off, pos, cutOff, cut, fail,
                        part.timestampType, s.compacted));
                pos = cut;
                off = cutOff;
            }
        }
    }

    /** Split the largest slices at an index entry until there are {@code n} (if they can be). */
    static List<Slice> split(List<Slice> slices, Integer n, Map<String, Map<Integer, Store.Partition>> snap) {
        if (n == null) return slices;
        List<Slice> out = new ArrayList<>(slices);
        while (out.size() < n) {
            int best = -1;
            for (int i = 0; i < out.size(); i++) {
                Slice s = out.get(i);
                if (s.endOffset - s.startOffset >= 2
                        && (best < 0 || s.endOffset - s.startOffset > out.get(best).endOffset - out.get(best).startOffset)) {
                    best = i;
                }
            }
            if (best < 0) break;
            Slice s = out.get(best);
            Store.Segment seg = null;
            for (Store.Segment x : snap.get(s.topic).get(s.partition).segments) {
                if (x.store.toString().equals(s.store)) seg = x;
            }
            if (seg == null) break;
            long[] m = Store.find(seg, s.startOffset + (s.endOffset - s.startOffset) / 2);
            if (!(s.startPosition < m[0] && m[0] < s.endPosition)) break;
            out.set(best, new Slice(s.topic, s.partition, s.store, s.startOffset, s.startPosition, m[1], m[0],
                    s.failOnDataLoss, s.timestampType, s.compacted));
            out.add(best + 1, new Slice(s.topic, s.partition, s.store, m[1], m[0], s.endOffset, s.endPosition,
                    s.failOnDataLoss, s.timestampType, s.compacted));
        }
        return out;
    }

    /** A batch read's plan: {topic: {partition: [start, end)}} after the options and the
     *  pushed filters, then its slices. */
    static List<Slice> batch(Options o, Pushed pushed, long[] rows) {
        Path root = o.rootPath();
        Map<String, List<Integer>> all = partitions(o);
        checkSpec(o.startingOffsets, "startingOffsets", all);
        checkSpec(o.endingOffsets, "endingOffsets", all);
        Map<String, List<Integer>> kept = new TreeMap<>();
        for (Map.Entry<String, List<Integer>> e : all.entrySet()) {
            if (!pushed.allowsTopic(e.getKey())) continue;
            List<Integer> ps = new ArrayList<>();
            for (int p : e.getValue()) {
                if (pushed.allowsPartition(p)) ps.add(p);
            }
            kept.put(e.getKey(), ps);
        }
        Map<String, Map<Integer, Store.Partition>> snap = Store.snapshot(root, kept);
        List<Slice> out = new ArrayList<>();
        for (Map.Entry<String, Map<Integer, Store.Partition>> te : snap.entrySet()) {
            String t = te.getKey();
            for (Store.Partition part : te.getValue().values()) {
                int p = part.partition;
                long lo = part.start;
                long hi = part.stable;
                long s = o.startingTimestamp != null ? offsetForTime(part, o.startingTimestamp)
                        : resolve(o.startingOffsets, t, p, lo, hi, Options.EARLIEST);
                long e = o.endingTimestamp != null ? offsetForTime(part, o.endingTimestamp)
                        : resolve(o.endingOffsets, t, p, lo, hi, Options.LATEST);
                if (e > hi) throw Options.err("endingOffsets", "topic '" + t + "' partition " + p + ": " + e
                        + " is past the latest offset " + hi);
                if (s > hi) throw Options.err("startingOffsets", "topic '" + t + "' partition " + p + ": " + s
                        + " is past the latest offset " + hi);
                if (s > e) throw Options.err("startingOffsets", "topic '" + t + "' partition " + p + ": " + s
                        + " is after the ending offset " + e);
                if (s < lo) {
                    if (o.failOnDataLoss) throw dataLoss(t, p, s, lo);
                    s = lo;
                }
                for (long[] r : Pushed.intersect(new long[][] {{s, e}}, pushed.offsets)) {
                    rows[0] += r[1] - r[0];
                    slices(part, r[0], r[1], o.failOnDataLoss, out);
                }
            }
        }
        return split(out, o.minPartitions, snap);
    }
}
