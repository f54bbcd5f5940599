"""pylog serve: who may connect. TLS + SASL (PLAIN over TLS, SCRAM-SHA-256) with kafka-python
and librdkafka, per-topic permissions, and every refusal with Kafka's error code and no data.

A throwaway CA and server certificate are made with ``cryptography`` per test module; the
broker listens on 127.0.0.1 only (the non-loopback refusal is checked at start-up).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import subprocess
import sys

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
x509 = pytest.importorskip("cryptography.x509")
from conftest import ROOT, py_env  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from serve_util import BrokerProcess, batch, call, fetch, frame, produce, recv_exact  # noqa: E402

from pylog.errors import InvalidArgumentError  # noqa: E402
from pylog.serve import security  # noqa: E402


def _make_certs(d) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    """(ca.pem, server.pem, server.key) for 127.0.0.1 / localhost, valid for a day."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pylog test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"))
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    d = tmp_path_factory.mktemp("sec")
    ca, cert, key = _make_certs(d)
    users = str(d / "users.json")
    security.add_user(users, "alice", "alice-secret")
    security.add_user(users, "bob", "bob-secret", read=["public"], write=["public"])
    security.add_user(users, "carol", "carol-secret", read=["*"], write=["public", "carols"])
    # these tests fail logins on purpose, many times (clients retry): no per-address limit
    # here; test_serve_acl.py tests the limit on a broker of its own
    b = BrokerProcess(str(d / "root"), "--tls-cert", cert, "--tls-key", key, "--users", users,
                      "--max-failed-logins", "0")
    b.ca = ca  # type: ignore[attr-defined]
    yield b
    try:
        assert b.stop() == 0
    finally:
        sys.stderr.write(b.stderr()[-4000:])


def _kp(b, user: str, password: str, mechanism: str = "PLAIN", **kw):  # type: ignore[no-untyped-def]
    return dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL", ssl_cafile=b.ca,
                sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password, **kw)


def _rk(b, user: str, password: str, mechanism: str = "SCRAM-SHA-256", **kw):  # type: ignore[no-untyped-def]
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": b.ca,
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **kw}


def _tls(b) -> ssl.SSLSocket:  # type: ignore[no-untyped-def]
    ctx = ssl.create_default_context(cafile=b.ca)
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", b.port), timeout=20), server_hostname="localhost")


def _kafka_python_gets_no_data(cls: str, config: dict, action: str) -> None:
    """Run a kafka-python client that must be refused in a child process, bounded in time.
    kafka-python 3.0's bootstrap can loop past its own bootstrap_timeout_ms against a broker
    that refuses it (seen hanging for minutes in CI), so the test never waits on it in-process.
    The child prints REFUSED on a KafkaError and DELIVERED if the action succeeded; a child still
    bootstrapping at the bound has received nothing either."""
    import json
    import textwrap

    code = textwrap.dedent(f"""
        import json, sys, kafka
        cfg = json.loads(sys.argv[1])
        try:
            client = kafka.{cls}(**cfg)
            {action}
        except kafka.errors.KafkaError as e:
            print("REFUSED", type(e).__name__, flush=True)
        else:
            print("DELIVERED", flush=True)
    """)
    try:
        r = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True,
                           timeout=60, env=py_env())
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        assert "DELIVERED" not in out, out
        return
    assert "DELIVERED" not in r.stdout and "REFUSED" in r.stdout, (r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kafka_python_over_tls_and_sasl(secure, mechanism):
    topic = "kp-" + mechanism.lower()
    p = kafka.KafkaProducer(**_kp(secure, "alice", "alice-secret", mechanism))
    for i in range(5):
        p.send(topic, b"m%d" % i).get(timeout=20)
    p.close()
    c = kafka.KafkaConsumer(topic, **_kp(secure, "alice", "alice-secret", mechanism), auto_offset_reset="earliest",
                            consumer_timeout_ms=5000)
    got = [m.value for m in c]
    c.close()
    assert got == [b"m%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_librdkafka_over_tls_and_sasl(secure, mechanism):
    topic = "rk-" + mechanism.lower()
    p = ck.Producer(_rk(secure, "alice", "alice-secret", mechanism))
    for i in range(5):
        p.produce(topic, value=b"r%d" % i)
    assert p.flush(30) == 0
    c = ck.Consumer(_rk(secure, "alice", "alice-secret", mechanism, **{"group.id": "rkg",
                                                                         "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    for _ in range(200):
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            got.append(m.value())
        if len(got) == 5:
            break
    c.close()
    assert got == [b"r%d" % i for i in range(5)]


def _sasl(s, mechanism: str, auth: bytes):  # type: ignore[no-untyped-def]
    r = call(s, frame(17, 1, {"mechanism": mechanism}), 17, 1)
    assert r.error_code == 0 and set(r.mechanisms) == {"PLAIN", "SCRAM-SHA-256"}
    return call(s, frame(36, 2, {"auth_bytes": auth}), 36, 2)


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-secret")])
def test_wrong_password_or_unknown_user_refused(secure, user, password):
    with _tls(secure) as s:  # raw protocol: Kafka's code, then the connection closes
        r = _sasl(s, "PLAIN", b"\0" + user.encode() + b"\0" + password.encode())
        assert r.error_code == 58 and "invalid" in r.error_message  # SASL_AUTHENTICATION_FAILED
        assert recv_exact(s, 4) is None
    with _tls(secure) as s:  # SCRAM: an unknown user, as a wrong password, fails at the proof (RFC 5802 5.1)
        r = _sasl(s, "SCRAM-SHA-256", f"n,,n={user},r=abcdefgh".encode())
        assert r.error_code == 0 and r.auth_bytes.startswith(b"r=abcdefgh")
        nonce = dict(a.split("=", 1) for a in r.auth_bytes.decode().split(","))["r"]
        r = call(s, frame(36, 2, {"auth_bytes": f"c=biws,r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
                                  .encode()}), 36, 2)
        assert r.error_code == 58
        assert recv_exact(s, 4) is None
    # the clients: kafka-python raises, librdkafka reports an authentication error; no data
    _kafka_python_gets_no_data("KafkaProducer", _kp(secure, user, password, request_timeout_ms=5000,
                                                    max_block_ms=5000, bootstrap_timeout_ms=5000),
                               'client.send("public", b"x").get(timeout=10)')
    errors = []
    p = ck.Producer(_rk(secure, user, password, **{"error_cb": errors.append, "message.timeout.ms": 3000}))
    p.produce("public", b"x")
    p.flush(8)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors


def test_client_without_tls_or_sasl_gets_no_data(secure):
    # plaintext to a TLS listener: the handshake fails, no answer at all
    with socket.create_connection(("127.0.0.1", secure.port), timeout=20) as s:
        s.sendall(frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}))
        data = b""
        try:
            for _ in range(100):  # until the broker closes
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        assert data == b"" or data[0] == 0x15, data  # nothing, or a TLS alert record: no Kafka answer
    _kafka_python_gets_no_data("KafkaConsumer", dict(bootstrap_servers=secure.bootstrap,
                                                     api_version_auto_timeout_ms=3000,
                                                     request_timeout_ms=4000, bootstrap_timeout_ms=5000),
                               "client.poll(timeout_ms=3000)")
    # TLS but no SASL: ApiVersions is answered, anything else closes the connection
    with _tls(secure) as s:
        r = call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
        assert r.error_code == 0 and {17, 36} <= {k.api_key for k in r.api_keys}
        assert call(s, frame(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False}), 3, 12) is None


def test_unauthorised_topic_refused_with_no_data(secure):
    p = ck.Producer(_rk(secure, "alice", "alice-secret"))
    p.produce("private", b"only for alice")
    p.produce("public", b"for everyone")
    assert p.flush(30) == 0
    with _tls(secure) as s:  # bob may read and write "public" only
        assert _sasl(s, "PLAIN", b"\0bob\0bob-secret").error_code == 0
        r = call(s, fetch("private", 0), 1, 12)
        part = r.responses[0].partitions[0]
        assert part.error_code == 29 and not part.records  # TOPIC_AUTHORIZATION_FAILED, no data
        r = call(s, produce("private", batch([b"bob was here"])), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 29
        r = call(s, fetch("public", 0), 1, 12)
        assert r.responses[0].partitions[0].error_code == 0 and r.responses[0].partitions[0].records
        r = call(s, frame(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False}), 3, 12)
        assert "public" in {t.name for t in r.topics} and "private" not in {t.name for t in r.topics}  # as Kafka
        r = call(s, frame(3, 12, {"topics": [{"name": "private", "topic_id": None}], "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False}), 3, 12)
        assert r.topics[0].error_code == 29 and not r.topics[0].partitions
        r = call(s, frame(20, 5, {"topics": [{"name": "private", "topic_id": None}], "topic_names": ["private"],
                                  "timeout": 5000}), 20, 5)
        assert r.responses[0].error_code == 29
    # the same with the clients: librdkafka's delivery report says TOPIC_AUTHORIZATION_FAILED
    reports = []
    p = ck.Producer(_rk(secure, "bob", "bob-secret", **{"message.timeout.ms": 10000}))
    p.produce("private", b"bob was here", on_delivery=lambda err, msg: reports.append(err))
    p.flush(20)
    assert reports and reports[0] is not None and reports[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, \
        reports
    kp = kafka.KafkaProducer(**_kp(secure, "bob", "bob-secret"), max_block_ms=5000)
    with pytest.raises(kafka.errors.KafkaError):
        kp.send("private", b"x").get(timeout=10)
    kp.close(timeout=5)
    # nothing bob sent reached "private"
    c = kafka.KafkaConsumer("private", **_kp(secure, "alice", "alice-secret"), auto_offset_reset="earliest",
                            consumer_timeout_ms=4000)
    assert [m.value for m in c] == [b"only for alice"]
    c.close()


@pytest.mark.parametrize("version", [1, 3, 4, 12])
def test_metadata_auto_create_needs_write_permission(secure, version):
    """Metadata v0-3 always ask to create unknown topics (v4+ when allow_auto_topic_creation):
    only a topic the user may write is created; any other unknown one is answered
    TOPIC_AUTHORIZATION_FAILED and not created, whatever the user may read."""
    def meta(s, names):  # type: ignore[no-untyped-def]
        body = {"topics": [{"name": n, "topic_id": None} for n in names]}
        if version >= 4:
            body["allow_auto_topic_creation"] = True
        if version >= 8:
            body.update(include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
        return {t.name: t for t in call(s, frame(3, version, body), 3, version).topics}

    new = f"made-by-v{version}"
    with _tls(secure) as s:  # carol may read every topic, write only "public" and "carols"
        assert _sasl(s, "PLAIN", b"\0carol\0carol-secret").error_code == 0
        by = meta(s, [new, "carols"])
        assert by[new].error_code == 29 and not by[new].partitions
        assert by["carols"].error_code == 0 and len(by["carols"].partitions) == 1  # may write: created
    with _tls(secure) as s:  # bob may neither read nor write it
        assert _sasl(s, "PLAIN", b"\0bob\0bob-secret").error_code == 0
        assert meta(s, [new])[new].error_code == 29
    assert not os.path.exists(os.path.join(secure.root, new))
    with _tls(secure) as s:  # alice, who may write every topic, still creates it
        assert _sasl(s, "PLAIN", b"\0alice\0alice-secret").error_code == 0
        assert meta(s, [new])[new].error_code == 0
    assert os.path.isdir(os.path.join(secure.root, new))


def test_non_loopback_needs_tls_and_users(tmp_path):
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        with pytest.raises(InvalidArgumentError, match="not loopback"):
            security.check_listen(host, tls=False, users=False)
        with pytest.raises(InvalidArgumentError, match="SASL users"):
            security.check_listen(host, tls=True, users=False)
        security.check_listen(host, tls=True, users=True)  # allowed (not bound here)
    for host in ("127.0.0.1", "::1", "localhost"):
        security.check_listen(host, tls=False, users=False)
    # the command refuses before it opens the root or binds anything: one line, exit 1
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", str(tmp_path / "r"), "serve",
                          "--host", "0.0.0.0", "--port", "0"], cwd=ROOT, env=py_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "not loopback" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    assert out.stdout == ""
