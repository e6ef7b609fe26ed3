"""komputed's Kompute API for Python.

Kompute 0.9's Python API (Manager, Tensor, Algorithm, Sequence and the Op* operations) over
komputed's kp library: in-process on a local Vulkan device, or on the komputed daemon that the
environment variable KOMPUTED_ADDRESS names (with KOMPUTED_TOKEN and the KOMPUTED_TLS_*
settings as in the C++ library).
"""

from ._kp import (
    Algorithm,
    DataTypes,
    Error,
    Manager,
    OpAlgoDispatch,
    OpBase,
    OpMemoryBarrier,
    OpMult,
    OpTensorCopy,
    OpTensorSyncDevice,
    OpTensorSyncLocal,
    Sequence,
    Tensor,
    TensorTypes,
    compile_source,
)

# Later Kompute names.
OpSyncDevice = OpTensorSyncDevice
OpSyncLocal = OpTensorSyncLocal
OpCopy = OpTensorCopy

__all__ = [
    "Algorithm",
    "DataTypes",
    "Error",
    "Manager",
    "OpAlgoDispatch",
    "OpBase",
    "OpCopy",
    "OpMemoryBarrier",
    "OpMult",
    "OpSyncDevice",
    "OpSyncLocal",
    "OpTensorCopy",
    "OpTensorSyncDevice",
    "OpTensorSyncLocal",
    "Sequence",
    "Tensor",
    "TensorTypes",
    "compile_source",
]
