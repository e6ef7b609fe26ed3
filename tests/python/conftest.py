"""Fixtures of the kp Python suite: every test that takes `mgr` (or `backend`) runs twice, in-process
and against a komputed daemon that the suite starts on a free port."""

import os
import selectors
import subprocess
import tempfile
import time

import pytest

import kp

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _komputed_binary():
    return os.environ.get("KOMPUTED_BINARY") or os.path.join(REPO, "build", "server", "komputed")


def _read_line(stream, deadline):
    """One line of the daemon's stdout, or '' when it says nothing before `deadline`."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(remaining):
            break
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        line += chunk
    selector.close()
    return line.decode().strip()


def start_daemon(flags=()):
    """A komputed daemon on 127.0.0.1:0 with `flags`: (its process, its address, its log file).
    Fails the test when it does not print its address."""
    binary = _komputed_binary()
    if not os.path.exists(binary):
        pytest.fail(f"komputed binary not found at {binary} (set KOMPUTED_BINARY)")
    log = tempfile.TemporaryFile()
    # The kernel watchdog's limit that the suite's runner gives (as the C++ suites' daemons).
    limit = os.environ.get("KOMPUTED_TEST_MAX_KERNEL_TIME")
    watchdog = [f"--max_kernel_time={limit}"] if limit else []
    process = subprocess.Popen(
        [binary, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", *watchdog, *flags],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    deadline = time.monotonic() + 60
    listening = _read_line(process.stdout, deadline)
    _read_line(process.stdout, deadline)  # the metrics address
    prefix = "komputed listening on "
    if not listening.startswith(prefix):
        process.kill()
        process.wait()
        log.seek(0)
        pytest.fail(f"komputed did not print its address: {listening!r}\n{log.read().decode()}")
    return process, listening[len(prefix):], log


def stop_daemon(process, log):
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


@pytest.fixture(scope="session")
def daemon():
    """A komputed daemon on 127.0.0.1:0; its address, read from what it prints."""
    process, address, log = start_daemon()
    yield address
    stop_daemon(process, log)


@pytest.fixture(params=["inprocess", "remote"])
def backend(request, monkeypatch):
    """Sets the environment for one backend: KOMPUTED_ADDRESS unset, or naming the daemon."""
    monkeypatch.delenv("KOMPUTED_DEVICE", raising=False)
    monkeypatch.delenv("KOMPUTED_SELECT", raising=False)
    if request.param == "remote":
        monkeypatch.setenv("KOMPUTED_ADDRESS", request.getfixturevalue("daemon"))
    else:
        monkeypatch.delenv("KOMPUTED_ADDRESS", raising=False)
    return request.param


@pytest.fixture
def mgr(backend):
    manager = kp.Manager()
    yield manager
    manager.destroy()
