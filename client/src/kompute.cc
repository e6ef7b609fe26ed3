// The kp facade: Kompute's classes over a Backend.
#include "kompute/Kompute.hpp"

#include <errno.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/shader.h"
#include "remote/placement.h"
#include "remote/remote_backend.h"

namespace kp {
namespace {

namespace core = komputed::core;
using internal::Backend;
using internal::BackendSequence;
using internal::Op;

[[noreturn]] void Throw(const absl::Status& status) {
  throw Error(static_cast<ErrorCode>(status.code()), std::string(status.message()));
}

void Check(const absl::Status& status) {
  if (!status.ok()) Throw(status);
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Throw(value.status());
  return *std::move(value);
}

core::ElementType ToCore(Memory::DataTypes type) {
  switch (type) {
    case Memory::DataTypes::eBool:
      return core::ElementType::kBool;
    case Memory::DataTypes::eInt:
      return core::ElementType::kInt32;
    case Memory::DataTypes::eUnsignedInt:
      return core::ElementType::kUInt32;
    case Memory::DataTypes::eFloat:
      return core::ElementType::kFloat32;
    case Memory::DataTypes::eDouble:
      return core::ElementType::kFloat64;
    case Memory::DataTypes::eCustom:
      return core::ElementType::kBytes;
    case Memory::DataTypes::eShort:
      return core::ElementType::kInt16;
    case Memory::DataTypes::eUnsignedShort:
      return core::ElementType::kUInt16;
    case Memory::DataTypes::eChar:
      return core::ElementType::kInt8;
    case Memory::DataTypes::eUnsignedChar:
      return core::ElementType::kUInt8;
    case Memory::DataTypes::eHalf:
      return core::ElementType::kFloat16;
  }
  throw Error(ErrorCode::kInvalidArgument,
              absl::StrCat("unknown data type ", static_cast<int>(type)));
}

core::MemoryType ToCore(Memory::MemoryTypes type) {
  switch (type) {
    case Memory::MemoryTypes::eDevice:
      return core::MemoryType::kDevice;
    case Memory::MemoryTypes::eHost:
      return core::MemoryType::kHost;
    case Memory::MemoryTypes::eStorage:
      return core::MemoryType::kStorage;
    case Memory::MemoryTypes::eDeviceAndHost:
      return core::MemoryType::kDeviceAndHost;
  }
  throw Error(ErrorCode::kInvalidArgument,
              absl::StrCat("unknown memory type ", static_cast<int>(type)));
}

// kp's operation kinds are core's, plus kMult (a dispatch of a built-in shader).
static_assert(static_cast<int>(detail::OpKind::kSyncDevice) ==
              static_cast<int>(core::OpKind::kSyncDevice));
static_assert(static_cast<int>(detail::OpKind::kSyncLocal) ==
              static_cast<int>(core::OpKind::kSyncLocal));
static_assert(static_cast<int>(detail::OpKind::kCopy) == static_cast<int>(core::OpKind::kCopy));
static_assert(static_cast<int>(detail::OpKind::kDispatch) ==
              static_cast<int>(core::OpKind::kDispatch));
static_assert(static_cast<int>(detail::OpKind::kBarrier) ==
              static_cast<int>(core::OpKind::kBarrier));
static_assert(static_cast<int>(detail::OpKind::kMult) == static_cast<int>(core::kLastOpKind) + 1);

core::OpKind ToCore(detail::OpKind kind) {
  if (kind == detail::OpKind::kMult) return core::OpKind::kDispatch;
  return static_cast<core::OpKind>(kind);
}

// The bound on every synchronous wait: KOMPUTED_EVAL_TIMEOUT_S seconds, default 600.
absl::Duration EvalTimeout() {
  static const absl::Duration timeout = [] {
    const char* value = std::getenv("KOMPUTED_EVAL_TIMEOUT_S");
    double seconds = value != nullptr ? std::atof(value) : 0;
    return seconds > 0 ? absl::Seconds(seconds) : absl::Seconds(600);
  }();
  return timeout;
}

// How long Manager::destroy() waits for a remote daemon to close the session:
// KOMPUTED_CLOSE_TIMEOUT_S seconds, default 5.
absl::Duration CloseTimeout() {
  static const absl::Duration timeout = [] {
    const char* value = std::getenv("KOMPUTED_CLOSE_TIMEOUT_S");
    double seconds = value != nullptr ? std::atof(value) : 0;
    return seconds > 0 ? absl::Seconds(seconds) : absl::Seconds(5);
  }();
  return timeout;
}

std::shared_ptr<internal::BackendTensor> BackendOf(const std::shared_ptr<Tensor>& tensor,
                                                   size_t index) {
  if (tensor == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, absl::StrCat("tensor ", index, " is null"));
  }
  auto impl = tensor->backendTensor();
  if (impl == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition, absl::StrCat("tensor ", index, " was destroyed"));
  }
  return impl;
}

std::vector<std::shared_ptr<internal::BackendTensor>> BackendOf(
    const std::vector<std::shared_ptr<Tensor>>& tensors) {
  std::vector<std::shared_ptr<internal::BackendTensor>> out;
  out.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) out.push_back(BackendOf(tensors[i], i));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tensor

Tensor::Tensor(std::shared_ptr<internal::BackendTensor> impl, void* host, uint64_t count,
               uint32_t element_size, DataTypes data_type, MemoryTypes memory_type)
    : impl_(std::move(impl)),
      host_(host),
      count_(count),
      element_size_(element_size),
      data_type_(data_type),
      memory_type_(memory_type) {}

Tensor::~Tensor() = default;

size_t Tensor::size() const { return count_; }

bool Tensor::isInit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr;
}

void Tensor::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  impl_.reset();
  host_ = nullptr;
}

void* Tensor::rawData() {
  std::lock_guard<std::mutex> lock(mu_);
  return host_;
}

void* Tensor::hostOrThrow() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) throw Error(ErrorCode::kFailedPrecondition, "the tensor was destroyed");
  if (host_ == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                "a storage tensor has no host data; copy it into a device or host tensor");
  }
  return host_;
}

void Tensor::setRawData(const void* data) { std::memcpy(hostOrThrow(), data, memorySize()); }

std::shared_ptr<internal::BackendTensor> Tensor::backendTensor() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_;
}

// ---------------------------------------------------------------------------------------------
// Algorithm

Algorithm::Algorithm(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {}
Algorithm::~Algorithm() = default;

void Algorithm::rebuildRaw(const std::vector<std::shared_ptr<Tensor>>& tensors,
                           const std::vector<uint32_t>& spirv, const Workgroup& workgroup,
                           std::vector<uint8_t> spec, uint32_t spec_size,
                           std::vector<uint8_t> push) {
  internal::AlgorithmSpec s;
  s.tensors = BackendOf(tensors);
  s.spirv = spirv;
  Workgroup wg = workgroup;
  if (wg[0] == 0) {
    if (tensors.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "workgroup x = 0 means \"the first tensor's size\", but there are no tensors");
    }
    if (tensors[0]->size() > UINT32_MAX) {
      throw Error(ErrorCode::kInvalidArgument,
                  absl::StrCat("tensor 0 has ", tensors[0]->size(),
                               " elements, too many for a default workgroup; give one"));
    }
    wg[0] = static_cast<uint32_t>(tensors[0]->size());
  }
  if (wg[1] == 0) wg[1] = 1;
  if (wg[2] == 0) wg[2] = 1;
  s.workgroup = {wg[0], wg[1], wg[2]};
  s.spec_constants = spec;
  s.spec_constant_size = spec_size;
  s.push_constants = std::move(push);

  std::lock_guard<std::mutex> lock(mu_);
  if (destroyed_ || backend_ == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition, "the algorithm was destroyed");
  }
  if (impl_ == nullptr) {
    impl_ = Check(backend_->CreateAlgorithm(s));
  } else {
    Check(backend_->RebuildAlgorithm(*impl_, s));
  }
  tensors_ = tensors;
  workgroup_ = wg;
  spec_ = std::move(spec);
  spec_size_ = spec_size;
}

void Algorithm::setPushConstantBytes(std::vector<uint8_t> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                "setPushConstants: the algorithm is not initialised");
  }
  Check(backend_->SetPushConstants(*impl_, std::move(bytes)));
}

std::vector<uint8_t> Algorithm::pushConstantBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr ? impl_->PushConstants() : std::vector<uint8_t>();
}

std::vector<uint8_t> Algorithm::specConstantBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_;
}

Workgroup Algorithm::getWorkgroup() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workgroup_;
}

std::vector<std::shared_ptr<Tensor>> Algorithm::getTensors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_;
}

std::vector<std::shared_ptr<Memory>> Algorithm::getMemObjects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<std::shared_ptr<Memory>>(tensors_.begin(), tensors_.end());
}

std::vector<std::shared_ptr<Tensor>> detail::AsTensors(
    const std::vector<std::shared_ptr<Memory>>& memory) {
  std::vector<std::shared_ptr<Tensor>> tensors;
  tensors.reserve(memory.size());
  for (size_t i = 0; i < memory.size(); ++i) {
    std::shared_ptr<Tensor> t = std::dynamic_pointer_cast<Tensor>(memory[i]);
    if (memory[i] != nullptr && t == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "memory object " + std::to_string(i) +
                      " is neither a kp::Tensor nor a kp::Image made by a kp::Manager");
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

bool Algorithm::isInit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr;
}

void Algorithm::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  impl_.reset();
  backend_.reset();
  tensors_.clear();
  destroyed_ = true;
}

std::shared_ptr<internal::BackendAlgorithm> Algorithm::backendAlgorithm() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_;
}

// ---------------------------------------------------------------------------------------------
// Sequence

Sequence::Sequence(std::shared_ptr<BackendSequence> impl) : impl_(std::move(impl)) {}

Sequence::~Sequence() = default;

BackendSequence& Sequence::implOrThrow() const {
  if (impl_ == nullptr) throw Error(ErrorCode::kFailedPrecondition, "the sequence was destroyed");
  return *impl_;
}

void Sequence::recordLocked(const OpBase& op) {
  BackendSequence& seq = implOrThrow();
  Op desc;
  desc.kind = ToCore(op.kind());
  switch (op.kind()) {
    case detail::OpKind::kSyncDevice:
    case detail::OpKind::kSyncLocal:
    case detail::OpKind::kCopy:
      desc.tensors = BackendOf(op.tensors());
      break;
    case detail::OpKind::kBarrier: {
      desc.tensors = BackendOf(op.tensors());
      const OpBase::Barrier& b = op.barrier();
      desc.barrier = {b.src_access, b.dst_access, b.src_stage, b.dst_stage, b.primary};
      break;
    }
    case detail::OpKind::kDispatch: {
      if (op.algorithm() == nullptr) {
        throw Error(ErrorCode::kInvalidArgument, "OpAlgoDispatch: null algorithm");
      }
      desc.algorithm = op.algorithm()->backendAlgorithm();
      if (desc.algorithm == nullptr) {
        throw Error(ErrorCode::kFailedPrecondition,
                    "OpAlgoDispatch: the algorithm is not initialised (or was destroyed)");
      }
      desc.push_constants = op.pushConstants();
      break;
    }
    case detail::OpKind::kMult: {
      const auto& tensors = op.tensors();
      if (tensors.size() != 3) {
        throw Error(
            ErrorCode::kInvalidArgument,
            absl::StrCat("OpMult needs exactly 3 tensors (a, b, out), got ", tensors.size()));
      }
      BackendOf(tensors);
      for (size_t i = 1; i < 3; ++i) {
        if (tensors[i]->dataType() != tensors[0]->dataType() ||
            tensors[i]->size() != tensors[0]->size()) {
          throw Error(ErrorCode::kInvalidArgument,
                      absl::StrCat("OpMult: tensor ", i, " differs from tensor 0 in type or size"));
        }
      }
      if (op.algorithm() == nullptr) {
        throw Error(ErrorCode::kInvalidArgument, "OpMult: null algorithm");
      }
      const core::ElementType type = ToCore(tensors[0]->dataType());
      auto spirv = Check(core::MultiplyShader(type));
      const std::array<uint32_t, 3> workgroup = Check(core::MultiplyWorkgroup(tensors[0]->size()));
      try {
        op.algorithm()->rebuildRaw(tensors, std::vector<uint32_t>(spirv.begin(), spirv.end()),
                                   workgroup, {}, 4, {});
      } catch (const Error& e) {
        // The built-in shader refused for a feature that the device lacks, say: the caller wrote
        // no shader, so say whose it is.
        throw Error(e.code(), absl::StrCat("OpMult of ", core::ElementTypeName(type),
                                           " tensors: ", e.what()));
      }
      desc.algorithm = op.algorithm()->backendAlgorithm();
      break;
    }
  }
  // The backend applies a dispatch's override to the algorithm (op_semantics.h).
  Check(seq.Record(desc));
}

std::shared_ptr<Sequence> Sequence::record(std::shared_ptr<OpBase> op) {
  if (op == nullptr) throw Error(ErrorCode::kInvalidArgument, "record: null operation");
  std::lock_guard<std::mutex> lock(mu_);
  recordLocked(*op);
  return shared_from_this();
}

std::shared_ptr<Sequence> Sequence::eval() {
  std::lock_guard<std::mutex> lock(mu_);
  Check(implOrThrow().Eval(EvalTimeout()));
  return shared_from_this();
}

std::shared_ptr<Sequence> Sequence::eval(std::shared_ptr<OpBase> op) {
  if (op == nullptr) throw Error(ErrorCode::kInvalidArgument, "eval: null operation");
  {
    std::lock_guard<std::mutex> lock(mu_);
    Check(implOrThrow().Clear());
    recordLocked(*op);
  }
  return eval();
}

std::shared_ptr<Sequence> Sequence::evalAsync() {
  std::lock_guard<std::mutex> lock(mu_);
  Check(implOrThrow().Submit());
  return shared_from_this();
}

std::shared_ptr<Sequence> Sequence::evalAsync(std::shared_ptr<OpBase> op) {
  if (op == nullptr) throw Error(ErrorCode::kInvalidArgument, "evalAsync: null operation");
  {
    std::lock_guard<std::mutex> lock(mu_);
    Check(implOrThrow().Clear());
    recordLocked(*op);
  }
  return evalAsync();
}

std::shared_ptr<Sequence> Sequence::evalAwait(uint64_t waitFor) {
  if (evalAwaitFor(waitFor)) return shared_from_this();
  if (waitFor == UINT64_MAX) {
    // Waiting "forever" ran into komputed's own bound: the caller's results are not there.
    throw Error(ErrorCode::kDeadlineExceeded,
                absl::StrCat("evalAwait: the sequence is still running after ",
                             absl::FormatDuration(EvalTimeout()),
                             " (KOMPUTED_EVAL_TIMEOUT_S); evalAwait again to finish it"));
  }
  spdlog::warn("evalAwait: the sequence is still running after {} ns; evalAwait again to finish it",
               waitFor);
  return shared_from_this();
}

bool Sequence::evalAwaitFor(uint64_t waitFor) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Duration timeout =
      waitFor == UINT64_MAX
          ? EvalTimeout()
          : absl::Nanoseconds(static_cast<int64_t>(std::min<uint64_t>(waitFor, INT64_MAX)));
  BackendSequence& impl = implOrThrow();
  absl::Status s = impl.Wait(timeout);
  // Still running: the wait timed out. A sequence that has ended with DEADLINE_EXCEEDED (one that
  // komputed's kernel watchdog stopped) failed, and says so.
  if (absl::IsDeadlineExceeded(s) && impl.IsRunning()) return false;
  Check(s);
  return true;
}

void Sequence::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  Check(implOrThrow().Clear());
}

void Sequence::begin() {
  std::lock_guard<std::mutex> lock(mu_);
  if (implOrThrow().IsRunning()) {
    throw Error(ErrorCode::kFailedPrecondition,
                "begin: the sequence is running; evalAwait it first");
  }
}

void Sequence::end() {
  std::lock_guard<std::mutex> lock(mu_);
  Check(implOrThrow().End());
}

bool Sequence::isRecording() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr && impl_->IsRecording();
}

bool Sequence::isRunning() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr && impl_->IsRunning();
}

bool Sequence::isInit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return impl_ != nullptr;
}

void Sequence::rerecord() {
  std::lock_guard<std::mutex> lock(mu_);
  Check(implOrThrow().Rerecord());
}

std::vector<std::uint64_t> Sequence::getTimestamps() {
  std::lock_guard<std::mutex> lock(mu_);
  return implOrThrow().Timestamps();
}

void Sequence::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  if (impl_ == nullptr) return;
  // Kompute's destroy waits for the submission; a failure or timeout here only drops its results.
  if (impl_->IsRunning()) impl_->Wait(EvalTimeout()).IgnoreError();
  impl_.reset();
}

// ---------------------------------------------------------------------------------------------
// Manager

namespace {

// `device_daemon`: the daemon that KOMPUTED_DEVICE=HOST:PORT/N names (empty: any).
std::shared_ptr<Backend> MakeRemote(const Remote& given, const std::string& address_origin = "",
                                    const std::string& device_daemon = "") {
  internal::RemoteOptions remote;
  remote.address = given.address;
  remote.address_origin = address_origin;
  remote.device_index = given.deviceIndex;
  remote.device_daemon = device_daemon;
  if (!given.select.empty()) {
    remote.select = given.select;
    remote.select_origin = "kp::Remote::select";
  } else if (const char* select = std::getenv("KOMPUTED_SELECT"); select != nullptr) {
    remote.select = select;
    remote.select_origin = "KOMPUTED_SELECT";
  }
  remote.queue_families = given.familyQueueIndices;
  remote.client_name = program_invocation_short_name;
  remote.credentials.token = {given.token, "kp::Remote::token"};
  remote.credentials.tls_ca = {given.tlsCa, "kp::Remote::tlsCa"};
  remote.credentials.tls_cert = {given.tlsCert, "kp::Remote::tlsCert"};
  remote.credentials.tls_key = {given.tlsKey, "kp::Remote::tlsKey"};
  return Check(internal::CreateRemoteBackend(remote));
}

// $KOMPUTED_ADDRESS, or nullptr when it is unset or empty.
const char* AddressVariable() {
  const char* address = std::getenv("KOMPUTED_ADDRESS");
  return address != nullptr && address[0] != '\0' ? address : nullptr;
}

// In-process, where KOMPUTED_SELECT has nothing to choose among.
std::shared_ptr<Backend> MakeInProcess(const core::DeviceOptions& options) {
  if (const char* select = std::getenv("KOMPUTED_SELECT"); select != nullptr && select[0] != '\0') {
    throw Error(ErrorCode::kInvalidArgument,
                absl::StrCat("KOMPUTED_SELECT ('", select,
                             "') chooses among remote daemons, but KOMPUTED_ADDRESS is not set"));
  }
  return Check(internal::CreateInProcessBackend(options));
}

// Remote when KOMPUTED_ADDRESS names a daemon (device extensions are the daemon's then),
// in-process otherwise.
std::shared_ptr<Backend> MakeBackend(const core::DeviceOptions& options) {
  if (const char* address = AddressVariable(); address != nullptr) {
    Remote remote;
    remote.address = address;
    remote.deviceIndex = options.physical_device_index.value_or(0);
    remote.familyQueueIndices = options.queue_families;
    return MakeRemote(remote, "KOMPUTED_ADDRESS");
  }
  return MakeInProcess(options);
}

// The backend of Manager(): KOMPUTED_DEVICE when set (N: the daemon's device index when remote,
// the physical device index in-process; HOST:PORT/N: device N of that daemon, remote only);
// unset, core's choice in-process and placement's remote (remote/placement.h).
std::shared_ptr<Backend> MakeDefaultBackend() {
  std::optional<internal::remote::DeviceChoice> choice;
  if (const char* value = std::getenv("KOMPUTED_DEVICE"); value != nullptr && value[0] != '\0') {
    choice = Check(internal::remote::ParseDeviceChoice(value, "KOMPUTED_DEVICE"));
  }
  if (const char* address = AddressVariable(); address != nullptr) {
    Remote remote;
    remote.address = address;
    if (choice.has_value()) remote.deviceIndex = choice->index;
    return MakeRemote(remote, "KOMPUTED_ADDRESS", choice.has_value() ? choice->daemon : "");
  }
  core::DeviceOptions options;
  if (choice.has_value()) {
    if (!choice->daemon.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  absl::StrCat("KOMPUTED_DEVICE: '", std::getenv("KOMPUTED_DEVICE"),
                               "' names a daemon, but KOMPUTED_ADDRESS is not set"));
    }
    options.physical_device_index = choice->index;
  }
  return MakeInProcess(options);
}

}  // namespace

Manager::Manager() : backend_(MakeDefaultBackend()) {}

Manager::Manager(uint32_t physicalDeviceIndex, const std::vector<uint32_t>& familyQueueIndices,
                 const std::vector<std::string>& desiredExtensions) {
  core::DeviceOptions options;
  options.physical_device_index = physicalDeviceIndex;
  options.queue_families = familyQueueIndices;
  options.extensions = desiredExtensions;
  backend_ = MakeBackend(options);
}

Manager::Manager(const std::string& address) : backend_(MakeRemote(Remote{address})) {}

Manager::Manager(const Remote& remote) : backend_(MakeRemote(remote)) {}

Manager::~Manager() { destroy(); }

Backend& Manager::backendOrThrow() const {
  if (backend_ == nullptr) throw Error(ErrorCode::kFailedPrecondition, "the Manager was destroyed");
  return *backend_;
}

const std::shared_ptr<Backend>& Manager::backend() const { return backend_; }

std::shared_ptr<Sequence> Manager::sequence(uint32_t queueIndex, uint32_t totalTimestamps) {
  std::lock_guard<std::mutex> lock(mu_);
  auto impl = Check(backendOrThrow().CreateSequence(queueIndex, totalTimestamps));
  std::shared_ptr<Sequence> s(new Sequence(std::move(impl)));
  sequences_.push_back(s);
  return s;
}

std::pair<std::shared_ptr<internal::BackendTensor>, void*> Manager::createTensor(
    const void* data, uint64_t count, uint32_t element_size, Tensor::TensorDataTypes data_type,
    Tensor::TensorTypes memory_type, uint32_t width, uint32_t height, uint32_t channels) {
  internal::TensorSpec spec;
  spec.type = ToCore(data_type);
  spec.count = count;
  spec.element_size = element_size;
  spec.memory = ToCore(memory_type);
  spec.image = {width, height, channels};
  std::lock_guard<std::mutex> lock(mu_);
  auto impl = Check(backendOrThrow().CreateTensor(spec, data));
  void* host = impl->host_data();
  return {std::move(impl), host};
}

void Manager::checkImageData(const void* data, size_t values, uint32_t width, uint32_t height,
                             uint32_t channels) {
  const uint64_t texels = uint64_t{width} * height * channels;
  if (data != nullptr && values != texels) {
    throw Error(ErrorCode::kInvalidArgument,
                "image: " + std::to_string(values) + " values given for " + std::to_string(width) +
                    "x" + std::to_string(height) + "x" + std::to_string(channels) + " = " +
                    std::to_string(texels) + " elements");
  }
}

std::shared_ptr<Image> Manager::image(void* data, size_t dataSize, uint32_t width, uint32_t height,
                                      uint32_t numChannels, const Memory::DataTypes& dataType,
                                      Memory::MemoryTypes imageType) {
  checkImageData(data, dataSize, width, height, numChannels);
  const uint32_t element_size = komputed::core::ElementTypeSize(ToCore(dataType));
  auto [impl, host] = createTensor(data, uint64_t{width} * height * numChannels, element_size,
                                   dataType, imageType, width, height, numChannels);
  std::shared_ptr<Image> image(new Image(std::move(impl), host, width, height, numChannels,
                                         element_size, dataType, imageType));
  track(image);
  return image;
}

void Manager::track(const std::shared_ptr<Tensor>& tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  tensors_.push_back(tensor);
}

std::shared_ptr<Algorithm> Manager::makeAlgorithm() {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Algorithm> a(new Algorithm(backend_));
  if (backend_ == nullptr) throw Error(ErrorCode::kFailedPrecondition, "the Manager was destroyed");
  algorithms_.push_back(a);
  return a;
}

void Manager::destroy() {
  std::vector<std::shared_ptr<Sequence>> sequences;
  std::vector<std::shared_ptr<Algorithm>> algorithms;
  std::vector<std::shared_ptr<Tensor>> tensors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : sequences_)
      if (auto s = w.lock()) sequences.push_back(std::move(s));
    for (auto& w : algorithms_)
      if (auto a = w.lock()) algorithms.push_back(std::move(a));
    for (auto& w : tensors_)
      if (auto t = w.lock()) tensors.push_back(std::move(t));
    sequences_.clear();
    algorithms_.clear();
    tensors_.clear();
  }
  for (auto& s : sequences) s->destroy();
  for (auto& a : algorithms) a->destroy();
  for (auto& t : tensors) t->destroy();
  std::shared_ptr<Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mu_);
    backend = std::move(backend_);
  }
  // Best effort: a daemon that does not answer in time frees the session when its lease runs out.
  if (backend != nullptr) backend->Close(CloseTimeout()).IgnoreError();
}

void Manager::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  auto expired = [](const auto& w) { return w.expired(); };
  std::erase_if(sequences_, expired);
  std::erase_if(algorithms_, expired);
  std::erase_if(tensors_, expired);
}

vk::PhysicalDeviceProperties Manager::getDeviceProperties() const {
  std::lock_guard<std::mutex> lock(mu_);
  return vk::PhysicalDeviceProperties(backendOrThrow().Properties());
}

DeviceList Manager::listDevices() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceList out;
  for (const internal::DeviceEntry& d : Check(backendOrThrow().ListDevices())) {
    out.emplace_back(vk::PhysicalDeviceProperties(d.properties), vk::PhysicalDevice(d.handle));
  }
  return out;
}

std::vector<uint32_t> compileSource(const std::string& source) {
  if (const char* address = AddressVariable(); address != nullptr) {
    internal::remote::CredentialSettings credentials;  // the environment's
    return Check(internal::CompileGlslRemotely(address, credentials, source));
  }
  return Check(core::CompileGlsl(source, "compileSource"));
}

}  // namespace kp
