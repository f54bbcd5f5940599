"""Records in and out: ``pylog produce`` (lines or JSON from files or stdin) and ``pylog consume``."""
from __future__ import annotations

import base64
import fcntl
import json
import operator
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import click

from pylog import fileutil
from pylog.cli._common import CHUNK, CONTEXT, CliError, _describe, _json_field, _parse_duration, _store
from pylog.errors import PylogError


def _lines(streams: list[tuple[str, BinaryIO]]) -> Iterator[tuple[str, int, list[bytes]]]:
    """``(source name, number of the first line, lines)``, up to a few MiB of lines at a time,
    without their newline (``\\n`` or ``\\r\\n``). From a pipe, what has arrived so far
    (``read1``): ``tail -f app.log | pylog produce logs`` produces each line as it comes, not
    when 4 MiB have gathered or the pipe closes."""
    for name, f in streams:
        rest = b""
        first = 1
        read = getattr(f, "read1", f.read)
        while True:
            data = read(CHUNK)
            if not data:
                break
            if rest:
                data = rest + data
            lines = data.split(b"\n")
            rest = lines.pop()
            if lines:
                if b"\r" in data:
                    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
                yield name, first, lines
                first += len(lines)
        if rest:
            yield name, first, [rest[:-1] if rest.endswith(b"\r") else rest]


def _encode_headers(headers: tuple[str, ...]) -> Any:
    """The metadata of ``--header NAME=VALUE`` options: Kafka's header encoding, as the broker
    keeps a Kafka record's headers (pylog.serve.headers; needs no kio)."""
    from pylog.serve.headers import encode_headers

    pairs = []
    for h in headers:
        name, sep, value = h.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{h!r} is not NAME=VALUE", param_hint="--header")
        pairs.append((name, value.encode()))
    return encode_headers(pairs)


def _json_headers(obj: dict[str, Any], metadata: Any) -> None:
    """``headers`` of a consumed record whose metadata is Kafka headers (what a Kafka client
    produced through pylog serve, or --header wrote), as ``[[name, value or null], ...]``."""
    if metadata is None:
        return
    from pylog.serve.headers import decode_headers, is_headers

    if is_headers(metadata):
        try:
            obj["headers"] = [[k, None if v is None else v.decode()] for k, v in decode_headers(metadata)]
        except UnicodeDecodeError:
            pass  # not text: the bytes are in metadata_base64


def _served(root: str) -> bool:
    """Whether a ``pylog serve`` serves ``root``: it holds the flock of ``.serve.lock``
    (pylog.serve.broker.SERVE_LOCK; not imported, as pylog.serve needs the serve extra)."""
    try:
        return fileutil.flock_held(os.path.join(root, ".serve.lock")) is True
    except OSError:  # unreadable: not known to be served
        return False


class _BadLine(Exception):
    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index
        self.why = why


def _json_bytes(obj: dict[str, Any], name: str) -> bytes | None:
    """Field ``name`` of a JSON-lines record (``name``: text, or ``name_base64``), as bytes."""
    if name + "_base64" in obj:
        b64 = obj[name + "_base64"]
        if not isinstance(b64, str):
            raise ValueError(f"{name}_base64 must be a string")
        try:
            return base64.b64decode(b64, validate=True)
        except ValueError:
            raise ValueError(f"{name}_base64 is not valid base64") from None
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v, separators=(",", ":")).encode()  # a JSON value that is not a string


def _parse_json_line(line: bytes) -> tuple[bytes | None, bytes | None, bytes | None, int | None, int | None]:
    """(key, value, metadata, timestamp, partition) of one JSON-lines record."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not valid JSON ({e.args[0].split(':')[0]})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    ts = obj.get("timestamp")
    part = obj.get("partition")
    for name, v in (("timestamp", ts), ("partition", part)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if "value" not in obj and "value_base64" not in obj:  # a typo ("vaule") must not make a tombstone
        raise ValueError('has no "value" (or "value_base64") field; "value": null writes a tombstone')
    return _json_bytes(obj, "key"), _json_bytes(obj, "value"), _json_bytes(obj, "metadata"), ts, part


def _parse_ts(text: str) -> int:
    """A --timestamp: milliseconds since the epoch, or an ISO 8601 date/time."""
    try:
        ms = int(text)
    except ValueError:
        from pylog.groups import parse_datetime

        try:
            return parse_datetime(text)
        except ValueError as e:
            raise click.BadParameter(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 "
                                     f"date/time", param_hint="--timestamp") from e
    if ms < 0:  # a usage error (exit 2) before any input is read, as a malformed one
        raise click.BadParameter(f"{text!r} is before the epoch (milliseconds >= 0)", param_hint="--timestamp")
    return ms


@click.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-k", "--key-separator", default=None, metavar="SEP",
              help="Split each line at the first SEP into key and value.")
@click.option("-p", "--partition", type=click.IntRange(0), default=None,
              help="Write every record to this partition (default: by key hash, or spread).")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one value per line; json: one object per line, as consume --format json prints "
                   "them (key, value, metadata, *_base64, timestamp, partition; \"value\": null is a tombstone).")
@click.option("--null-marker", default=None, metavar="TEXT",
              help="text format: a value equal to TEXT is a tombstone (a record whose value is None).")
@click.option("-H", "--metadata", default=None, metavar="TEXT", help="text format: metadata of every record.")
@click.option("--header", "headers", multiple=True, metavar="NAME=VALUE",
              help="text format: a Kafka header of every record (repeatable): what Kafka clients of pylog serve "
                   "see as headers (-H is pylog's own metadata, which they see as one header pylog.metadata).")
@click.option("--timestamp", "timestamp_", default=None, metavar="MS|ISO",
              help="text format: timestamp of every record (ms since the epoch, or ISO 8601; default: now).")
@click.option("--lock-timeout", type=click.FloatRange(0, 1e9), default=10.0, show_default=True,
              metavar="SECONDS",
              help="Wait this long for a partition another producer writes (0: fail at once).")
@click.pass_context
def produce(ctx: click.Context, topic_name: str, files: tuple[str, ...], key_separator: str | None,
            partition: int | None, fmt_: str, null_marker: str | None, metadata: str | None,
            headers: tuple[str, ...], timestamp_: str | None, lock_timeout: float) -> None:
    """Append one record per line of FILES (default: stdin) to TOPIC.

    A line's trailing newline (\\n or \\r\\n) is not part of the record. With --key-separator,
    the text before the first separator is the key. Records with a key go to the partition
    Kafka's partitioner would choose; records without one are spread over the partitions.
    A bad line stops the command (exit 1) naming its line number; the records before it are
    kept, those after it are not written.

    The partitions written (--partition, else all of them) are locked before any input is
    read; a partition another producer holds is waited for up to --lock-timeout seconds.
    """
    from pylog.errors import LogLockedError

    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    if key_separator is not None:
        key_separator = key_separator.replace("\\t", "\t")  # -k '\t' as typed in a shell
    if fmt_ == "json":
        for flag, v in (("--key-separator", key_separator), ("--null-marker", null_marker),
                        ("--metadata", metadata), ("--timestamp", timestamp_), ("--header", headers or None)):
            if v is not None:
                raise click.UsageError(f"{flag} is for the text format (a JSON line carries its own fields)")
    ts = _parse_ts(timestamp_) if timestamp_ is not None else None
    if headers:
        if metadata is not None:
            raise click.UsageError("give -H/--metadata or --header, not both (headers are kept in the metadata)")
        metadata = _encode_headers(headers)
    store = _store(ctx, lock_timeout=lock_timeout)
    t = store.topic(topic_name)
    if partition is not None:
        t._check_partition(partition)
    if _served(store.root):  # it writes every partition: waiting for a lock would be in vain
        raise CliError(f"pylog serve is serving the data root {store.root!r} and writes its partitions: "
                       "produce through the broker (a Kafka client, e.g. kcat -P)")
    try:  # every lock before the first byte of input: two producers never interleave by chance
        for p in [partition] if partition is not None else range(t.partitions):
            t.partition(p)
    except LogLockedError as e:
        raise CliError(f"{e}; another process is writing it (see --lock-timeout)") from None
    limit = t.config.max_record_bytes
    streams: list[tuple[str, BinaryIO]] = []
    try:
        for name in files or ("-",):
            if name == "-":
                streams.append(("stdin", sys.stdin.buffer))
            else:
                try:
                    streams.append((name, open(name, "rb")))
                except OSError as e:
                    raise CliError(f"cannot read {name}: {e.strerror}") from None
        sep = key_separator.encode() if key_separator is not None else None
        null = null_marker.encode() if null_marker is not None else None
        meta = (metadata if isinstance(metadata, bytes) else metadata.encode()) if metadata is not None else None
        count = 0
        for source, first, lines in _lines(streams):
            try:
                count += _produce_lines(t, lines, fmt_, sep, key_separator, null, meta, ts, partition, limit)
            except _BadLine as e:
                count += e.index
                where = f"line {first + e.index}" + (f" of {source}" if len(streams) > 1 else "")
                raise CliError(f"{where} {e.why} ({count} record{'s' if count != 1 else ''} before it "
                               f"{'were' if count != 1 else 'was'} produced and kept)") from None
            except (OSError, PylogError) as e:  # a failed write or fdatasync: the log is fenced
                why = _describe(e)
                last = first + len(lines) - 1
                where = f"lines {first}-{last}" if last > first else f"line {first}"
                if len(streams) > 1:
                    where += f" of {source}"
                raise CliError(f"writing topic {topic_name!r} failed: {why} (the {count} record"
                               f"{'s' if count != 1 else ''} before line {first} {'were' if count != 1 else 'was'} "
                               f"produced; {where} {'were' if last > first else 'was'} not: some may be in "
                               f"the log, not known to be durable)") from None
        ctx.obj["produced"] = count
        try:  # close here, not on the context's exit, so a failure can say what was produced
            store.close()
        except (OSError, PylogError) as e:
            why = _describe(e)
            raise CliError(f"closing topic {topic_name!r} failed after {count} record"
                           f"{'s' if count != 1 else ''} {'were' if count != 1 else 'was'} produced: {why}") from None
    finally:
        for _name, f in streams:
            if f is not sys.stdin.buffer:
                f.close()


def _produce_lines(t: Any, lines: list[bytes], fmt_: str, sep: bytes | None, sep_text: str | None,
                   null: bytes | None, meta: bytes | None, ts: int | None, partition: int | None,
                   limit: int) -> int:
    """Append the records of ``lines``; at a bad line, append the records before it and raise
    _BadLine. Returns how many records were appended."""
    if fmt_ == "text" and ts is None:
        keys: list[Any] | None = None
        values: list[Any] = lines
        if sep is not None:
            keys, values = [], []
            for i, line in enumerate(lines):
                k, found, v = line.partition(sep)
                if not found:
                    if i:
                        t.append_batch(values, keys=keys, partition=partition,
                                       metadata=None if meta is None else [meta] * i)
                    raise _BadLine(i, f"has no key separator {sep_text!r}")
                keys.append(k)
                values.append(v)
        if null is not None:
            values = [None if v == null else v for v in values]
        extra = 0 if meta is None else len(meta)
        big = next((i for i, v in enumerate(values) if v is not None and len(v) + extra
                    + (len(keys[i]) if keys is not None else 0) > limit), None)
        if big is not None:
            if big:
                t.append_batch(values[:big], keys=None if keys is None else keys[:big], partition=partition,
                               metadata=None if meta is None else [meta] * big)
            size = len(values[big]) + extra + (len(keys[big]) if keys is not None else 0)
            raise _BadLine(big, f"is a record of {size} bytes, larger than max_record_bytes={limit}")
        if values:
            t.append_batch(values, keys=keys, partition=partition,
                           metadata=None if meta is None else [meta] * len(values))
        return len(values)
    # JSON lines, or explicit timestamps: one record at a time, so a record refused by the
    # log (a timestamp below the partition's latest one, ...) stops exactly there
    for i, line in enumerate(lines):
        if fmt_ == "json":
            if not line.strip():
                raise _BadLine(i, "is empty (expected a JSON object)")
            try:
                key, value, m, when, part = _parse_json_line(line)
            except ValueError as e:
                raise _BadLine(i, f"is not a record: {e}") from None
            if partition is not None:
                part = partition
        else:
            key, value, m, when, part = None, line, meta, ts, partition
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise _BadLine(i, f"has no key separator {sep_text!r}")
            if null is not None and value == null:
                value = None
        try:
            t.append(value, key=key, partition=part, metadata=m, timestamp=when)
        except PylogError as e:
            raise _BadLine(i, f"was refused: {e}") from None
    return len(lines)



# -- consume -------------------------------------------------------------------------------
_VALUE = operator.itemgetter(3)


@click.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from-beginning", is_flag=True,
              help="Start at the earliest offset (with --group: when the group has committed nothing).")
@click.option("--offset", default=None, metavar="N|earliest|latest",
              help="Start at this offset of --partition.")
@click.option("-p", "--partition", type=click.IntRange(0), default=None, help="Read only this partition.")
@click.option("-g", "--group", default=None, help="Consumer group: start at its committed offsets and commit.")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new records (Ctrl-C to stop).")
@click.option("-n", "--max-records", type=click.IntRange(1), default=None, help="Stop after this many records.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: each value as it is, one per line; json: one object per record.")
@click.option("--print-key", is_flag=True, help="text format: print KEY<separator>VALUE.")
@click.option("--key-separator", default="\t", show_default=repr("\t"), metavar="SEP",
              help="Separator for --print-key.")
@click.option("-F", "--template", default=None, metavar="FMT",
              help="Print each record by this template, as kcat -f: %t topic, %p partition, %o offset, "
                   "%T timestamp, %k key, %s value, %h metadata, %K key size, %S value size, %% a %; "
                   "\\n \\t escapes. Example: '%p:%o %k=%s\\n'.")
@click.option("--idle-timeout", default=None, metavar="DURATION",
              help="Wait for new records (as --follow), and stop after this long without one (e.g. 5s, 500ms).")
@click.pass_context
def consume(ctx: click.Context, topic_name: str, from_beginning: bool, offset: str | None,
            partition: int | None, group: str | None, follow: bool, max_records: int | None, fmt_: str,
            print_key: bool, key_separator: str, template: str | None, idle_timeout: str | None) -> None:
    """Print the records of TOPIC.

    Without --group and --from-beginning, only records appended from now on are printed
    (as Kafka's console consumer does). Without --follow, stops at the end of the log.
    Ctrl-C ends --follow quietly (exit 0).
    """
    _check_consume_options(ctx, offset, from_beginning, fmt_, print_key, template)
    idle = _parse_duration(idle_timeout, "--idle-timeout") if idle_timeout is not None else None
    render = _compile_template(template, topic_name) if template is not None else None
    try:
        _consume(ctx, topic_name, from_beginning, offset, partition, group, follow or idle is not None,
                 max_records, fmt_, print_key, key_separator, render, idle)
    except KeyboardInterrupt:
        if not (follow or idle is not None):
            raise
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            pass


def _check_consume_options(ctx: click.Context, offset: str | None, from_beginning: bool, fmt_: str,
                           print_key: bool, template: str | None) -> None:
    """Refuse options that contradict each other."""
    from click.core import ParameterSource

    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning contradict each other (--offset earliest is "
                               "the beginning of one partition)")
    if template is not None and ctx.get_parameter_source("fmt_") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--template and --format contradict each other (the template is the format)")
    if print_key and (fmt_ == "json" or template is not None):
        raise click.UsageError("--print-key is for the text format (json shows the key; a template uses %k)")


def _compile_template(template: str, topic_name: str) -> Any:
    """A function record, partition -> bytes for a kcat-like ``-f`` template."""
    fields = {"t": None, "p": None, "o": None, "T": None, "k": None, "s": None, "h": None, "K": None, "S": None}
    parts: list[Any] = []
    lit = []
    i = 0
    text = template
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "ntr\\":
            lit.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[text[i + 1]])
            i += 2
            continue
        if c == "%":
            if i + 1 >= len(text):
                raise click.BadParameter("ends with a lone %", param_hint="--template")
            f = text[i + 1]
            if f == "%":
                lit.append("%")
            elif f in fields:
                if lit:
                    parts.append("".join(lit).encode())
                    lit = []
                parts.append(f)
            else:
                raise click.BadParameter(f"unknown field %{f} (known: %t %p %o %T %k %s %h %K %S %%)",
                                         param_hint="--template")
            i += 2
            continue
        lit.append(c)
        i += 1
    if lit:
        parts.append("".join(lit).encode())
    topic_b = topic_name.encode()

    def render(r: Any, p: int) -> bytes:
        out = []
        for part in parts:
            if type(part) is bytes:
                out.append(part)
            elif part == "s":
                out.append(b"null" if r[3] is None else r[3])
            elif part == "k":
                out.append(b"null" if r[2] is None else r[2])
            elif part == "h":
                out.append(b"null" if r[4] is None else r[4])
            elif part == "o":
                out.append(b"%d" % r[0])
            elif part == "p":
                out.append(b"%d" % p)
            elif part == "T":
                out.append(b"%d" % r[1])
            elif part == "t":
                out.append(topic_b)
            elif part == "K":
                out.append(b"-1" if r[2] is None else b"%d" % len(r[2]))
            else:  # S
                out.append(b"-1" if r[3] is None else b"%d" % len(r[3]))
        return b"".join(out)

    return render


def _consume(ctx: click.Context, topic_name: str, from_beginning: bool, offset: str | None,
             partition: int | None, group: str | None, follow: bool, max_records: int | None, fmt_: str,
             print_key: bool, key_separator: str, render: Any, idle: int | None) -> None:
    start: int | str | None = None
    if offset is not None:
        if partition is None:
            raise click.UsageError("--offset needs --partition")
        if offset in ("earliest", "latest"):
            start = offset
        else:
            try:
                start = int(offset)
            except ValueError:
                raise click.BadParameter(f"{offset!r} is not an offset, 'earliest' or 'latest'",
                                         param_hint="--offset") from None
            if start < 0:
                raise click.BadParameter(f"{offset!r} is negative", param_hint="--offset")
    if group is not None:
        from pylog.topics import check_name

        check_name(group, "group")
    store = _store(ctx, readonly=group is None)
    t = store.topic(topic_name)
    if partition is not None:
        t._check_partition(partition)
    reset = "earliest" if (from_beginning or start is not None) else "latest"
    consumer = store.consumer(topic_name, group=group, auto_offset_reset=reset,
                              partitions=None if partition is None else [partition])
    if start is not None:
        assert partition is not None
        if start == "earliest":
            consumer.seek_to_beginning()
        elif start == "latest":
            consumer.seek_to_end()
        else:
            log = t.reader(partition)
            if log.readonly:
                log.refresh()
            if not log.start_offset <= start <= log.next_offset:
                raise CliError(f"offset {start} is out of range: partition {partition} of {topic_name} "
                               f"holds [{log.start_offset}, {log.next_offset})")
            consumer.seek(partition, start)
    elif group is None and from_beginning:
        consumer.seek_to_beginning()
    elif group is None:
        consumer.seek_to_end()
    out = _Output()
    # What the group commits: per partition, the offset after the last record the reader of
    # stdout has taken (a new group's resolved start position until then)
    done: dict[int, int] = {p: consumer.position(p) for p in consumer.assignment()} if group else {}
    try:
        _consume_loop(consumer, out, done, topic_name, follow, max_records, fmt_, print_key,
                      key_separator.replace("\\t", "\t").encode(), group is not None, render, idle)
    except BrokenPipeError:
        pass  # the reader went away (pylog consume | head): not an error; commit what it took
    finally:
        if group is not None and not consumer.closed:
            out.drain()
            out.settle(done)
            mine = set(consumer.assignment())
            for p in mine - set(done):  # taken over, nothing read from it: its resolved start
                done[p] = consumer.position(p)
            consumer.commit({p: off for p, off in done.items() if p in mine})
    if out.broken:
        raise BrokenPipeError


class _Output:
    """stdout for ``pylog consume``: written with ``os.write`` (every byte handed to the OS is
    counted) and, for a pipe, asked (FIONREAD) how much its reader has not taken yet, so a
    group commits only records its reader really took. Marks remember, per record written,
    where its bytes end."""

    def __init__(self) -> None:
        import collections
        import stat

        self.written = 0
        self.broken = False
        self.marks: Any = collections.deque()  # (partition, offsets, ends): one per chunk
        try:
            sys.stdout.flush()
            self.fd = sys.stdout.fileno()
            self.fifo = stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        except (AttributeError, OSError, ValueError):
            self.fd, self.fifo = -1, False

    def write(self, data: bytes, p: int, offsets: list[int], lengths: list[int]) -> None:
        """Write ``data``, the records ``offsets`` of partition ``p`` whose output takes
        ``lengths`` bytes each. BrokenPipeError when the reader went away."""
        import numpy as np

        ends = np.cumsum(np.asarray(lengths, dtype=np.int64)) + self.written
        self.marks.append((p, offsets, ends))
        mv = memoryview(data)
        try:
            if self.fd < 0:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
                self.written += len(data)
                return
            while mv:
                n = os.write(self.fd, mv)
                self.written += n
                mv = mv[n:]
        except BrokenPipeError:
            self.broken = True
            raise

    def unread(self) -> int:
        """Bytes written to a pipe that its reader has not taken (0 for anything else)."""
        if not self.fifo:
            return 0
        import array
        import termios

        buf = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return buf[0]

    def drain(self, timeout: float = 2.0) -> None:
        """Give a pipe's reader up to ``timeout`` seconds to take what is still in the pipe
        (at exit: records it takes in time are committed, the rest are delivered again to
        the group's next consumer)."""
        if not self.fifo or self.broken:
            return
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        deadline = time.monotonic() + timeout
        while self.unread() and time.monotonic() < deadline:
            if any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0)):
                return  # the reader is gone: what it did not take stays uncommitted
            time.sleep(0.005)

    def settle(self, done: dict[int, int]) -> None:
        """Move ``done`` past every record whose bytes the reader has taken."""
        import numpy as np

        taken = self.written - self.unread()
        while self.marks:
            p, offsets, ends = self.marks[0]
            k = int(np.searchsorted(ends, taken, side="right"))
            if k:
                done[p] = offsets[k - 1] + 1
            if k < len(offsets):
                break
            self.marks.popleft()


def _consume_loop(consumer: Any, out: _Output, done: dict[int, int], topic_name: str, follow: bool,
                  max_records: int | None, fmt_: str, print_key: bool, ksep: bytes, grouped: bool,
                  render: Any, idle: int | None) -> None:
    left = max_records if max_records is not None else 1 << 62
    text = fmt_ == "text"
    idle_until = None if idle is None else time.monotonic() + idle / 1000
    while left > 0:
        wait = 1000 if idle_until is None else max(0, min(1000, int((idle_until - time.monotonic()) * 1000)))
        batch = consumer.poll_partitions(min(left, 20000), timeout_ms=wait if follow else 0)
        if batch and idle is not None:
            idle_until = time.monotonic() + idle / 1000
        for p, recs in batch.items():
            if len(recs) > left:
                recs = recs[:left]
            done.setdefault(p, recs[0][0])
            offsets = [r[0] for r in recs]
            if render is not None:
                rendered = [render(r, p) for r in recs]
                lengths = [len(x) for x in rendered]
                data = b"".join(rendered)
            elif text and not print_key:
                vals = list(map(_VALUE, recs))
                if None in vals:
                    vals = [b"null" if v is None else v for v in vals]
                lengths = [len(v) + 1 for v in vals]
                vals.append(b"")
                data = b"\n".join(vals)
            elif text:
                parts: list[bytes] = []
                lengths = []
                for r in recs:
                    k = b"null" if r[2] is None else r[2]
                    v = b"null" if r[3] is None else r[3]
                    parts += (k, ksep, v, b"\n")
                    lengths.append(len(k) + len(ksep) + len(v) + 1)
                data = b"".join(parts)
            else:
                lines = []
                for r in recs:
                    obj: dict[str, Any] = {"topic": topic_name, "partition": p, "offset": r[0], "timestamp": r[1]}
                    _json_field(obj, "key", r[2])
                    _json_field(obj, "value", r[3])
                    _json_field(obj, "metadata", r[4])
                    _json_headers(obj, r[4])
                    lines.append(json.dumps(obj).encode() + b"\n")
                lengths = [len(x) for x in lines]
                data = b"".join(lines)
            out.write(data, p, offsets, lengths)
            left -= len(recs)
            if len(recs) < len(batch[p]):
                consumer.seek(p, recs[-1][0] + 1)
            if left <= 0:
                break
        if grouped:
            out.settle(done)
            mine = set(consumer.assignment())
            consumer.commit({p: off for p, off in done.items() if p in mine})
        if not batch:
            if idle_until is not None and time.monotonic() >= idle_until:
                break
            if not follow:
                break
