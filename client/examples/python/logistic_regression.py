"""Logistic regression trained on the GPU with komputed's kp module: a shader computes, for every
sample, the prediction sigmoid(w . x + b), the gradients of the cross-entropy loss with respect to
w and b, and the loss; the host averages the gradients and updates w and b in the tensors' numpy
views, which the next evaluation carries to the device.

In-process by default; with KOMPUTED_ADDRESS=host:port on that komputed daemon:

    PYTHONPATH=build/python /usr/bin/python3 client/examples/python/logistic_regression.py
"""

import numpy as np

import kp

SHADER = """
#version 450

layout(local_size_x = 1) in;

layout(set = 0, binding = 0) buffer BufX1 { float x1[]; };
layout(set = 0, binding = 1) buffer BufX2 { float x2[]; };
layout(set = 0, binding = 2) buffer BufY { float y[]; };
layout(set = 0, binding = 3) buffer BufW { float w[]; };      // the two weights
layout(set = 0, binding = 4) buffer BufB { float b[]; };      // the bias
layout(set = 0, binding = 5) buffer BufDW1 { float dw1[]; };  // per-sample gradients
layout(set = 0, binding = 6) buffer BufDW2 { float dw2[]; };
layout(set = 0, binding = 7) buffer BufDB { float db[]; };
layout(set = 0, binding = 8) buffer BufLoss { float loss[]; };

float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }

void main() {
    uint i = gl_GlobalInvocationID.x;
    float p = sigmoid(w[0] * x1[i] + w[1] * x2[i] + b[0]);
    float error = p - y[i];
    dw1[i] = error * x1[i];
    dw2[i] = error * x2[i];
    db[i] = error;
    float q = clamp(p, 1e-7, 1.0 - 1e-7);
    loss[i] = -(y[i] * log(q) + (1.0 - y[i]) * log(1.0 - q));
}
"""

ITERATIONS = 200
LEARNING_RATE = 0.5


def main():
    mgr = kp.Manager()

    x1 = np.array([0, 1, 1, 1, 1], dtype=np.float32)
    x2 = np.array([0, 0, 0, 1, 1], dtype=np.float32)
    y = np.array([0, 0, 0, 1, 1], dtype=np.float32)
    n = len(y)

    t_x1, t_x2, t_y = mgr.tensor(x1), mgr.tensor(x2), mgr.tensor(y)
    t_w = mgr.tensor([0.001, 0.001])
    t_b = mgr.tensor([0])
    t_dw1, t_dw2, t_db, t_loss = (mgr.tensor(np.zeros(n, dtype=np.float32)) for _ in range(4))
    params = [t_x1, t_x2, t_y, t_w, t_b, t_dw1, t_dw2, t_db, t_loss]

    algo = mgr.algorithm(params, kp.compile_source(SHADER), (n, 1, 1))

    mgr.sequence().eval(kp.OpTensorSyncDevice(params))

    # Recorded once, evaluated every iteration: the weights go up, the gradients come back.
    step = (mgr.sequence()
            .record(kp.OpTensorSyncDevice([t_w, t_b]))
            .record(kp.OpAlgoDispatch(algo))
            .record(kp.OpTensorSyncLocal([t_dw1, t_dw2, t_db, t_loss])))

    w, b = t_w.data(), t_b.data()  # views: updates here reach the device at the next sync
    for iteration in range(ITERATIONS):
        step.eval()
        w[0] -= LEARNING_RATE * t_dw1.data().mean()
        w[1] -= LEARNING_RATE * t_dw2.data().mean()
        b[0] -= LEARNING_RATE * t_db.data().mean()
        if iteration % 50 == 0:
            print(f"iteration {iteration}: loss {t_loss.data().mean():.4f}")

    print(f"weights: {w}, bias: {b[0]:.4f}, loss: {t_loss.data().mean():.4f}")
    predictions = (1 / (1 + np.exp(-(w[0] * x1 + w[1] * x2 + b[0]))) > 0.5).astype(np.int32)
    print(f"predictions: {predictions}")
    mgr.destroy()


if __name__ == "__main__":
    main()
