"""What Python costs over C++ with the kp module, as ratios in one run.

The same work is timed as a Python loop and as a loop in C++ inside the same process
(kp._kp._eval_loop), in-process and against a komputed daemon that this script starts on a free
port:
- the tiny eval: a sequence that syncs 1024 floats up, runs x*2+1 over them and syncs them back;
- a 256 MiB upload: the source copied into the tensor's host data (numpy into the tensor's view;
  memcpy in C++) and the tensor synced to the device.

Targets: tiny eval Python/C++ <= 1.3 in-process and <= 1.1 remote. Environment: KOMPUTED_BINARY
(the daemon, default build/server/komputed), KOMPUTED_BENCH_MIN_TIME (seconds per tiny
measurement, default 1), KOMPUTED_BENCH_BULK_ITERS (256 MiB uploads per measurement, default 5).
Exits 1 when a result comes back wrong.
"""

import os
import subprocess
import sys
import time

import numpy as np

import kp

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TINY = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Data { float v[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  v[i] = v[i] * 2.0 + 1.0;
}
"""


def start_daemon():
    binary = os.environ.get("KOMPUTED_BINARY") or os.path.join(REPO, "build", "server", "komputed")
    process = subprocess.Popen(
        [binary, "--listen=127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    line = process.stdout.readline().decode().strip()
    prefix = "komputed listening on "
    if not line.startswith(prefix):
        process.kill()
        sys.exit(f"python_bench: komputed did not print its address: {line!r}")
    return process, line[len(prefix):]


def best_of(runs, first, second):
    """The least of `runs` measurements of each (seconds per item: the ones least disturbed),
    taken in turns so that a change in the machine's load falls on both."""
    a, b = [], []
    for _ in range(runs):
        a.append(first())
        b.append(second())
    return min(a), min(b)


def tiny(mgr, min_time):
    tensor = mgr.tensor(np.zeros(1024, dtype=np.float32))
    algo = mgr.algorithm([tensor], kp.compile_source(TINY), (16, 1, 1))
    seq = mgr.sequence()
    seq.record(kp.OpTensorSyncDevice([tensor]))
    seq.record(kp.OpAlgoDispatch(algo))
    seq.record(kp.OpTensorSyncLocal([tensor]))
    # How many evals fill min_time (the values run off to infinity; only the time matters).
    start = time.perf_counter()
    count = 0
    while time.perf_counter() - start < min_time / 4:
        seq.eval()
        count += 1
    count *= 4

    def python():
        begin = time.perf_counter()
        for _ in range(count):
            seq.eval()
        return (time.perf_counter() - begin) / count

    def cpp():
        return kp._kp._eval_loop(seq, count) / count

    # Correct first: one eval maps v to 2v+1.
    values = np.arange(1024, dtype=np.float32)
    tensor.data()[:] = values
    seq.eval()
    if not np.array_equal(tensor.data(), values * 2 + 1):
        sys.exit("python_bench: the tiny eval came back wrong")
    return best_of(3, python, cpp)


def upload(mgr, iterations):
    count = (256 << 20) // 4
    source = np.arange(count, dtype=np.float32)
    tensor = mgr.tensor(np.zeros(count, dtype=np.float32))
    seq = mgr.sequence()
    seq.record(kp.OpTensorSyncDevice([tensor]))
    seq.eval()  # the tensor exists on the device before the timing
    view = tensor.data()

    def python():
        begin = time.perf_counter()
        for _ in range(iterations):
            view[:] = source
            seq.eval()
        return (time.perf_counter() - begin) / iterations

    def cpp():
        return kp._kp._eval_loop(seq, iterations, tensor, source) / iterations

    py_s, cpp_s = best_of(2, python, cpp)
    # The data is on the device: bring it back and compare.
    view[:] = 0
    mgr.sequence().eval(kp.OpTensorSyncLocal([tensor]))
    if not np.array_equal(tensor.data()[:: 1 << 16], source[:: 1 << 16]):
        sys.exit("python_bench: the 256 MiB upload came back wrong")
    return py_s, cpp_s


def main():
    min_time = float(os.environ.get("KOMPUTED_BENCH_MIN_TIME", "1"))
    bulk = int(os.environ.get("KOMPUTED_BENCH_BULK_ITERS", "5"))
    process, address = start_daemon()
    try:
        for name, make in (("in-process", lambda: kp.Manager()),
                           ("remote", lambda: kp.Manager(address))):
            mgr = make()
            py_s, cpp_s = tiny(mgr, min_time)
            target = 1.3 if name == "in-process" else 1.1
            ratio = py_s / cpp_s
            print(f"tiny eval, {name}: Python {py_s * 1e6:.1f} us, C++ {cpp_s * 1e6:.1f} us")
            print(f"ratio Python/C++ (tiny eval, {name}): {ratio:.2f}  target <= {target:.2f}  "
                  f"[{'met' if ratio <= target else 'NOT met'}]")
            py_s, cpp_s = upload(mgr, bulk)
            gb = (256 << 20) / 1e9
            print(f"256 MiB upload from numpy, {name}: Python {gb / py_s:.2f} GB/s, "
                  f"C++ {gb / cpp_s:.2f} GB/s")
            print(f"ratio Python/C++ (256 MiB upload time, {name}): {py_s / cpp_s:.2f}")
            mgr.destroy()
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
