package org.pylog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Pattern;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The read options, parsed and checked as pylog.spark.options does: one line naming the option. */
final class Options implements Serializable {
    private static final long serialVersionUID = 1L;
    static final long EARLIEST = -2;
    static final long LATEST = -1;
    private static final Pattern TOPIC = Pattern.compile("^[A-Za-z0-9._-]{1,249}$");

    final String root;
    final List<String> topics;
    final boolean failOnDataLoss;
    final Integer minPartitions;
    final Long maxOffsetsPerTrigger;
    final Long startingTimestamp;
    final Long endingTimestamp;
    /** "earliest", "latest" or {topic: {partition: offset}} (-2 earliest, -1 latest). */
    final Object startingOffsets;
    final Object endingOffsets;

    static IllegalArgumentException err(String option, String msg) {
        return new IllegalArgumentException("pylog option " + option + ": " + msg);
    }

    /** The options a read takes (the write options are ignored by a read, as the Python
     *  source ignores them); any other name is refused. */
    static final List<String> KNOWN = List.of("path", "topic", "topics", "subscribe", "startingOffsets",
            "endingOffsets", "startingTimestamp", "endingTimestamp", "failOnDataLoss", "minPartitions",
            "maxOffsetsPerTrigger", "createTopic", "partitions", "lateTimestamps", "sinkId", "pushFilters");

    Options(CaseInsensitiveStringMap o, boolean streaming) {
        for (String k : o.keySet()) {
            if (KNOWN.stream().noneMatch(n -> n.equalsIgnoreCase(k))) {
                throw err(k, "not an option of the pylog JVM connector (it reads " + String.join(", ", KNOWN.subList(0, 11))
                        + "); spark.pylog.reader=python hands reads to the Python source");
            }
        }
        String path = o.get("path");
        if (path == null || path.isEmpty()) throw err("path", "required: the pylog data root (a directory of topics)");
        Path r = Paths.get(path).toAbsolutePath().normalize();
        if (!Files.isDirectory(r)) throw err("path", "no such directory: " + r);
        root = r.toString();
        List<String> given = new java.util.ArrayList<>();
        for (String n : List.of("topic", "topics", "subscribe")) if (o.containsKey(n)) given.add(n);
        if (given.size() > 1) {  // as the Python source (pylog/spark/options.py)
            throw err(given.get(1), "give only one of topic, topics, subscribe, subscribePattern, assign (got "
                    + String.join(", ", given) + ")");
        }
        String raw = o.get("topic") != null ? o.get("topic") : o.get("topics") != null ? o.get("topics") : o.get("subscribe");
        if (raw == null || raw.trim().isEmpty()) throw err("topic", "required: the topic to read (or topics=a,b,c)");
        TreeSet<String> ts = new TreeSet<>();
        for (String t : raw.split(",")) {
            t = t.trim();
            if (t.isEmpty()) continue;
            if (!TOPIC.matcher(t).matches() || t.equals(".") || t.equals("..")) {
                throw new IllegalArgumentException("pylog option topic: invalid topic name '" + t
                        + "' (allowed: [A-Za-z0-9._-]{1,249}, not . or ..)");
            }
            ts.add(t);
        }
        topics = new ArrayList<>(ts);
        failOnDataLoss = bool(o, "failOnDataLoss", true);
        Long mp = integer(o, "minPartitions", 1);
        minPartitions = mp == null ? null : (int) Math.min(mp, Integer.MAX_VALUE);
        maxOffsetsPerTrigger = integer(o, "maxOffsetsPerTrigger", 1);
        startingTimestamp = integer(o, "startingTimestamp", 0);
        endingTimestamp = integer(o, "endingTimestamp", 0);
        startingOffsets = offsets(o, "startingOffsets", streaming ? "latest" : "earliest", true, true);
        endingOffsets = streaming ? "latest" : offsets(o, "endingOffsets", "latest", true, false);
    }

    static boolean bool(CaseInsensitiveStringMap o, String name, boolean dflt) {
        String raw = o.get(name);
        if (raw == null) return dflt;
        String v = raw.trim().toLowerCase();
        if (v.equals("true") || v.equals("1") || v.equals("yes")) return true;
        if (v.equals("false") || v.equals("0") || v.equals("no")) return false;
        throw err(name, "expected true or false, got '" + raw + "'");
    }

    static Long integer(CaseInsensitiveStringMap o, String name, long lo) {
        String raw = o.get(name);
        if (raw == null) return null;
        long v;
        try {
            v = Long.parseLong(raw.trim());
        } catch (NumberFormatException e) {
            throw err(name, "expected an integer, got '" + raw + "'");
        }
        if (v < lo) throw err(name, "must be >= " + lo + ", got " + v);
        return v;
    }

    static Object offsets(CaseInsensitiveStringMap o, String name, String dflt, boolean allowLatest, boolean allowEarliest) {
        String raw = o.get(name);
        if (raw == null) return dflt;
        String s = raw.trim();
        String low = s.toLowerCase();
        if (low.equals("earliest") || low.equals("latest")) {
            if ((low.equals("latest") && !allowLatest) || (low.equals("earliest") && !allowEarliest)) {
                throw err(name, "'" + low + "' is not allowed here");
            }
            return low;
        }
        JsonNode data;
        try {
            data = Store.JSON.readTree(s);
        } catch (IOException e) {
            throw err(name, "expected earliest, latest or JSON like {\"topic\": {\"0\": 42}}, got '" + s + "'");
        }
        if (data == null || !data.isObject()) throw err(name, "expected a JSON object of topics, got '" + s + "'");
        Map<String, Map<Integer, Long>> out = new TreeMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = data.fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> t = it.next();
            if (!t.getValue().isObject()) throw err(name, "topic '" + t.getKey() + "': expected an object of partition: offset");
            Map<Integer, Long> m = out.computeIfAbsent(t.getKey(), k -> new TreeMap<>());
            for (Iterator<Map.Entry<String, JsonNode>> pi = t.getValue().fields(); pi.hasNext(); ) {
                Map.Entry<String, JsonNode> e = pi.next();
                int p;
                try {
                    p = Integer.parseInt(e.getKey().trim());
                } catch (NumberFormatException x) {
                    throw err(name, "topic '" + t.getKey() + "': partition '" + e.getKey() + "' is not an integer");
                }
                JsonNode off = e.getValue();
                if (!off.isIntegralNumber() || off.asLong() < -2) {
                    throw err(name, "topic '" + t.getKey() + "' partition " + p + ": offset " + off + " is not an integer >= -2");
                }
                if (off.asLong() == LATEST && !allowLatest) {
                    throw err(name, "topic '" + t.getKey() + "' partition " + p + ": -1 (latest) is not allowed here");
                }
                if (off.asLong() == EARLIEST && !allowEarliest) {
                    throw err(name, "topic '" + t.getKey() + "' partition " + p + ": -2 (earliest) is not allowed here");
                }
                m.put(p, off.asLong());
            }
        }
        return out;
    }

    Path rootPath() {
        return Paths.get(root);
    }
}
