"""Writing to topics from Spark: the batch writer and the streaming sink, as store transactions.

The writer, made where Spark plans the job, begins a transaction (:mod:`pylog.transactions`);
each task stages its rows, grouped by target partition, into it (:class:`_StagingWriter`);
the driver's ``commit()`` commits the tasks' staged records as one transaction
(:class:`_Committer`), ``abort()`` discards them. The sink writes its batch id in the
commit's decision, under a sink id kept in the query's checkpoint (:func:`_sink_id`), so a
replayed batch is skipped.
"""
from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import pylog
from pylog import format as fmt
from pylog import topicmeta, transactions
from pylog import topics as topics_mod
from pylog.errors import PylogError, UnknownTopicError
from pylog.log import PackedBytes
from pylog.spark.layout import _partitions_of, _topic_dir
from pylog.spark.options import _bool_opt, _check_topic_name, _err, _int_opt, _root_opt

#: What a write task stages per target partition (one Arrow IPC stream file).
_STAGED_SCHEMA = pa.schema([  # a write's rows, in the columns a partition takes
    ("value", pa.binary()), ("key", pa.binary()), ("metadata", pa.binary()), ("timestamp", pa.int64()),
])
#: The file in a streaming query's checkpoint directory that holds the sink's id.
SINK_ID_FILE = "pylog-sink-id"


@dataclass
class _Staged(WriterCommitMessage):
    """What one write task staged into transaction ``txn``: ``parts`` as
    :meth:`pylog.transactions.Stager.prepare` returns them, for the topic that had id
    ``topic_id`` when the write was planned (None: it did not exist yet)."""

    txn: str = ""
    parts: list[tuple[str, int, str, int]] = field(default_factory=list)
    topic_id: str | None = None


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _as_binary(col: pa.Array | None, n: int) -> pa.Array:
    if col is None:
        return pa.nulls(n, pa.binary())
    if pa.types.is_binary(col.type):
        return col
    return col.cast(pa.binary())  # string / large types


def _check_write_schema(schema: StructType) -> None:
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise _err("(columns)", "a write needs a value column (binary or string)")
    for col, ok in (("value", (BinaryType, StringType)), ("key", (BinaryType, StringType)),
                    ("metadata", (BinaryType, StringType)), ("partition", (IntegerType, LongType, ShortType, ByteType)),
                    ("timestamp", (TimestampType, TimestampNTZType, LongType))):
        f = names.get(col)
        if f is not None and not isinstance(f.dataType, ok):
            raise _err("(columns)", f"column {col} has type {f.dataType.simpleString()}, expected one of "
                       + ", ".join(t().simpleString() for t in ok))


def _timestamps_ms(col: pa.Array | None, n: int) -> pa.Array:
    if col is None:
        return pa.nulls(n, pa.int64())
    if pa.types.is_timestamp(col.type):
        import pyarrow.compute as pc  # only writes need it (its import costs 60 ms)

        unit = col.type.unit
        div = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        raw = col.cast(pa.int64())
        if div is None:
            return pc.multiply(raw, 1000)
        return pc.divide(raw, div) if div != 1 else raw
    return col.cast(pa.int64())


class _StagingWriter:
    """Task side of a write: rows grouped by target partition, staged into the job's
    transaction (a :class:`pylog.transactions.Stager` per task attempt)."""

    def __init__(self, root: str, txn: str, topic: str, n_partitions: int, late: str,
                 max_record_bytes: int | None, topic_id: str | None = None, as_given: bool = False) -> None:
        self.root = root
        self.as_given = as_given  # the topic keeps timestamps as given: no order, no clamp
        self.txn = txn
        self.topic = topic
        self.topic_id = topic_id
        self.n = n_partitions
        self.late = late
        self.max_record_bytes = max_record_bytes

    def write(self, batches: Iterator[pa.RecordBatch]) -> _Staged:
        # fails (TransactionError) instead of recreating a transaction the driver discarded
        stager = transactions.Stager(self.root, self.txn)
        sticky = int.from_bytes(os.urandom(2), "little")  # keyless rows: a whole batch per partition
        try:
            for batch in batches:
                n = batch.num_rows
                if n == 0:
                    continue
                batch = pa.RecordBatch.from_arrays([batch.column(i) for i in range(batch.num_columns)],
                                                   names=[nm.lower() for nm in batch.schema.names])
                value = _as_binary(_column(batch, "value"), n)
                key = _as_binary(_column(batch, "key"), n)
                meta = _as_binary(_column(batch, "metadata"), n)
                ts = _timestamps_ms(_column(batch, "timestamp"), n)
                pcol = _column(batch, "partition")
                parts = np.empty(n, np.int64)
                have = np.zeros(n, np.bool_)
                if pcol is not None:
                    pv = pcol.cast(pa.int64())
                    valid = np.asarray(pv.is_valid())
                    vals = np.asarray(pv.fill_null(0))
                    bad = valid & ((vals < 0) | (vals >= self.n))
                    if bad.any():
                        raise _err("(columns)", f"partition {int(vals[bad][0])} is out of range: the topic "
                                   f"has {self.n} partitions")
                    parts[valid] = vals[valid]
                    have |= valid
                if key.null_count < n:
                    kvalid = np.asarray(key.is_valid()) & ~have
                    if kvalid.any():
                        idx = np.flatnonzero(kvalid)
                        keys = key.take(pa.array(idx)).to_pylist()
                        parts[idx] = [topics_mod.partition_for_key(k, self.n) for k in keys]
                        have[idx] = True
                if not have.all():
                    parts[~have] = sticky % self.n  # Kafka's sticky partitioner
                    sticky += 1
                table = pa.RecordBatch.from_arrays([value, key, meta, ts], schema=_STAGED_SCHEMA)
                if self.n == 1 or (parts == parts[0]).all():
                    groups = [(int(parts[0]), table)]
                else:
                    order = np.argsort(parts, kind="stable")
                    sp = parts[order]
                    cuts = np.flatnonzero(np.diff(sp)) + 1
                    bounds = np.concatenate([[0], cuts, [n]])
                    taken = table.take(pa.array(order))
                    groups = [(int(sp[a]), taken.slice(a, b - a)) for a, b in zip(bounds[:-1], bounds[1:])]
                for p, g in groups:
                    log = stager.log_for(self.topic, p, self.max_record_bytes,
                                         timestamps="as-given" if self.as_given else None)
                    _append_table(log, pa.Table.from_batches([g]), self.late, self.topic, p, self.as_given)
                    stager.written(log)
            return _Staged(self.txn, stager.prepare(), self.topic_id)
        except BaseException:
            stager.discard()
            raise


def _packed(col: pa.ChunkedArray | pa.Array) -> Any:
    """A binary column as :class:`pylog.log.PackedBytes` (its Arrow buffers, no copy when it
    is one chunk), or None when it is all nulls."""
    if isinstance(col, pa.ChunkedArray):
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    n = len(arr)
    if arr.null_count == n:
        return None
    _validity, off_buf, data = arr.buffers()
    offs = np.frombuffer(off_buf, np.int32, n + 1, arr.offset * 4)
    lens = np.diff(offs).astype(np.uint32)
    if arr.null_count:
        nulls = np.asarray(arr.is_null())
        if lens[nulls].any():  # nulls that occupy bytes: rare; copy
            return arr.to_pylist()
        lens[nulls] = fmt.NULL_LEN
    data_mv = memoryview(data)[int(offs[0]):int(offs[-1])] if data is not None else b""
    return PackedBytes(data_mv, lens)


def _append_table(log: pylog.Log, table: pa.Table, late: str, topic: str, p: int, as_given: bool = False) -> None:
    """Append staged rows to one partition: timestamps sorted, never below the log's; in a
    topic that keeps timestamps as given (``timestamps="as-given"``, Kafka's CreateTime),
    the rows in their order with their timestamps, as Kafka keeps a producer's."""
    n = table.num_rows
    if n == 0:
        return
    ts_col = table.column("timestamp")
    timestamps = None
    if ts_col.null_count < n:
        now = time.time_ns() // 1_000_000
        ts = np.asarray(ts_col.fill_null(now).to_numpy(), dtype=np.int64)
        order = np.argsort(ts, kind="stable")
        if not as_given and (np.diff(ts) < 0).any():
            table = table.take(pa.array(order))
            ts = ts[order]
        last = log._active.app.max_timestamp if not (log.readonly or as_given) else None  # noqa: SLF001
        if last is not None and int(ts[0]) < last:
            if late == "error":
                raise _err("lateTimestamps", f"topic {topic!r} partition {p}: timestamp {int(ts[0])} is below the "
                           f"partition's latest timestamp {last} (pylog timestamps never decrease); "
                           "set lateTimestamps=clamp to raise such timestamps to the latest one")
            ts = np.maximum(ts, last)
        if int(ts.min()) < 0:
            raise _err("(columns)", f"timestamp {int(ts.min())} is before 1970")
        timestamps = ts
    table = table.combine_chunks()
    step = 1 << 18  # bounds the write buffer a single append_batch call needs
    for a in range(0, n, step):
        part = table.slice(a, step)
        values = _packed(part.column("value"))
        if values is None:  # all tombstones
            values = [None] * part.num_rows
        log.append_batch(values, keys=_packed(part.column("key")),
                         timestamps=None if timestamps is None else timestamps[a:a + step],
                         metadata=_packed(part.column("metadata")))


class _Committer:
    """Driver side of a write: begins the job's transaction (where Spark plans the job) and
    commits or discards what the tasks staged into it."""

    def __init__(self, root: str, topic: str, options: dict[str, str], tag: str = "") -> None:
        self.root = root
        self.topic = topic
        self.create = _bool_opt(options, "createtopic", True)
        self.new_partitions = _int_opt(options, "partitions", 1, lo=1) or 1
        self.late = str(options.get("latetimestamps", "error")).lower()
        if self.late not in ("error", "clamp"):
            raise _err("lateTimestamps", f"expected error or clamp, got {options.get('latetimestamps')!r}")
        self.tag = tag
        self.max_record_bytes: int | None = None
        self.as_given = False  # the topic keeps timestamps as given
        self.topic_id: str | None = None  # the topic's id when the job was planned
        self.txn = ""

    def begin(self) -> None:
        """Begin the job's transaction (after every option was checked)."""
        self.txn = transactions.begin_external(self.root, self.tag)

    def partition_count(self) -> int:
        try:
            n, cfg, self.topic_id = topicmeta._read_topic_meta(_topic_dir(self.root, self.topic), self.topic)  # noqa: SLF001
            self.max_record_bytes = cfg.max_record_bytes
            self.as_given = cfg.timestamps == "as-given"
            return n
        except UnknownTopicError:
            pass
        try:
            parts = _partitions_of(self.root, self.topic)
        except UnknownTopicError:
            if not self.create:
                raise UnknownTopicError(f"pylog option topic: no topic {self.topic!r} under {self.root} "
                                        "(set createTopic=true to create it)") from None
            return self.new_partitions
        if not parts:
            return self.new_partitions
        if parts != list(range(len(parts))):
            raise PylogError(f"pylog: topic {self.topic!r} has partitions {parts}, expected 0..{len(parts) - 1}")
        return len(parts)

    def _txns(self, messages: Iterable[Any]) -> set[str]:
        """The transactions named: the tasks' (a streaming commit runs on a fresh writer,
        whose own transaction is not the one the tasks staged into) and this writer's."""
        out = {m.txn for m in messages if isinstance(m, _Staged) and m.txn}
        if self.txn:
            out.add(self.txn)
        return out

    def commit(self, messages: Iterable[Any], n_partitions: int, sink: tuple[str, int] | None = None) -> None:
        messages = list(messages)
        staged = [m for m in messages if isinstance(m, _Staged) and m.txn]
        task_txns = {m.txn for m in staged}
        if len(task_txns) > 1:
            raise PylogError(f"pylog: the tasks of one write staged into {len(task_txns)} transactions")
        txn = task_txns.pop() if task_txns else self.txn
        # the topic's id when the tasks' write was planned (a streaming commit runs on a
        # fresh writer: the tasks' messages say); never commit into a topic made since
        ids = {m.topic_id for m in staged if m.topic_id is not None} or {self.topic_id} - {None}
        try:
            if len(ids) > 1:
                raise transactions.TransactionError(f"transaction {txn}: topic {self.topic!r} was deleted since "
                                                    "records were staged")
            self._ensure_topic(n_partitions, planned=bool(ids))
            with pylog.LogStore(self.root) as store:  # its open finishes what crashed commits left
                if sink is not None:
                    done = transactions.last_batch_id(self.root, sink[0])
                    if done is not None and done >= sink[1]:
                        return  # a replayed batch: already committed
                tx = transactions.Transaction(store, txn_id=txn)
                tx._late_error = self.late == "error"  # noqa: SLF001
                tx.add_staged([p for m in staged for p in m.parts], {self.topic: ids.pop()} if ids else None)
                if sink is not None:
                    tx.set_sink(sink[0], sink[1])
                try:
                    tx.commit()
                except pylog.InvalidTimestampError as e:
                    raise _err("lateTimestamps", f"{e}; set lateTimestamps=clamp to raise such timestamps to "
                               "the latest one") from None
        finally:
            self.cleanup(messages)

    def _ensure_topic(self, n_partitions: int, planned: bool = False) -> None:
        """Create the topic (LogStore layout) if it does not exist yet: only now, when the
        job commits, so a failed job leaves no trace. Not one that existed when the write
        was planned (``planned``): it was deleted since, and the commit refuses it."""
        try:
            _partitions_of(self.root, self.topic)
            return
        except UnknownTopicError:
            if planned:
                return
        with pylog.LogStore(self.root) as store:
            try:
                store.create_topic(self.topic, partitions=n_partitions)
            except pylog.TopicExistsError:
                pass

    def cleanup(self, messages: Iterable[Any] = ()) -> None:
        """Discard this write's undecided transactions (a committed one is gone already); a
        sink's also every other undecided one of the same sink (left by aborted batches and
        by the fresh writers Spark makes to commit)."""
        for txn in self._txns(messages):
            transactions.discard(self.root, txn)
        if self.tag:
            transactions.discard_tagged(self.root, self.tag)


def _writer_parts(options: dict[str, str], schema: StructType,
                  tag: str = "") -> tuple[_Committer, int, _StagingWriter]:
    """What the batch writer and the streaming sink both start from: the checked schema and
    topic, the driver-side committer (its transaction begun), and the task-side staging
    writer."""
    _check_write_schema(schema)
    root = _root_opt(options)
    topic = options.get("topic")
    if not topic:
        raise _err("topic", "required: the topic to write")
    committer = _Committer(root, _check_topic_name(str(topic), "topic"), options, tag)
    n_partitions = committer.partition_count()
    committer.begin()
    return committer, n_partitions, _StagingWriter(root, committer.txn, committer.topic, n_partitions,
                                                   committer.late, committer.max_record_bytes, committer.topic_id,
                                                   committer.as_given)


def _local_dir(location: str) -> str:
    """A checkpoint location as a local directory (``file:`` URIs too); ConfigError for
    another file system, whose checkpoint this module cannot read."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", location)
    if m and len(m.group(1)) > 1:
        if m.group(1).lower() != "file":
            raise _err("checkpointLocation", f"{location!r} is not on the local file system: the pylog sink "
                       "keeps its id in the checkpoint directory (set sinkId to name the query instead)")
        location = re.sub(r"^//(localhost)?(?=/)", "", m.group(2))
    return location


def _sink_id(options: dict[str, str]) -> str:
    """The sink's id: a random id kept in the query's checkpoint directory (written the
    first time), so it names that checkpoint and nothing else, and a deleted (reset)
    checkpoint makes a new sink. Without a checkpointLocation option (e.g. a location from
    the SQL conf spark.sql.streaming.checkpointLocation, which sinks are not told), the
    ``sinkId`` option, or one clear error."""
    where = options.get("checkpointlocation")
    if not where:
        explicit = options.get("sinkid")
        if explicit:
            return "id-" + str(explicit)
        raise _err("checkpointLocation", "the pylog sink needs the query's checkpoint to tell its batches apart "
                   "from another query's: set .option(\"checkpointLocation\", ...) on writeStream (a location "
                   "from spark.sql.streaming.checkpointLocation is not passed to sinks), or a sinkId option "
                   "that names this query and its checkpoint")
    d = _local_dir(str(where))
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, SINK_ID_FILE)
    try:
        with open(path, "rb") as f:
            sid = f.read().decode().strip()
    except FileNotFoundError:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(uuid.uuid4().hex.encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # exclusive: the first writer's id wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        with open(path, "rb") as f:
            sid = f.read().decode().strip()
    if not re.fullmatch(r"[0-9a-f]{32}", sid):
        raise _err("checkpointLocation", f"{path} does not hold a pylog sink id")
    return "ck-" + sid


class PylogWriter(DataSourceArrowWriter):
    """Batch writer (mode "append"): nothing is visible unless the job commits."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.committer, self.n_partitions, self.stager = _writer_parts(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.stager.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.committer.commit(messages, self.n_partitions)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.committer.cleanup(messages)


class PylogStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: exactly once per batch id (replays are skipped)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.sink_id = _sink_id(options)
        self.committer, self.n_partitions, self.stager = _writer_parts(options, schema, tag=self.sink_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.stager.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.committer.commit(messages, self.n_partitions, sink=(self.sink_id, int(batchId)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.committer.cleanup(messages)

