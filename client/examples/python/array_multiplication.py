"""The Python example of Kompute's README on komputed: multiplies two arrays on the GPU, with push
and specialization constants, and prints [ 4  8 12] and [10 10 10].

In-process by default; with KOMPUTED_ADDRESS=host:port it runs on that komputed daemon (which
also compiles the shader, so this machine needs no Vulkan SDK):

    PYTHONPATH=build/python /usr/bin/python3 client/examples/python/array_multiplication.py
"""

import numpy as np

import kp
from kp import compile_source


def kompute(shader):
    # 1. A Manager on device 0 (or the daemon that KOMPUTED_ADDRESS names).
    mgr = kp.Manager()

    # 2. Tensors: float32 by default; tensor_t takes a numpy array of any supported dtype.
    tensor_in_a = mgr.tensor([2, 2, 2])
    tensor_in_b = mgr.tensor([1, 2, 3])
    tensor_out_a = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))
    tensor_out_b = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))

    params = [tensor_in_a, tensor_in_b, tensor_out_a, tensor_out_b]

    # 3. The algorithm: three workgroups, one specialization constant, one push constant.
    workgroup = (3, 1, 1)
    spec_consts = [2]
    push_consts_a = [2]
    push_consts_b = [3]

    spirv = compile_source(shader)

    algo = mgr.algorithm(params, spirv, workgroup, spec_consts, push_consts_a)

    # 4. Run synchronously: record, evaluate, record again (new push constants), evaluate.
    (mgr.sequence()
        .record(kp.OpTensorSyncDevice(params))
        .record(kp.OpAlgoDispatch(algo))
        .eval()
        .record(kp.OpAlgoDispatch(algo, push_consts_b))
        .eval())

    # 5. Bring the results back asynchronously.
    sq = mgr.sequence()
    sq.eval_async(kp.OpTensorSyncLocal(params))

    # ... other work here while the GPU finishes ...

    sq.eval_await()

    print(tensor_out_a)  # [ 4  8 12]
    print(tensor_out_b)  # [10 10 10]


if __name__ == "__main__":
    shader = """
        #version 450

        layout (local_size_x = 1) in;

        // Binding i is the i-th tensor of the algorithm's parameters.
        layout(set = 0, binding = 0) buffer buf_in_a { float in_a[]; };
        layout(set = 0, binding = 1) buffer buf_in_b { float in_b[]; };
        layout(set = 0, binding = 2) buffer buf_out_a { uint out_a[]; };
        layout(set = 0, binding = 3) buffer buf_out_b { uint out_b[]; };

        // Push constants, replaceable at each dispatch.
        layout(push_constant) uniform PushConstants {
            float val;
        } push_const;

        // A specialization constant, fixed when the algorithm is built.
        layout(constant_id = 0) const float const_one = 0;

        void main() {
            uint index = gl_GlobalInvocationID.x;
            out_a[index] += uint( in_a[index] * in_b[index] );
            out_b[index] += uint( const_one * push_const.val );
        }
    """

    kompute(shader)
