"""The kp module against a secured daemon: TLS and a tenant's token, set as for the C++ library
(KOMPUTED_TLS_CA, KOMPUTED_TOKEN, KOMPUTED_TOKEN_FILE), reach every call, compile_source's
included; without them the errors carry the codes that say why."""

import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest

import kp
from conftest import start_daemon, stop_daemon

TOKEN = "python-tenant-token"

SCALE = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Data { float v[]; };
void main() { v[gl_GlobalInvocationID.x] *= 3.0; }
"""


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A daemon with TLS (a certificate for 127.0.0.1 from a CA made here) and one tenant whose
    token is TOKEN: (its address, the CA's file, a file holding the token)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("secured")
    ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    _openssl("genpkey", *ec, "-out", "ca.key", cwd=folder)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=kp python test CA", cwd=folder)
    _openssl("genpkey", *ec, "-out", "server.key", cwd=folder)
    _openssl("req", "-new", "-key", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
             cwd=folder)
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
             cwd=folder)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    (folder / "tenants.yaml").write_text(
        f"tenants:\n  - name: python\n    token_sha256: {digest}\n")
    (folder / "token").write_text(TOKEN + "\n")
    process, address, log = start_daemon([
        f"--tls_cert={folder / 'server.pem'}",
        f"--tls_key={folder / 'server.key'}",
        f"--tenants_file={folder / 'tenants.yaml'}",
    ])
    yield address, str(folder / "ca.pem"), str(folder / "token")
    stop_daemon(process, log)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("KOMPUTED_ADDRESS", "KOMPUTED_DEVICE", "KOMPUTED_SELECT", "KOMPUTED_TOKEN",
                 "KOMPUTED_TOKEN_FILE", "KOMPUTED_TLS_CA", "KOMPUTED_TLS_CERT",
                 "KOMPUTED_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _round_trip(mgr):
    tensor = mgr.tensor(np.array([1, 2, 3], dtype=np.float32))
    algo = mgr.algorithm([tensor], kp.compile_source(SCALE), (3, 1, 1))
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice([tensor]))
        .record(kp.OpAlgoDispatch(algo))
        .record(kp.OpTensorSyncLocal([tensor]))
        .eval())
    return tensor.data().tolist()


@pytest.mark.parametrize("token_from", ["KOMPUTED_TOKEN", "KOMPUTED_TOKEN_FILE"])
def test_tls_and_token_reach_every_call(secured, clean_env, token_from):
    address, ca, token_file = secured
    clean_env.setenv("KOMPUTED_ADDRESS", address)
    clean_env.setenv("KOMPUTED_TLS_CA", ca)
    clean_env.setenv(token_from, TOKEN if token_from == "KOMPUTED_TOKEN" else token_file)
    mgr = kp.Manager()
    try:
        # compile_source goes to the daemon too, with the same credentials.
        assert _round_trip(mgr) == [3.0, 6.0, 9.0]
    finally:
        mgr.destroy()


def test_without_a_token_the_daemon_refuses(secured, clean_env):
    address, ca, _ = secured
    clean_env.setenv("KOMPUTED_ADDRESS", address)
    clean_env.setenv("KOMPUTED_TLS_CA", ca)
    with pytest.raises(kp.Error) as missing:
        kp.Manager()
    assert missing.value.code == "UNAUTHENTICATED"
    with pytest.raises(kp.Error) as compile_missing:
        kp.compile_source(SCALE)
    assert compile_missing.value.code == "UNAUTHENTICATED"
    clean_env.setenv("KOMPUTED_TOKEN", "not-the-token")
    with pytest.raises(kp.Error) as wrong:
        kp.Manager()
    assert wrong.value.code == "UNAUTHENTICATED"
    assert "not-the-token" not in str(wrong.value)


def test_plain_text_to_a_tls_daemon_is_unavailable(secured, clean_env):
    address, _, token_file = secured
    clean_env.setenv("KOMPUTED_ADDRESS", address)
    clean_env.setenv("KOMPUTED_TOKEN_FILE", token_file)
    with pytest.raises(kp.Error) as plain:
        kp.Manager()
    assert plain.value.code == "UNAVAILABLE"
    assert "KOMPUTED_TLS_CA" in str(plain.value)


def test_a_missing_ca_file_is_named(secured, clean_env, tmp_path):
    address, _, token_file = secured
    clean_env.setenv("KOMPUTED_ADDRESS", address)
    clean_env.setenv("KOMPUTED_TOKEN_FILE", token_file)
    missing = str(tmp_path / "no-such-ca.pem")
    clean_env.setenv("KOMPUTED_TLS_CA", missing)
    with pytest.raises(kp.Error) as error:
        kp.Manager()
    assert missing in str(error.value)
    assert not os.path.exists(missing)
