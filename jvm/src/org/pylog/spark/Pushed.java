package org.pylog.spark;

import java.io.Serializable;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualNullSafe;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.Or;

/** Filters on topic, partition, offset and timestamp, applied exactly: topics and partitions
 *  and offsets when the read is planned, timestamps (microseconds, as Spark's literals; pylog's
 *  are milliseconds) on each record. Ranges are sorted, disjoint, half-open [a, b). */
final class Pushed implements Serializable {
    private static final long serialVersionUID = 1L;
    static final long[][] ALL = {{Long.MIN_VALUE, Long.MAX_VALUE}};

    Set<String> topics;  // null: every topic
    long[][] partitions = ALL;
    long[][] offsets = ALL;
    long[][] micros = ALL;
    final List<Filter> accepted = new ArrayList<>();

    /** Keep the filters applied exactly; return the rest (Spark evaluates them). */
    Filter[] push(Filter[] filters) {
        List<Filter> rest = new ArrayList<>();
        for (Filter f : filters) {
            if (apply(f)) accepted.add(f); else rest.add(f);
        }
        return rest.toArray(new Filter[0]);
    }

    boolean allowsTopic(String t) {
        return topics == null || topics.contains(t);
    }

    boolean allowsPartition(int p) {
        return contains(partitions, p);
    }

    static boolean contains(long[][] r, long v) {
        for (long[] x : r) {
            if (v >= x[0] && v < x[1]) return true;
        }
        return false;
    }

    private boolean apply(Filter f) {
        String col = column(f);
        if (col == null) return false;
        if (col.equals("topic")) {
            Set<String> s = topicSet(f);
            if (s == null) return false;
            if (topics == null) topics = s; else topics.retainAll(s);
            return true;
        }
        long[][] r = ranges(f, col);
        if (r == null) return false;
        switch (col) {
            case "partition": partitions = intersect(partitions, r); return true;
            case "offset": offsets = intersect(offsets, r); return true;
            case "timestamp": micros = intersect(micros, r); return true;
            default: return false;
        }
    }

    /** The one column a filter (or a tree of And/Or) is about, or null. */
    private static String column(Filter f) {
        String[] refs = f.references();
        if (refs.length == 0) return null;
        String c = refs[0];
        for (String r : refs) {
            if (!r.equals(c)) return null;
        }
        switch (c) {
            case "topic": case "partition": case "offset": case "timestamp": return c;
            default: return null;
        }
    }

    private static Set<String> topicSet(Filter f) {
        if (f instanceof EqualTo && ((EqualTo) f).value() instanceof String) {
            return new HashSet<>(Arrays.asList((String) ((EqualTo) f).value()));
        }
        if (f instanceof EqualNullSafe && ((EqualNullSafe) f).value() instanceof String) {
            return new HashSet<>(Arrays.asList((String) ((EqualNullSafe) f).value()));
        }
        if (f instanceof In) {
            Set<String> s = new HashSet<>();
            for (Object v : ((In) f).values()) {
                if (v instanceof String) s.add((String) v); else if (v != null) return null;
            }
            return s;
        }
        return null;
    }

    private static Long number(Object v, String col) {
        if (col.equals("timestamp")) {
            if (v instanceof Timestamp) {
                Timestamp t = (Timestamp) v;
                return Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000;
            }
            if (v instanceof Instant) {
                Instant i = (Instant) v;
                return i.getEpochSecond() * 1_000_000L + i.getNano() / 1000;
            }
            return null;
        }
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return ((Number) v).longValue();
        }
        return null;
    }

    private static long[][] one(long a, long b) {
        return a < b ? new long[][] {{a, b}} : new long[0][];
    }

    private static long succ(long v) {
        return v == Long.MAX_VALUE ? v : v + 1;
    }

    private static long[][] ranges(Filter f, String col) {
        if (f instanceof IsNotNull) return ALL;
        if (f instanceof And) {
            long[][] a = ranges(((And) f).left(), col);
            long[][] b = ranges(((And) f).right(), col);
            return a == null || b == null ? null : intersect(a, b);
        }
        if (f instanceof Or) {
            long[][] a = ranges(((Or) f).left(), col);
            long[][] b = ranges(((Or) f).right(), col);
            if (a == null || b == null) return null;
            long[][] u = Arrays.copyOf(a, a.length + b.length);
            System.arraycopy(b, 0, u, a.length, b.length);
            return normalize(u);
        }
        if (f instanceof In) {
            Object[] vs = ((In) f).values();
            long[][] u = new long[vs.length][];
            int n = 0;
            for (Object v : vs) {
                if (v == null) continue;
                Long x = number(v, col);
                if (x == null) return null;
                u[n++] = new long[] {x, succ(x)};
            }
            return normalize(Arrays.copyOf(u, n));
        }
        Object v;
        if (f instanceof EqualTo) v = ((EqualTo) f).value();
        else if (f instanceof EqualNullSafe) v = ((EqualNullSafe) f).value();
        else if (f instanceof GreaterThan) v = ((GreaterThan) f).value();
        else if (f instanceof GreaterThanOrEqual) v = ((GreaterThanOrEqual) f).value();
        else if (f instanceof LessThan) v = ((LessThan) f).value();
        else if (f instanceof LessThanOrEqual) v = ((LessThanOrEqual) f).value();
        else return null;
        Long x = number(v, col);
        if (x == null) return null;
        if (f instanceof EqualTo || f instanceof EqualNullSafe) return one(x, succ(x));
        if (f instanceof GreaterThan) return one(succ(x), Long.MAX_VALUE);
        if (f instanceof GreaterThanOrEqual) return one(x, Long.MAX_VALUE);
        if (f instanceof LessThan) return one(Long.MIN_VALUE, x);
        return one(Long.MIN_VALUE, succ(x));
    }

    static long[][] normalize(long[][] r) {
        long[][] s = r.clone();
        Arrays.sort(s, Comparator.comparingLong(x -> x[0]));
        List<long[]> out = new ArrayList<>();
        for (long[] x : s) {
            if (x[0] >= x[1]) continue;
            long[] last = out.isEmpty() ? null : out.get(out.size() - 1);
            if (last != null && x[0] <= last[1]) last[1] = Math.max(last[1], x[1]);
            else out.add(new long[] {x[0], x[1]});
        }
        return out.toArray(new long[0][]);
    }

    static long[][] intersect(long[][] a, long[][] b) {
        List<long[]> out = new ArrayList<>();
        for (long[] x : a) {
            for (long[] y : b) {
                long lo = Math.max(x[0], y[0]);
                long hi = Math.min(x[1], y[1]);
                if (lo < hi) out.add(new long[] {lo, hi});
            }
        }
        return normalize(out.toArray(new long[0][]));
    }
}
