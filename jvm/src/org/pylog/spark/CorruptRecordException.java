package org.pylog.spark;

/** A store file failed a check (a header, a frame's CRC32C, bounds, attributes, offsets). */
public final class CorruptRecordException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** A corruption error with its one-line description. */
    public CorruptRecordException(String message) {
        super("pylog: corrupt record: " + message);
    }
}
