package org.pylog.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/** One task's work: records [startOffset, endOffset) of one store file, which lie at
 *  positions [startPosition, endPosition) (at most 1 GiB: Java maps at most 2 GiB at once). */
final class Slice implements InputPartition {
    private static final long serialVersionUID = 1L;
    final String topic;
    final int partition;
    final String store;
    final long startOffset;
    final long startPosition;
    final long endOffset;
    final long endPosition;
    final boolean failOnDataLoss;
    final int timestampType;
    final boolean compacted;

    Slice(String topic, int partition, String store, long startOffset, long startPosition, long endOffset,
          long endPosition, boolean failOnDataLoss, int timestampType, boolean compacted) {
        this.topic = topic;
        this.partition = partition;
        this.store = store;
        this.startOffset = startOffset;
        this.startPosition = startPosition;
        this.endOffset = endOffset;
        this.endPosition = endPosition;
        this.failOnDataLoss = failOnDataLoss;
        this.timestampType = timestampType;
        this.compacted = compacted;
    }
}
