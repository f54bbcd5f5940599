package org.pylog.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;

/** The on-disk format (docs/format.md): file headers and frames, checked as the C core checks them. */
final class Frames {
    static final int FILE_HEADER = 32;
    static final int PREFIX = 8;
    static final int BODY_FIXED = 28;
    static final int ATTR_NULL_KEY = 1;
    static final int ATTR_NULL_METADATA = 2;
    static final int ATTR_NULL_VALUE = 4;
    static final int ATTR_UNIT_CONTINUES = 8;
    static final int ATTR_KNOWN = 15;
    static final int HEADER_COMPACTED = 1;
    static final byte[] STORE_MAGIC = "PYLOGSTO".getBytes(StandardCharsets.US_ASCII);
    static final byte[] INDEX_MAGIC = "PYLOGIDX".getBytes(StandardCharsets.US_ASCII);

    static final int OK = 0;
    static final int E_SHORT = 1;
    static final int E_LENGTH = 2;
    static final int E_CRC = 3;
    static final int E_ATTRIBUTES = 4;
    static final int E_OFFSET = 5;

    private Frames() {}

    static String reason(int rc) {
        switch (rc) {
            case E_SHORT: return "truncated frame";
            case E_LENGTH: return "bad frame length";
            case E_CRC: return "CRC32C mismatch";
            case E_ATTRIBUTES: return "bad attributes";
            case E_OFFSET: return "unexpected offset";
            default: return "corrupt frame";
        }
    }

    /** One decoded frame (positions relative to the buffer it was decoded from). */
    static final class Frame {
        int position;
        int size;
        long offset;
        long timestamp;
        int attributes;
        int keyLength;
        int metadataLength;
        int valueLength;
        // the CRC and a view of the buffer last decoded from, kept for the next frame
        private final CRC32C crc = new CRC32C();
        private ByteBuffer source;
        private ByteBuffer view;

        int crc32c(ByteBuffer b, int pos, int len) {
            if (source != b) {
                source = b;
                view = b.duplicate();
            }
            view.limit(pos + len);
            view.position(pos);
            crc.reset();
            crc.update(view);
            return (int) crc.getValue();
        }
    }

    static int crc32c(ByteBuffer b, int pos, int len) {
        CRC32C c = new CRC32C();
        ByteBuffer d = b.duplicate();
        d.limit(pos + len).position(pos);
        c.update(d);
        return (int) c.getValue();
    }

    /** Check the frame at {@code pos} of {@code b[0, limit)} (CRC included); fills {@code f}. */
    static int decode(ByteBuffer b, int pos, int limit, Frame f) {
        if (pos > limit || limit - pos < PREFIX) return E_SHORT;
        long body = b.getInt(pos) & 0xFFFFFFFFL;
        if (body < BODY_FIXED || body > 0x7FFFFFFFL) return E_LENGTH;
        if (body > (long) limit - pos - PREFIX) return E_SHORT;
        int n = (int) body;
        if (f.crc32c(b, pos + PREFIX, n) != b.getInt(pos + 4)) return E_CRC;
        int attrs = b.getInt(pos + 24);
        long klen = b.getInt(pos + 28) & 0xFFFFFFFFL;
        long mlen = b.getInt(pos + 32) & 0xFFFFFFFFL;
        if ((attrs & ~ATTR_KNOWN) != 0) return E_ATTRIBUTES;
        if (klen + mlen > body - BODY_FIXED) return E_LENGTH;
        long vlen = body - BODY_FIXED - klen - mlen;
        if (((attrs & ATTR_NULL_KEY) != 0 && klen != 0) || ((attrs & ATTR_NULL_METADATA) != 0 && mlen != 0)
                || ((attrs & ATTR_NULL_VALUE) != 0 && vlen != 0)) {
            return E_ATTRIBUTES;
        }
        f.position = pos;
        f.size = n + PREFIX;
        f.offset = b.getLong(pos + 8);
        f.timestamp = b.getLong(pos + 16);
        f.attributes = attrs;
        f.keyLength = (int) klen;
        f.metadataLength = (int) mlen;
        f.valueLength = (int) vlen;
        return OK;
    }

    /** The flags of a file header, or -1 when the header is not valid (magic, CRC, version,
     *  size, unknown flag bits) or names another base offset than {@code base} (when >= 0). */
    static long headerFlags(ByteBuffer h, byte[] magic, long base) {
        if (h.limit() < FILE_HEADER) return -1;
        for (int i = 0; i < 8; i++) {
            if (h.get(i) != magic[i]) return -1;
        }
        if (crc32c(h, 0, 28) != h.getInt(28)) return -1;
        if ((h.getShort(8) & 0xFFFF) != 1 || (h.getShort(10) & 0xFFFF) != FILE_HEADER) return -1;
        int flags = h.getInt(12);
        if ((flags & ~HEADER_COMPACTED) != 0) return -1;
        if (base >= 0 && h.getLong(16) != base) return -1;
        return flags;
    }

    /** {@code n} bytes of a file from {@code pos} (fewer at its end), little-endian. */
    static ByteBuffer read(FileChannel ch, long pos, int n) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(n).order(ByteOrder.LITTLE_ENDIAN);
        while (b.hasRemaining()) {
            int got = ch.read(b, pos + b.position());
            if (got < 0) break;
        }
        b.flip();
        return b;
    }
}
