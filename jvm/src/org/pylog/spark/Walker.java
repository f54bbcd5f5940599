package org.pylog.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;

/** Walks the frames of a store file through {@code pread} copies (never a map: a writer may
 *  trim a preallocated file under a reader), checking each as the C core does. */
final class Walker {
    private static final int CHUNK = 4 << 20;
    private final FileChannel ch;
    private final long limit;
    private final boolean gaps;
    private ByteBuffer win;
    private long winStart;
    /** Where the walk is: the next frame's position and the offset it must hold (or exceed, with gaps). */
    long pos;
    long next;
    /** Why the walk stopped (Frames.OK: it reached the limit). */
    int rc = Frames.OK;
    final Frames.Frame frame = new Frames.Frame();

    Walker(FileChannel ch, long limit, long pos, long next, boolean gaps) {
        this.ch = ch;
        this.limit = limit;
        this.pos = pos;
        this.next = next;
        this.gaps = gaps;
    }

    /** Step over the next frame if it is whole and valid (its offset in {@code frame.offset},
     *  its absolute position in {@code frame.position}); false at the limit or a bad frame. */
    boolean step() throws IOException {
        if (pos >= limit) {
            rc = Frames.OK;
            return false;
        }
        if (limit - pos < Frames.PREFIX) {
            rc = Frames.E_SHORT;
            return false;
        }
        ensure(pos, Frames.PREFIX);
        long body = win.getInt((int) (pos - winStart)) & 0xFFFFFFFFL;
        if (body >= Frames.BODY_FIXED && body <= 0x7FFFFFFFL && body <= limit - pos - Frames.PREFIX) {
            ensure(pos, (int) body + Frames.PREFIX);
        }
        int rel = (int) (pos - winStart);
        int end = (int) Math.min(win.limit(), limit - winStart);
        int r = Frames.decode(win, rel, end, frame);
        if (r == Frames.OK && (gaps ? frame.offset < next : frame.offset != next)) r = Frames.E_OFFSET;
        if (r != Frames.OK) {
            rc = r;
            return false;
        }
        framePos = pos;
        pos += frame.size;
        next = frame.offset + 1;
        return true;
    }

    /** The absolute position of the frame the last successful {@link #step} passed. */
    long framePos;

    private void ensure(long at, int n) throws IOException {
        if (win != null && at >= winStart && at + n <= winStart + win.limit()) return;
        long want = Math.min(Math.max((long) n, CHUNK), limit - at);
        win = Frames.read(ch, at, (int) Math.max(want, n));
        winStart = at;
    }
}
