// The Python module `kp` (imported as kp._kp and re-exported by kp/__init__.py): Kompute 0.9's
// Python API over komputed's kp C++ library, so Python gets the library's behaviour, errors and
// both backends (in-process, or remote when KOMPUTED_ADDRESS is set).
//
// Host data: Tensor.data() is a numpy array over the tensor's host copy (no copy); the array keeps
// that memory alive through its base, even past Tensor.destroy() or the Manager's end.
// The GIL is released around every call that may wait on the device or the network.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kompute/Kompute.hpp"

namespace py = pybind11;

namespace {

using DataTypes = kp::Memory::DataTypes;
using TensorTypes = kp::Memory::MemoryTypes;
using TensorList = std::vector<std::shared_ptr<kp::Tensor>>;

// ------------------------------------------------------------------------------------------------
// Errors

const char* CodeName(kp::ErrorCode code) {
  switch (code) {
    case kp::ErrorCode::kOk:
      return "OK";
    case kp::ErrorCode::kCancelled:
      return "CANCELLED";
    case kp::ErrorCode::kUnknown:
      return "UNKNOWN";
    case kp::ErrorCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case kp::ErrorCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case kp::ErrorCode::kNotFound:
      return "NOT_FOUND";
    case kp::ErrorCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case kp::ErrorCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case kp::ErrorCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case kp::ErrorCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case kp::ErrorCode::kAborted:
      return "ABORTED";
    case kp::ErrorCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case kp::ErrorCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case kp::ErrorCode::kInternal:
      return "INTERNAL";
    case kp::ErrorCode::kUnavailable:
      return "UNAVAILABLE";
    case kp::ErrorCode::kDataLoss:
      return "DATA_LOSS";
    case kp::ErrorCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

// kp.Error, a RuntimeError; created at import, alive as long as the module.
PyObject* g_error_type = nullptr;

// Raises kp.Error(message) with .code set.
void RaiseError(kp::ErrorCode code, const char* message) {
  py::object error = py::reinterpret_borrow<py::object>(g_error_type)(message);
  error.attr("code") = CodeName(code);
  PyErr_SetObject(g_error_type, error.ptr());
}

[[noreturn]] void ThrowError(kp::ErrorCode code, const std::string& message) {
  throw kp::Error(code, message);
}

// ------------------------------------------------------------------------------------------------
// Element types and numpy dtypes

struct ElementInfo {
  DataTypes type;
  const char* dtype;  // numpy's name
  uint32_t size;
};

constexpr ElementInfo kElements[] = {
    {DataTypes::eFloat, "float32", 4},
    {DataTypes::eDouble, "float64", 8},
    {DataTypes::eInt, "int32", 4},
    {DataTypes::eUnsignedInt, "uint32", 4},
    {DataTypes::eBool, "bool", 1},
    {DataTypes::eShort, "int16", 2},
    {DataTypes::eUnsignedShort, "uint16", 2},
    {DataTypes::eChar, "int8", 1},
    {DataTypes::eUnsignedChar, "uint8", 1},
    {DataTypes::eHalf, "float16", 2},
};

std::string SupportedDtypes() {
  std::string names;
  for (const ElementInfo& e : kElements) {
    if (!names.empty()) names += ", ";
    names += e.dtype;
  }
  return names;
}

const ElementInfo* ElementOf(DataTypes type) {
  for (const ElementInfo& e : kElements) {
    if (e.type == type) return &e;
  }
  return nullptr;
}

const ElementInfo& ElementOf(const py::dtype& dtype, const char* what) {
  for (const ElementInfo& e : kElements) {
    if (dtype.equal(py::dtype(e.dtype))) return e;
  }
  throw py::type_error(std::string(what) + ": numpy dtype " +
                       py::str(static_cast<py::handle>(dtype)).cast<std::string>() +
                       " is not supported; use one of " + SupportedDtypes());
}

// `data` as a C-contiguous one-dimensional numpy array (a copy only where it must be).
py::array Flat(const py::handle& data, const char* what, const py::object& dtype = py::none()) {
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("ascontiguousarray")(data, dtype);
  if (array.ndim() != 1) array = array.attr("ravel")();
  if (array.size() == 0) {
    ThrowError(kp::ErrorCode::kInvalidArgument,
               std::string(what) + ": no data given (a tensor cannot be zero-sized)");
  }
  return array;
}

// Constants (specialization or push): a list is float32 (as Kompute), an array keeps its dtype.
struct ConstantBytes {
  std::vector<uint8_t> bytes;
  uint32_t element_size = 4;
};

ConstantBytes ConstantsOf(const py::handle& values, const char* what) {
  ConstantBytes out;
  if (values.is_none()) return out;
  const bool typed = py::isinstance<py::array>(values);
  py::array array = py::module_::import("numpy").attr("ascontiguousarray")(
      values, typed ? py::object(py::none()) : py::object(py::str("float32")));
  if (array.ndim() > 1) array = array.attr("ravel")();
  if (array.size() == 0) return out;
  const ElementInfo* e = nullptr;
  for (const ElementInfo& candidate : kElements) {
    if ((candidate.size == 4 || candidate.size == 8) &&
        array.dtype().equal(py::dtype(candidate.dtype))) {
      e = &candidate;
    }
  }
  if (e == nullptr) {
    throw py::type_error(std::string(what) + ": numpy dtype " +
                         py::str(static_cast<py::handle>(array.dtype())).cast<std::string>() +
                         " is not supported; use float32, float64, int32 or uint32");
  }
  out.element_size = e->size;
  const auto* p = static_cast<const uint8_t*>(array.data());
  out.bytes.assign(p, p + array.nbytes());
  return out;
}

// SPIR-V as bytes (as Kompute's compile_source returns it) or a sequence of 32-bit words.
std::vector<uint32_t> SpirvOf(const py::handle& spirv) {
  std::vector<uint32_t> words;
  if (py::isinstance<py::bytes>(spirv) || py::isinstance<py::bytearray>(spirv) ||
      py::isinstance<py::memoryview>(spirv)) {
    auto bytes_object = py::reinterpret_steal<py::object>(PyBytes_FromObject(spirv.ptr()));
    if (!bytes_object) throw py::error_already_set();
    const std::string bytes = bytes_object.cast<std::string>();
    if (bytes.size() % 4 != 0) {
      throw py::value_error("algorithm: SPIR-V of " + std::to_string(bytes.size()) +
                            " bytes is not a whole number of 32-bit words");
    }
    words.resize(bytes.size() / 4);
    if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
    return words;
  }
  py::array_t<uint32_t, py::array::c_style | py::array::forcecast> array;
  try {
    array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>::ensure(spirv);
  } catch (const py::error_already_set&) {
  }
  if (!array || array.ndim() != 1) {
    throw py::type_error(
        "algorithm: spirv must be bytes (as compile_source returns) or a list of 32-bit words");
  }
  words.assign(array.data(), array.data() + array.size());
  return words;
}

kp::Workgroup WorkgroupOf(const py::handle& workgroup) {
  kp::Workgroup out{};
  if (workgroup.is_none()) return out;
  std::vector<int64_t> values;
  try {
    values = workgroup.cast<std::vector<int64_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error("algorithm: workgroup must be a sequence of up to 3 integers");
  }
  if (values.size() > 3) {
    throw py::value_error("algorithm: workgroup has " + std::to_string(values.size()) +
                          " dimensions; at most 3");
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] > UINT32_MAX) {
      throw py::value_error("algorithm: workgroup dimension " + std::to_string(i) + " (" +
                            std::to_string(values[i]) + ") is out of range");
    }
    out[i] = static_cast<uint32_t>(values[i]);
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// Tensors

// A numpy array over the tensor's host copy; its base owns the backend tensor, so the memory
// outlives the Python Tensor and its destroy().
py::array DataView(const std::shared_ptr<kp::Tensor>& tensor) {
  std::shared_ptr<kp::internal::BackendTensor> impl = tensor->backendTensor();
  void* host = tensor->rawData();
  if (impl == nullptr) ThrowError(kp::ErrorCode::kFailedPrecondition, "the tensor was destroyed");
  if (host == nullptr) {
    ThrowError(kp::ErrorCode::kFailedPrecondition,
               "a storage tensor has no host data; copy it into a device or host tensor");
  }
  const ElementInfo* e = ElementOf(tensor->dataType());
  py::dtype dtype = e != nullptr ? py::dtype(e->dtype) : py::dtype("uint8");
  const py::ssize_t count =
      static_cast<py::ssize_t>(e != nullptr ? tensor->size() : tensor->memorySize());
  auto* owner = new std::shared_ptr<kp::internal::BackendTensor>(std::move(impl));
  py::capsule base(
      owner, [](void* p) { delete static_cast<std::shared_ptr<kp::internal::BackendTensor>*>(p); });
  return py::array(dtype, {count}, {}, host, base);
}

std::shared_ptr<kp::Tensor> MakeTensor(kp::Manager& mgr, const py::array& array,
                                       const ElementInfo& e, TensorTypes type) {
  void* data = const_cast<void*>(array.data());
  const uint64_t count = static_cast<uint64_t>(array.size());
  py::gil_scoped_release release;  // `array` keeps the data alive meanwhile
  return mgr.tensor(data, count, e.size, e.type, type);
}

std::string TensorRepr(const std::shared_ptr<kp::Tensor>& tensor, bool repr) {
  if (!tensor->isInit()) return repr ? "kp.Tensor(<destroyed>)" : "<destroyed tensor>";
  if (tensor->rawData() == nullptr) {
    return "kp.Tensor(<storage: " + std::to_string(tensor->size()) + " elements>)";
  }
  py::array view = DataView(tensor);
  if (!repr) return py::str(view).cast<std::string>();
  return "kp.Tensor(" + py::repr(view).cast<std::string>() + ")";
}

// ------------------------------------------------------------------------------------------------
// Devices

py::dict PropertiesDict(const vk::PhysicalDeviceProperties& p) {
  py::dict d;
  d["device_name"] = std::string(p.deviceName.data());
  d["device_type"] = vk::to_string(p.deviceType);
  d["api_version"] = p.apiVersion;
  d["driver_version"] = p.driverVersion;
  d["vendor_id"] = p.vendorID;
  d["device_id"] = p.deviceID;
  d["max_work_group_count"] =
      py::make_tuple(p.limits.maxComputeWorkGroupCount[0], p.limits.maxComputeWorkGroupCount[1],
                     p.limits.maxComputeWorkGroupCount[2]);
  d["max_work_group_invocations"] = p.limits.maxComputeWorkGroupInvocations;
  d["max_work_group_size"] =
      py::make_tuple(p.limits.maxComputeWorkGroupSize[0], p.limits.maxComputeWorkGroupSize[1],
                     p.limits.maxComputeWorkGroupSize[2]);
  d["max_push_constants_size"] = p.limits.maxPushConstantsSize;
  d["timestamps_supported"] = static_cast<bool>(p.limits.timestampComputeAndGraphics);
  d["timestamp_period"] = p.limits.timestampPeriod;
  return d;
}

// Destroys a Manager without the GIL: a remote one waits for the daemon to close its session.
struct ManagerDeleter {
  void operator()(kp::Manager* mgr) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete mgr;
    } else {
      delete mgr;
    }
  }
};
using ManagerHolder = std::unique_ptr<kp::Manager, ManagerDeleter>;

using SequencePtr = std::shared_ptr<kp::Sequence>;

}  // namespace

PYBIND11_MODULE(_kp, m) {
  m.doc() =
      "komputed's Kompute API: Manager, Tensor, Algorithm, Sequence and operations, in-process "
      "or on the komputed daemon that KOMPUTED_ADDRESS names.";

  // kp.Error(message).code: the canonical status name ("INVALID_ARGUMENT", ...).
  g_error_type = PyErr_NewExceptionWithDoc(
      "kp.Error",
      "An error of komputed's kp library; .code is its canonical status name "
      "(e.g. 'INVALID_ARGUMENT', 'NOT_FOUND', 'FAILED_PRECONDITION').",
      PyExc_RuntimeError, nullptr);
  py::setattr(py::handle(g_error_type), "code", py::str("UNKNOWN"));
  m.add_object("Error", py::handle(g_error_type));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kp::Error& e) {
      RaiseError(e.code(), e.what());
    } catch (const vk::SystemError& e) {
      RaiseError(kp::ErrorCode::kInternal, e.what());
    }
  });

  py::enum_<TensorTypes>(m, "TensorTypes", "Where a tensor's memory lives.")
      .value("device", TensorTypes::eDevice, "device memory with a host staging copy")
      .value("host", TensorTypes::eHost, "host-visible memory that shaders read directly")
      .value("storage", TensorTypes::eStorage, "device memory only; no host data")
      .value("device_and_host", TensorTypes::eDeviceAndHost,
             "device-local memory that is also host-visible");

  py::enum_<DataTypes>(m, "DataTypes", "A tensor's element type.")
      .value("bool", DataTypes::eBool)
      .value("int", DataTypes::eInt)
      .value("uint", DataTypes::eUnsignedInt)
      .value("float", DataTypes::eFloat)
      .value("double", DataTypes::eDouble)
      .value("custom", DataTypes::eCustom)
      .value("short", DataTypes::eShort)
      .value("ushort", DataTypes::eUnsignedShort)
      .value("char", DataTypes::eChar)
      .value("uchar", DataTypes::eUnsignedChar)
      .value("half", DataTypes::eHalf);

  py::class_<kp::Tensor, std::shared_ptr<kp::Tensor>>(
      m, "Tensor", "A typed array on the device with its host copy; made by Manager.tensor_t.")
      .def("data", &DataView,
           "The host copy as a numpy array that views the tensor's memory (no copy): writes reach "
           "the device at the next OpTensorSyncDevice, shader results appear after "
           "OpTensorSyncLocal.")
      .def("size", &kp::Tensor::size, "Element count.")
      .def("__len__", &kp::Tensor::size)
      .def("memory_size", &kp::Tensor::memorySize, "Bytes.")
      .def("data_type", &kp::Tensor::dataType)
      .def("tensor_type", &kp::Tensor::tensorType)
      .def("is_init", &kp::Tensor::isInit)
      .def("destroy", &kp::Tensor::destroy, py::call_guard<py::gil_scoped_release>())
      .def("__repr__", [](const std::shared_ptr<kp::Tensor>& t) { return TensorRepr(t, true); })
      .def("__str__", [](const std::shared_ptr<kp::Tensor>& t) { return TensorRepr(t, false); });

  py::class_<kp::Algorithm, std::shared_ptr<kp::Algorithm>>(
      m, "Algorithm", "A compute shader bound to its tensors; made by Manager.algorithm.")
      .def(
          "rebuild",
          [](kp::Algorithm& algo, const TensorList& tensors, const py::object& spirv,
             const py::object& workgroup, const py::object& spec_consts,
             const py::object& push_consts) {
            std::vector<uint32_t> words = SpirvOf(spirv);
            const kp::Workgroup wg = WorkgroupOf(workgroup);
            ConstantBytes spec = ConstantsOf(spec_consts, "spec_consts");
            ConstantBytes push = ConstantsOf(push_consts, "push_consts");
            py::gil_scoped_release release;
            algo.rebuildRaw(tensors, words, wg, std::move(spec.bytes), spec.element_size,
                            std::move(push.bytes));
          },
          py::arg("tensors"), py::arg("spirv"), py::arg("workgroup") = py::none(),
          py::arg("spec_consts") = py::none(), py::arg("push_consts") = py::none(),
          "Replaces tensors, shader, workgroup and constants; sequences that recorded the "
          "algorithm must rerecord().")
      .def("get_tensors", &kp::Algorithm::getTensors)
      .def("get_workgroup",
           [](const kp::Algorithm& algo) {
             const kp::Workgroup wg = algo.getWorkgroup();
             return py::make_tuple(wg[0], wg[1], wg[2]);
           })
      .def("is_init", &kp::Algorithm::isInit)
      .def("destroy", &kp::Algorithm::destroy, py::call_guard<py::gil_scoped_release>());

  // Operations: descriptions that Sequence.record/eval take.
  py::class_<kp::OpBase, std::shared_ptr<kp::OpBase>>(m, "OpBase", "Base of the operations.");
  py::class_<kp::OpTensorSyncDevice, kp::OpBase, std::shared_ptr<kp::OpTensorSyncDevice>>(
      m, "OpTensorSyncDevice", "Host copy -> device, for device tensors.")
      .def(py::init<const TensorList&>(), py::arg("tensors"));
  py::class_<kp::OpTensorSyncLocal, kp::OpBase, std::shared_ptr<kp::OpTensorSyncLocal>>(
      m, "OpTensorSyncLocal", "Device -> host copy, for device tensors.")
      .def(py::init<const TensorList&>(), py::arg("tensors"));
  py::class_<kp::OpTensorCopy, kp::OpBase, std::shared_ptr<kp::OpTensorCopy>>(
      m, "OpTensorCopy", "tensors[0] -> every other tensor (same type and size).")
      .def(py::init<const TensorList&>(), py::arg("tensors"));
  py::class_<kp::OpAlgoDispatch, kp::OpBase, std::shared_ptr<kp::OpAlgoDispatch>>(
      m, "OpAlgoDispatch",
      "Dispatches an algorithm; push_consts, when given, replace the algorithm's (and stay).")
      .def(py::init([](const std::shared_ptr<kp::Algorithm>& algo, const py::object& push) {
             if (algo == nullptr) throw py::type_error("OpAlgoDispatch: algorithm is None");
             ConstantBytes bytes = ConstantsOf(push, "push_consts");
             return std::make_shared<kp::OpAlgoDispatch>(algo, bytes.bytes);
           }),
           py::arg("algorithm"), py::arg("push_consts") = py::none());
  py::class_<kp::OpMult, kp::OpBase, std::shared_ptr<kp::OpMult>>(
      m, "OpMult", "Element-wise a * b -> c over three tensors, filling in an empty algorithm.")
      .def(py::init<const TensorList&, const std::shared_ptr<kp::Algorithm>&>(), py::arg("tensors"),
           py::arg("algorithm"));
  py::class_<kp::OpMemoryBarrier, kp::OpBase, std::shared_ptr<kp::OpMemoryBarrier>>(
      m, "OpMemoryBarrier",
      "A buffer memory barrier on each tensor; masks are Vulkan's VkAccessFlags and "
      "VkPipelineStageFlags bit values.")
      .def(py::init([](const TensorList& tensors, uint32_t src_access, uint32_t dst_access,
                       uint32_t src_stage, uint32_t dst_stage, bool primary) {
             return std::make_shared<kp::OpMemoryBarrier>(
                 tensors, vk::AccessFlags(src_access), vk::AccessFlags(dst_access),
                 vk::PipelineStageFlags(src_stage), vk::PipelineStageFlags(dst_stage), primary);
           }),
           py::arg("tensors"), py::arg("src_access_mask"), py::arg("dst_access_mask"),
           py::arg("src_stage_mask"), py::arg("dst_stage_mask"),
           py::arg("barrier_on_primary") = true);

  using Release = py::call_guard<py::gil_scoped_release>;
  py::class_<kp::Sequence, SequencePtr>(
      m, "Sequence",
      "Recorded operations on one queue; record() appends, eval() submits and waits. Each call "
      "returns the sequence, so calls chain.")
      .def(
          "record", [](kp::Sequence& s, std::shared_ptr<kp::OpBase> op) { return s.record(op); },
          py::arg("op"), Release())
      .def(
          "eval", [](kp::Sequence& s) { return s.eval(); }, Release())
      .def(
          "eval", [](kp::Sequence& s, std::shared_ptr<kp::OpBase> op) { return s.eval(op); },
          py::arg("op"), Release())
      .def(
          "eval_async", [](kp::Sequence& s) { return s.evalAsync(); }, Release())
      .def(
          "eval_async",
          [](kp::Sequence& s, std::shared_ptr<kp::OpBase> op) { return s.evalAsync(op); },
          py::arg("op"), Release())
      .def(
          "eval_await", [](kp::Sequence& s, uint64_t wait_for) { return s.evalAwait(wait_for); },
          py::arg("wait_for") = UINT64_MAX, Release(),
          "Waits up to wait_for nanoseconds for eval_async (default: the eval timeout); still "
          "running after that, it returns the sequence with is_running() true.")
      .def("clear", &kp::Sequence::clear, Release())
      .def("rerecord", &kp::Sequence::rerecord, Release())
      .def("begin", &kp::Sequence::begin, Release())
      .def("end", &kp::Sequence::end, Release())
      .def("is_running", &kp::Sequence::isRunning)
      .def("is_recording", &kp::Sequence::isRecording)
      .def("is_init", &kp::Sequence::isInit)
      .def("get_timestamps", &kp::Sequence::getTimestamps, Release(),
           "Nanoseconds: one before the first operation and one after each (last eval).")
      .def("destroy", &kp::Sequence::destroy, Release());

  py::class_<kp::Manager, ManagerHolder>(
      m, "Manager",
      "Creates and owns tensors, algorithms and sequences on one device: in-process, or on the "
      "komputed daemon that KOMPUTED_ADDRESS names.")
      .def(py::init([] {
        py::gil_scoped_release release;
        return new kp::Manager();
      }))
      .def(py::init([](uint32_t device, const std::vector<uint32_t>& family_queue_indices,
                       const std::vector<std::string>& desired_extensions) {
             py::gil_scoped_release release;
             return new kp::Manager(device, family_queue_indices, desired_extensions);
           }),
           py::arg("device"), py::arg("family_queue_indices") = std::vector<uint32_t>{},
           py::arg("desired_extensions") = std::vector<std::string>{})
      .def(py::init([](const std::string& address) {
             py::gil_scoped_release release;
             return new kp::Manager(address);
           }),
           py::arg("address"), "Remote, on the komputed daemon at `address` (host:port).")
      .def(
          "tensor",
          [](kp::Manager& mgr, const py::object& data, TensorTypes type) {
            py::array array = Flat(data, "tensor", py::str("float32"));
            return MakeTensor(mgr, array, kElements[0], type);
          },
          py::arg("data"), py::arg("tensor_type") = TensorTypes::eDevice,
          "A float32 tensor from a list or array (converted to float32).")
      .def(
          "tensor_t",
          [](kp::Manager& mgr, const py::object& data, TensorTypes type) {
            py::array array = Flat(data, "tensor_t");
            const ElementInfo& e = ElementOf(array.dtype(), "tensor_t");
            return MakeTensor(mgr, array, e, type);
          },
          py::arg("data"), py::arg("tensor_type") = TensorTypes::eDevice,
          "A tensor of the array's dtype: float32, float64, int32, uint32, bool, int16, uint16, "
          "int8, uint8 or float16.")
      .def(
          "algorithm",
          [](kp::Manager& mgr, const TensorList& tensors, const py::object& spirv,
             const py::object& workgroup, const py::object& spec_consts,
             const py::object& push_consts) {
            std::vector<uint32_t> words =
                spirv.is_none() ? std::vector<uint32_t>{} : SpirvOf(spirv);
            const kp::Workgroup wg = WorkgroupOf(workgroup);
            ConstantBytes spec = ConstantsOf(spec_consts, "spec_consts");
            ConstantBytes push = ConstantsOf(push_consts, "push_consts");
            py::gil_scoped_release release;
            std::shared_ptr<kp::Algorithm> algo = mgr.algorithm();
            if (!tensors.empty() || !words.empty()) {
              algo->rebuildRaw(tensors, words, wg, std::move(spec.bytes), spec.element_size,
                               std::move(push.bytes));
            }
            return algo;
          },
          py::arg("tensors") = TensorList{}, py::arg("spirv") = py::none(),
          py::arg("workgroup") = py::none(), py::arg("spec_consts") = py::none(),
          py::arg("push_consts") = py::none(),
          "An algorithm: binding i = tensors[i]; spirv as bytes or 32-bit words; workgroup = the "
          "number of workgroups (x, y, z); constants as lists (float32) or numpy arrays. With "
          "no arguments, an empty algorithm for OpMult.")
      .def("sequence", &kp::Manager::sequence, py::arg("queue_index") = 0,
           py::arg("total_timestamps") = 0, Release())
      .def("get_device_properties",
           [](const kp::Manager& mgr) {
             vk::PhysicalDeviceProperties p;
             {
               py::gil_scoped_release release;
               p = mgr.getDeviceProperties();
             }
             return PropertiesDict(p);
           })
      .def("list_devices",
           [](const kp::Manager& mgr) {
             kp::DeviceList devices;
             {
               py::gil_scoped_release release;
               devices = mgr.listDevices();
             }
             py::list out;
             for (const kp::PhysicalDevice& d : devices)
               out.append(PropertiesDict(d.getProperties()));
             return out;
           })
      .def("destroy", &kp::Manager::destroy, Release(),
           "Destroys every object made here, then releases the device (closes a remote session).");

  // For the benchmark of Python's overhead (tests/bench/python_bench.py): the same work as a
  // Python loop, done in C++ in this process: `count` times, the bytes of `source` (when given)
  // copied into `tensor`'s host data and `sequence` evaluated. Returns the seconds it took.
  m.def(
      "_eval_loop",
      [](const SequencePtr& sequence, uint64_t count, std::shared_ptr<kp::Tensor> tensor,
         std::optional<py::buffer> source) {
        if (sequence == nullptr) throw py::value_error("_eval_loop: the sequence is None");
        py::buffer_info from;
        if (source.has_value()) {
          if (tensor == nullptr) throw py::value_error("_eval_loop: a source needs a tensor");
          from = source->request();
          if (static_cast<size_t>(from.size * from.itemsize) != tensor->memorySize()) {
            throw py::value_error("_eval_loop: the source's size is not the tensor's");
          }
        }
        py::gil_scoped_release release;
        const auto start = std::chrono::steady_clock::now();
        for (uint64_t i = 0; i < count; ++i) {
          if (source.has_value()) std::memcpy(tensor->rawData(), from.ptr, tensor->memorySize());
          sequence->eval();
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      py::arg("sequence"), py::arg("count"), py::arg("tensor") = nullptr,
      py::arg("source") = std::nullopt);

  m.def(
      "compile_source",
      [](const std::string& source) {
        std::vector<uint32_t> words;
        {
          py::gil_scoped_release release;
          words = kp::compileSource(source);
        }
        return py::bytes(reinterpret_cast<const char*>(words.data()),
                         words.size() * sizeof(uint32_t));
      },
      py::arg("source"),
      "Compiles a GLSL compute shader to SPIR-V (bytes): in-process, or by the daemon that "
      "KOMPUTED_ADDRESS names. Raises kp.Error (INVALID_ARGUMENT) with the compiler's messages.");
}
