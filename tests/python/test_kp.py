"""The kp Python module against both backends: Kompute 0.9's Python API, numpy views of tensors'
host memory, every element type through a shader, asynchronous evaluation, compile_source, errors
with their codes, and the GIL released while the device works."""

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kp

from conftest import REPO

SPIRV_MAGIC = 0x07230203

# out[i] = in[i] * 2 + 1, for one element type (the GLSL type is substituted).
AFFINE = """
#version 450
#extension GL_ARB_gpu_shader_fp64 : enable
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer In { TYPE a[]; };
layout(set = 0, binding = 1) buffer Out { TYPE b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * TYPE(2) + TYPE(1);
}
"""

# out = ~in, word by word: any element type's bytes through a shader.
INVERT_WORDS = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer In { uint a[]; };
layout(set = 0, binding = 1) buffer Out { uint b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = ~a[i];
}
"""

# a[i] *= push constant.
SCALE = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(push_constant) uniform P { float factor; };
void main() { a[gl_GlobalInvocationID.x] *= factor; }
"""

# About a third of a second of work on lavapipe (256 x 64 invocations, loops iterations each): long
# enough that a thread waiting for it is still waiting when it starts.
SLOW = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { float o[]; };
layout(constant_id = 0) const uint loops = 1;
void main() {
  float x = float(gl_GlobalInvocationID.x);
  for (uint k = 0; k < loops; ++k) x = x * 0.999 + 1.0;
  if (x == 12345.678) o[0] = x;
}
"""
SLOW_LOOPS = 1000
SLOW_WORKGROUPS = (256, 1, 1)


def evaluate_affine(mgr, values, glsl_type):
    a = mgr.tensor_t(values)
    b = mgr.tensor_t(np.zeros_like(values))
    algo = mgr.algorithm([a, b], kp.compile_source(AFFINE.replace("TYPE", glsl_type)))
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice([a, b]))
        .record(kp.OpAlgoDispatch(algo))
        .record(kp.OpTensorSyncLocal([b]))
        .eval())
    return b.data()


# ------------------------------------------------------------------------------------------------
# Manager and devices

def test_device_properties_and_list(mgr):
    props = mgr.get_device_properties()
    assert props["device_name"]
    assert len(props["max_work_group_count"]) == 3
    assert props["max_work_group_invocations"] > 0
    devices = mgr.list_devices()
    assert len(devices) >= 1
    assert devices[0]["device_name"]


def test_manager_with_device_and_queue_families(backend):
    mgr = kp.Manager(0, [0])
    t = mgr.tensor([1, 2, 3])
    mgr.sequence(0).eval(kp.OpTensorSyncDevice([t]))
    mgr.destroy()
    assert not t.is_init()


def test_too_many_queues_is_an_error(backend):
    with pytest.raises(kp.Error) as error:
        kp.Manager(0, [0] * 64)
    assert error.value.code in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED")


# ------------------------------------------------------------------------------------------------
# Tensors and numpy views

def test_tensor_from_list_is_float32(mgr):
    t = mgr.tensor([1, 2, 3])
    assert t.size() == 3 and len(t) == 3
    assert t.data_type() == kp.DataTypes.float
    assert t.tensor_type() == kp.TensorTypes.device
    assert t.is_init()
    assert t.data().dtype == np.float32
    np.testing.assert_array_equal(t.data(), [1, 2, 3])


def test_data_views_the_host_memory(mgr):
    t = mgr.tensor(np.arange(4, dtype=np.float32))
    first, second = t.data(), t.data()
    assert np.shares_memory(first, second)
    first[2] = 42
    assert second[2] == 42
    assert isinstance(first.base, object) and first.base is not None


def test_view_outlives_tensor_and_manager(backend):
    mgr = kp.Manager()
    t = mgr.tensor([7, 8, 9])
    view = t.data()
    t.destroy()
    mgr.destroy()
    del t, mgr
    np.testing.assert_array_equal(view, [7, 8, 9])


def test_write_through_view_reaches_the_device_after_sync(mgr):
    a = mgr.tensor([0, 0, 0])
    b = mgr.tensor([0, 0, 0])
    algo = mgr.algorithm([a, b], kp.compile_source(AFFINE.replace("TYPE", "float")))
    a.data()[:] = [1, 2, 3]
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice([a]))
        .record(kp.OpAlgoDispatch(algo))
        .record(kp.OpTensorSyncLocal([b]))
        .eval())
    np.testing.assert_array_equal(b.data(), [3, 5, 7])


def test_sync_local_is_visible_in_an_existing_view(mgr):
    a = mgr.tensor([1, 2, 3])
    b = mgr.tensor([0, 0, 0])
    view = b.data()
    algo = mgr.algorithm([a, b], kp.compile_source(AFFINE.replace("TYPE", "float")))
    mgr.sequence().record(kp.OpTensorSyncDevice([a])).record(kp.OpAlgoDispatch(algo)).eval()
    np.testing.assert_array_equal(view, [0, 0, 0])  # not synced back yet
    mgr.sequence().eval(kp.OpTensorSyncLocal([b]))
    np.testing.assert_array_equal(view, [3, 5, 7])


def test_str_and_repr_show_the_data_like_numpy(mgr):
    t = mgr.tensor_t(np.array([4, 8, 12], dtype=np.uint32))
    assert str(t) == "[ 4  8 12]"
    assert repr(t) == "kp.Tensor(array([ 4,  8, 12], dtype=uint32))"
    t.destroy()
    assert "destroyed" in repr(t)


@pytest.mark.parametrize(
    "dtype,glsl_type",
    [(np.float32, "float"), (np.float64, "double"), (np.int32, "int"), (np.uint32, "uint")])
def test_numeric_dtypes_through_a_shader(mgr, dtype, glsl_type):
    values = np.array([-3, 0, 5, 1000], dtype=dtype) if dtype != np.uint32 else \
        np.array([3, 0, 5, 1000], dtype=dtype)
    out = evaluate_affine(mgr, values, glsl_type)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, values * 2 + 1)


@pytest.mark.parametrize(
    "dtype,data_type",
    [(np.bool_, kp.DataTypes.bool), (np.int8, kp.DataTypes.char), (np.uint8, kp.DataTypes.uchar),
     (np.int16, kp.DataTypes.short), (np.uint16, kp.DataTypes.ushort),
     (np.float16, kp.DataTypes.half), (np.float32, kp.DataTypes.float),
     (np.float64, kp.DataTypes.double), (np.int32, kp.DataTypes.int),
     (np.uint32, kp.DataTypes.uint)])
def test_every_dtype_round_trips_through_a_shader(mgr, dtype, data_type):
    # 8 elements: a whole number of 32-bit words for every element size.
    values = (np.arange(8) % 2 == 0) if dtype == np.bool_ else np.arange(1, 9).astype(dtype)
    values = values.astype(dtype)
    a = mgr.tensor_t(values)
    b = mgr.tensor_t(np.zeros_like(values))
    assert a.data_type() == data_type
    words = values.nbytes // 4
    algo = mgr.algorithm([a, b], kp.compile_source(INVERT_WORDS), (words, 1, 1))
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice([a, b]))
        .record(kp.OpAlgoDispatch(algo))
        .record(kp.OpTensorSyncLocal([b]))
        .eval())
    inverted = np.bitwise_not(values.view(np.uint8))
    np.testing.assert_array_equal(b.data().view(np.uint8), inverted)


def test_unsupported_dtype_is_a_type_error(mgr):
    with pytest.raises(TypeError, match="int64"):
        mgr.tensor_t(np.array([1, 2], dtype=np.int64))


def test_64mib_round_trip(mgr):
    values = np.arange(16 << 20, dtype=np.float32)
    a = mgr.tensor_t(values)
    b = mgr.tensor_t(np.zeros_like(values))
    mgr.sequence().eval(kp.OpTensorCopy([a, b]))
    b.data()[:] = 0
    mgr.sequence().eval(kp.OpTensorSyncLocal([b]))
    assert np.array_equal(b.data(), values)


# ------------------------------------------------------------------------------------------------
# Algorithms, sequences and operations

def test_the_readme_program(mgr):
    a = mgr.tensor([2, 2, 2])
    b = mgr.tensor([1, 2, 3])
    out_a = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))
    out_b = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))
    params = [a, b, out_a, out_b]
    spirv = kp.compile_source("""
        #version 450
        layout (local_size_x = 1) in;
        layout(set = 0, binding = 0) buffer buf_in_a { float in_a[]; };
        layout(set = 0, binding = 1) buffer buf_in_b { float in_b[]; };
        layout(set = 0, binding = 2) buffer buf_out_a { uint out_a[]; };
        layout(set = 0, binding = 3) buffer buf_out_b { uint out_b[]; };
        layout(push_constant) uniform PushConstants { float val; } push_const;
        layout(constant_id = 0) const float const_one = 0;
        void main() {
            uint index = gl_GlobalInvocationID.x;
            out_a[index] += uint( in_a[index] * in_b[index] );
            out_b[index] += uint( const_one * push_const.val );
        }""")
    algo = mgr.algorithm(params, spirv, (3, 1, 1), [2], [2])
    assert algo.get_workgroup() == (3, 1, 1)
    assert len(algo.get_tensors()) == 4
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice(params))
        .record(kp.OpAlgoDispatch(algo))
        .eval()
        .record(kp.OpAlgoDispatch(algo, [3]))
        .eval())
    sq = mgr.sequence()
    assert sq.eval_async(kp.OpTensorSyncLocal(params)) is sq
    assert sq.eval_await() is sq
    np.testing.assert_array_equal(out_a.data(), [4, 8, 12])
    np.testing.assert_array_equal(out_b.data(), [10, 10, 10])


def test_spirv_as_a_list_of_words(mgr):
    spirv = kp.compile_source(SCALE)
    assert isinstance(spirv, bytes)
    words = np.frombuffer(spirv, dtype=np.uint32)
    assert words[0] == SPIRV_MAGIC
    t = mgr.tensor([1, 2, 3])
    algo = mgr.algorithm([t], [int(w) for w in words], push_consts=[3])
    mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)) \
        .record(kp.OpTensorSyncLocal([t])).eval()
    np.testing.assert_array_equal(t.data(), [3, 6, 9])


def test_record_once_evaluate_many_times(mgr):
    t = mgr.tensor([1, 2, 3])
    algo = mgr.algorithm([t], kp.compile_source(SCALE), push_consts=[2])
    mgr.sequence().eval(kp.OpTensorSyncDevice([t]))
    sq = mgr.sequence().record(kp.OpAlgoDispatch(algo)).record(kp.OpTensorSyncLocal([t]))
    assert sq.is_recording()
    sq.eval()
    assert not sq.is_recording()
    sq.eval()
    np.testing.assert_array_equal(t.data(), [4, 8, 12])
    # rebuild, then rerecord: the new push constant is used.
    algo.rebuild([t], kp.compile_source(SCALE), None, None, [10])
    sq.rerecord()
    sq.eval()
    np.testing.assert_array_equal(t.data(), [40, 80, 120])
    sq.clear()
    assert not sq.is_recording()
    sq.destroy()
    assert not sq.is_init()


def test_eval_async_and_await(mgr):
    t = mgr.tensor([1, 2, 3])
    algo = mgr.algorithm([t], kp.compile_source(SCALE), push_consts=[5])
    sq = mgr.sequence()
    sq.record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)) \
        .record(kp.OpTensorSyncLocal([t]))
    sq.eval_async()
    assert sq.is_running()
    sq.eval_await()
    assert not sq.is_running()
    np.testing.assert_array_equal(t.data(), [5, 10, 15])
    assert sq.eval_await() is sq  # nothing in flight: returns at once


def test_eval_await_with_a_short_timeout_keeps_running(mgr):
    out = mgr.tensor([0])
    algo = mgr.algorithm([out], kp.compile_source(SLOW), SLOW_WORKGROUPS, [SLOW_LOOPS])
    sq = mgr.sequence()
    sq.eval_async(kp.OpAlgoDispatch(algo))
    sq.eval_await(1000)  # 1 µs: too short
    assert sq.is_running()
    sq.eval_await()
    assert not sq.is_running()


def test_timestamps(mgr):
    t = mgr.tensor([1, 2, 3])
    algo = mgr.algorithm([t], kp.compile_source(SCALE), push_consts=[2])
    sq = mgr.sequence(0, 10)
    sq.record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)) \
        .record(kp.OpTensorSyncLocal([t])).eval()
    stamps = sq.get_timestamps()
    assert len(stamps) == 4
    assert all(later >= earlier for earlier, later in zip(stamps, stamps[1:]))


def test_tensor_copy(mgr):
    a = mgr.tensor([1, 2, 3])
    b = mgr.tensor([0, 0, 0])
    c = mgr.tensor([0, 0, 0])
    mgr.sequence().eval(kp.OpTensorSyncDevice([a])).eval(kp.OpTensorCopy([a, b, c]))
    np.testing.assert_array_equal(c.data(), [1, 2, 3])
    c.data()[:] = 0
    mgr.sequence().eval(kp.OpTensorSyncLocal([c]))
    np.testing.assert_array_equal(c.data(), [1, 2, 3])
    assert kp.OpCopy is kp.OpTensorCopy and kp.OpSyncLocal is kp.OpTensorSyncLocal


def test_op_mult_and_memory_barrier(mgr):
    a = mgr.tensor([1, 2, 3])
    b = mgr.tensor([4, 5, 6])
    c = mgr.tensor([0, 0, 0])
    shader_write, transfer_read = 0x40, 0x800  # VK_ACCESS_SHADER_WRITE_BIT, _TRANSFER_READ_BIT
    compute, transfer = 0x800, 0x1000  # VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, _TRANSFER_BIT
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice([a, b]))
        .record(kp.OpMult([a, b, c], mgr.algorithm()))
        .record(kp.OpMemoryBarrier([c], shader_write, transfer_read, compute, transfer))
        .record(kp.OpTensorSyncLocal([c]))
        .eval())
    np.testing.assert_array_equal(c.data(), [4, 10, 18])


def test_host_and_storage_tensors(mgr):
    host = mgr.tensor([1, 2, 3], kp.TensorTypes.host)
    storage = mgr.tensor([5, 6, 7], kp.TensorTypes.storage)
    out = mgr.tensor([0, 0, 0])
    assert storage.tensor_type() == kp.TensorTypes.storage
    mgr.sequence().eval(kp.OpTensorCopy([storage, host])).eval(kp.OpTensorCopy([host, out]))
    mgr.sequence().eval(kp.OpTensorSyncLocal([out]))
    np.testing.assert_array_equal(out.data(), [5, 6, 7])
    with pytest.raises(kp.Error) as error:
        storage.data()
    assert error.value.code == "FAILED_PRECONDITION"
    assert "storage" in repr(storage)


def test_two_threads_evaluating_at_once(mgr):
    spirv = kp.compile_source(SCALE)
    results = {}

    def work(name, factor):
        t = mgr.tensor(np.full(256, 1, dtype=np.float32))
        algo = mgr.algorithm([t], spirv, push_consts=[factor])
        sq = mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)) \
            .record(kp.OpTensorSyncLocal([t]))
        for _ in range(20):
            sq.eval()
        results[name] = t.data().copy()

    threads = [threading.Thread(target=work, args=(n, f)) for n, f in (("a", 1), ("b", 2))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    np.testing.assert_array_equal(results["a"], np.ones(256))
    np.testing.assert_array_equal(results["b"], np.full(256, 2.0 ** 20))


# ------------------------------------------------------------------------------------------------
# The GIL

def counted_while(call):
    """How far a Python thread counted while `call` ran on this thread. The counter sleeps between
    counts, so it takes the GIL only when it is free, and the switch interval is longer than
    `call` holds the GIL at most, so this thread never has to hand it over: the counter counts only
    while `call` lets go of the GIL."""
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.0005)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        before = count[0]
        call()
        return count[0] - before
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)


def test_gil_is_released_while_waiting(mgr):
    out = mgr.tensor([0])
    algo = mgr.algorithm([out], kp.compile_source(SLOW), SLOW_WORKGROUPS, [SLOW_LOOPS])
    sq = mgr.sequence()
    # The measure itself: a call that holds the GIL throughout (a regular expression that
    # backtracks for a tenth of a second) lets nothing count.
    assert counted_while(lambda: re.match(r"(a*)*b", "a" * 20)) == 0
    sq.eval_async(kp.OpAlgoDispatch(algo))
    assert counted_while(sq.eval_await) > 0
    assert counted_while(lambda: sq.eval(kp.OpAlgoDispatch(algo))) > 0


# ------------------------------------------------------------------------------------------------
# compile_source and errors

def test_compile_source_returns_spirv(backend):
    spirv = kp.compile_source(SCALE)
    assert len(spirv) % 4 == 0
    assert np.frombuffer(spirv, dtype=np.uint32)[0] == SPIRV_MAGIC


def test_compile_error_is_invalid_argument_with_the_compilers_message(backend):
    with pytest.raises(kp.Error) as error:
        kp.compile_source("#version 450\nvoid main() { undeclared_name = 1; }\n")
    assert isinstance(error.value, RuntimeError)
    assert error.value.code == "INVALID_ARGUMENT"
    assert "undeclared_name" in str(error.value)


def test_remote_compile_goes_to_the_daemon(monkeypatch):
    monkeypatch.setenv("KOMPUTED_ADDRESS", "127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("KOMPUTED_RPC_TIMEOUT_S", "5")
    with pytest.raises(kp.Error) as error:
        kp.compile_source(SCALE)
    assert error.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def test_errors_carry_their_codes(mgr):
    a = mgr.tensor([1, 2, 3])
    b = mgr.tensor([1, 2])
    with pytest.raises(kp.Error) as error:
        mgr.sequence().eval(kp.OpTensorCopy([a, b]))
    assert error.value.code == "INVALID_ARGUMENT"

    algo = mgr.algorithm([a], kp.compile_source(SCALE), push_consts=[1])
    with pytest.raises(kp.Error) as error:
        mgr.sequence().eval(kp.OpAlgoDispatch(algo, [1, 2, 3]))
    assert error.value.code == "INVALID_ARGUMENT"

    with pytest.raises(kp.Error) as error:
        mgr.tensor([])
    assert error.value.code == "INVALID_ARGUMENT"

    a.destroy()
    assert not a.is_init()
    with pytest.raises(kp.Error) as error:
        a.data()
    assert error.value.code == "FAILED_PRECONDITION"

    with pytest.raises(kp.Error) as error:
        mgr.sequence(5)
    assert error.value.code in ("INVALID_ARGUMENT", "OUT_OF_RANGE")


def test_bad_arguments_are_python_errors(mgr):
    t = mgr.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="32-bit words"):
        mgr.algorithm([t], b"\x03\x02\x23")
    with pytest.raises(TypeError, match="spirv"):
        mgr.algorithm([t], "not spirv")
    with pytest.raises(ValueError, match="at most 3"):
        mgr.algorithm([t], kp.compile_source(SCALE), (1, 1, 1, 1))
    with pytest.raises(kp.Error) as error:
        mgr.algorithm([t], b"\x00" * 16)
    assert error.value.code == "INVALID_ARGUMENT"
    with pytest.raises(TypeError, match="int64"):
        mgr.algorithm([t], kp.compile_source(SCALE), None, np.array([1], dtype=np.int64))
    with pytest.raises(TypeError):
        mgr.sequence().record("not an op")
    # Any bytes-like SPIR-V will do.
    assert mgr.algorithm([t], bytearray(kp.compile_source(SCALE)), push_consts=[1]).is_init()


def test_a_destroyed_manager_refuses_work(backend):
    mgr = kp.Manager()
    mgr.destroy()
    with pytest.raises(kp.Error) as error:
        mgr.tensor([1])
    assert error.value.code == "FAILED_PRECONDITION"


# ------------------------------------------------------------------------------------------------
# The examples

def run_python(path_or_code, backend_env, code=False):
    env = dict(os.environ)
    env.update(backend_env)
    args = [sys.executable, "-c", path_or_code] if code else [sys.executable, path_or_code]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def backend_env(backend):
    address = os.environ.get("KOMPUTED_ADDRESS")
    return {"KOMPUTED_ADDRESS": address or ""}


def test_array_multiplication_example(backend_env):
    out = run_python(os.path.join(REPO, "client", "examples", "python", "array_multiplication.py"),
                     backend_env)
    assert out.split("\n")[:2] == ["[ 4  8 12]", "[10 10 10]"]


def test_logistic_regression_example(backend_env):
    out = run_python(os.path.join(REPO, "client", "examples", "python", "logistic_regression.py"),
                     backend_env)
    assert "predictions: [0 0 0 1 1]" in out, out


SEED = os.environ.get("KOMPUTED_SEED_FILE",
                      os.path.join(REPO, "..", "shared", "seed", "000_692e756cbc6ad09e.txt"))


def test_the_kompute_readme_python_example_runs_unchanged(backend_env):
    if not os.path.exists(SEED):
        pytest.skip(f"the Kompute README ({SEED}) is not here")
    text = open(SEED, encoding="utf-8").read()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "from .utils import compile_source" in block
    # Its one relative import becomes the module's; the imports it assumes come first.
    program = "import kp\nimport numpy as np\n" + block.replace(
        "from .utils import compile_source", "from kp import compile_source")
    out = run_python(program, backend_env, code=True)
    assert out.split("\n")[:2] == ["[ 4  8 12]", "[10 10 10]"]


def test_the_python_section_of_the_readme(backend_env):
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("\n## Python\n"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = run_python(block, backend_env, code=True)
    assert out.strip() == "[7 8 9]"
