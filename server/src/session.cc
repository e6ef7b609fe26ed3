#include "session.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/shader.h"
#include "komputed/core/status.h"

namespace komputed::server {
namespace {

// The most GPU timestamps one sequence may ask for.
constexpr uint32_t kMaxTimestamps = 1 << 16;
// Room left in a message for everything but the data bytes.
constexpr uint64_t kMessageOverhead = 4096;
// The longest bound an eval may ask for (keeps the arithmetic in range).
constexpr uint64_t kMaxTimeoutMs = uint64_t{10} * 24 * 3600 * 1000;

// The same status with `prefix` in front of its message.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// [offset, offset + length) lies inside [0, size).
bool Inside(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

// Tensor memory a tensor holds: its buffer, and its staging buffer when it has one.
int64_t MemoryCost(const core::Tensor& tensor) {
  const uint64_t copies = tensor.memory_type() == core::MemoryType::kDevice ? 2 : 1;
  return static_cast<int64_t>(tensor.byte_size() * copies);
}

// "create_tensor 7": the command and the handle it acts on.
std::string CommandName(const v1::Command& command) {
  switch (command.command_case()) {
    case v1::Command::kCreateTensor:
      return absl::StrCat("create_tensor ", command.create_tensor().handle());
    case v1::Command::kDestroyTensor:
      return absl::StrCat("destroy_tensor ", command.destroy_tensor().handle());
    case v1::Command::kCreateAlgorithm:
      return absl::StrCat("create_algorithm ", command.create_algorithm().handle());
    case v1::Command::kRebuildAlgorithm:
      return absl::StrCat("rebuild_algorithm ", command.rebuild_algorithm().handle());
    case v1::Command::kSetPushConstants:
      return absl::StrCat("set_push_constants ", command.set_push_constants().handle());
    case v1::Command::kDestroyAlgorithm:
      return absl::StrCat("destroy_algorithm ", command.destroy_algorithm().handle());
    case v1::Command::kCreateSequence:
      return absl::StrCat("create_sequence ", command.create_sequence().handle());
    case v1::Command::kRecord:
      return absl::StrCat("record ", command.record().sequence());
    case v1::Command::kDestroySequence:
      return absl::StrCat("destroy_sequence ", command.destroy_sequence().handle());
    case v1::Command::COMMAND_NOT_SET:
      break;
  }
  return "empty";
}

std::string OperationName(const v1::Operation& operation) {
  switch (operation.op_case()) {
    case v1::Operation::kSyncDevice:
      return "sync_device";
    case v1::Operation::kSyncLocal:
      return "sync_local";
    case v1::Operation::kCopy:
      return "copy";
    case v1::Operation::kDispatch:
      return absl::StrCat("dispatch of algorithm ", operation.dispatch().algorithm());
    case v1::Operation::kBarrier:
      return "barrier";
    case v1::Operation::OP_NOT_SET:
      break;
  }
  return "empty operation";
}

// A tensor's host data, or nullptr when it has none. A storage tensor never has any, even where
// the driver gives device-local memory that is host-visible (lavapipe), and core maps it.
char* HostData(const core::Tensor& tensor) {
  if (tensor.memory_type() == core::MemoryType::kStorage) return nullptr;
  return static_cast<char*>(tensor.host_data());
}

std::vector<uint8_t> Bytes(const std::string& data) {
  return std::vector<uint8_t>(data.begin(), data.end());
}

// Fills the response's downloads; returns their bytes.
uint64_t CollectDownloads(
    const std::vector<std::pair<uint64_t, std::shared_ptr<core::Tensor>>>& downloads,
    v1::EvalResponse* response) {
  uint64_t bytes = 0;
  for (const auto& [handle, tensor] : downloads) {
    v1::TensorData* data = response->add_downloads();
    data->set_handle(handle);
    data->set_offset(0);
    data->mutable_data()->assign(HostData(*tensor), tensor->byte_size());
    bytes += tensor->byte_size();
  }
  return bytes;
}

// Whether an algorithm build failed on core's SPIR-V validation (ValidateSpirv reports
// INVALID_ARGUMENT "invalid SPIR-V: ..." or "not SPIR-V: ..."); other failures happen before
// the validation (sizes, workgroups) or after it (Vulkan objects).
bool FailedSpirvValidation(const absl::Status& status) {
  return absl::IsInvalidArgument(status) &&
         (absl::StrContains(status.message(), "invalid SPIR-V") ||
          absl::StrContains(status.message(), "not SPIR-V"));
}

}  // namespace

// What an eval hands to the waiter: the sequence it submitted (null when none) and the tensors
// whose host data comes back.
struct Session::Prepared {
  std::shared_ptr<SequenceEntry> sequence;
  uint64_t sequence_handle = 0;
  bool submitted = false;  // a command buffer went to the device queue
  std::vector<std::pair<uint64_t, std::shared_ptr<core::Tensor>>> downloads;
};

Session::Session(SessionConfig config)
    : config_(std::move(config)),
      uploads_(&config_.metrics->bytes_transferred_total("upload")),
      downloads_(&config_.metrics->bytes_transferred_total("download")),
      created_(absl::Now()),
      last_activity_ns_(absl::ToUnixNanos(created_)) {}

Session::~Session() { Close(); }

void Session::Touch() {
  last_activity_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
}

absl::Time Session::last_activity() const {
  return absl::FromUnixNanos(last_activity_ns_.load(std::memory_order_relaxed));
}

void Session::AddMemory(int64_t bytes) {
  memory_bytes_.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  config_.device->AddMemory(bytes);
}

void Session::CountValidation(const absl::Status& build) const {
  if (build.ok()) {
    config_.metrics->shader_validations_total("ok").Increment();
  } else if (FailedSpirvValidation(build)) {
    config_.metrics->shader_validations_total("error").Increment();
  }
}

void Session::Close() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Tensor>> tensors;
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Algorithm>> algorithms;
  absl::flat_hash_map<uint64_t, std::shared_ptr<SequenceEntry>> sequences;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    tensors.swap(tensors_);
    algorithms.swap(algorithms_);
    sequences.swap(sequences_);
  }
  // Every tensor was counted under the lock before closed_ was set.
  const uint64_t held = memory_bytes_.exchange(0, std::memory_order_relaxed);
  config_.device->AddMemory(-static_cast<int64_t>(held));
  // The tables are freed here, outside the lock; the waiter keeps what is still in flight.
}

void Session::Describe(v1::SessionInfo* info) const {
  const absl::Time now = absl::Now();
  info->set_session_id(config_.id);
  info->set_client_name(config_.client_name);
  info->set_peer(config_.peer);
  info->set_device_index(config_.device->index());
  info->set_memory_bytes(memory_bytes());
  info->set_age_ms(
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(now - created_))));
  info->set_idle_ms(static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(now - last_activity()))));
  absl::MutexLock lock(&mu_);
  info->set_tensors(static_cast<uint32_t>(tensors_.size()));
  info->set_algorithms(static_cast<uint32_t>(algorithms_.size()));
  info->set_sequences(static_cast<uint32_t>(sequences_.size()));
}

// ---------------------------------------------------------------------------------------------
// Lookups

absl::Status Session::CheckOpenLocked() const {
  if (closed_) return absl::NotFoundError(absl::StrCat("session ", config_.id, " was closed"));
  return absl::OkStatus();
}

absl::Status Session::CheckUsableLocked() const {
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  if (config_.instance->device->lost()) {
    return absl::UnavailableError(absl::StrCat(
        "device ", config_.device->index(), " was lost (VK_ERROR_DEVICE_LOST) with session ",
        config_.id, "'s objects on it: close this session and open a new one",
        config_.device->usable() ? " (the device has been opened again)" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<core::Tensor>> Session::TensorLocked(uint64_t handle) const {
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", handle, " not found in this session"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<core::Tensor>> Session::HostTensorLocked(uint64_t handle) const {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, TensorLocked(handle));
  if (HostData(*tensor) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", handle, " is a ", core::MemoryTypeName(tensor->memory_type()),
                     " tensor: it has no host data (copy it into a device or host tensor first)"));
  }
  return tensor;
}

absl::StatusOr<std::vector<std::shared_ptr<core::Tensor>>> Session::TensorsLocked(
    const google::protobuf::RepeatedField<uint64_t>& handles) const {
  std::vector<std::shared_ptr<core::Tensor>> tensors;
  tensors.reserve(handles.size());
  for (uint64_t handle : handles) {
    KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, TensorLocked(handle));
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

absl::StatusOr<std::shared_ptr<core::Algorithm>> Session::AlgorithmLocked(uint64_t handle) const {
  auto it = algorithms_.find(handle);
  if (it == algorithms_.end()) {
    return absl::NotFoundError(absl::StrCat("algorithm ", handle, " not found in this session"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Session::SequenceEntry>> Session::SequenceLocked(
    uint64_t handle) const {
  auto it = sequences_.find(handle);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", handle, " not found in this session"));
  }
  return it->second;
}

absl::Status Session::SettleLocked(uint64_t handle, SequenceEntry& entry) const {
  if (!entry.sequence->IsRunning()) return absl::OkStatus();
  if (entry.awaited.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", handle,
                     " is running: an earlier eval of it has not completed; wait for its result"));
  }
  // A submission whose eval timed out: usable again once it has completed.
  absl::Status s = entry.sequence->Wait(absl::ZeroDuration());
  if (absl::IsDeadlineExceeded(s)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", handle, " is still running a submission that did not complete in time"));
  }
  return Annotate(s, absl::StrCat("sequence ", handle, ": "));
}

// ---------------------------------------------------------------------------------------------
// Tensors

absl::Status Session::CreateTensor(const v1::CreateTensorRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return CreateTensorLocked(request);
}

absl::Status Session::CreateTensorLocked(const v1::CreateTensorRequest& request) {
  const uint64_t handle = request.handle();
  if (handle == 0)
    return absl::InvalidArgumentError("tensor handle 0 is not valid (0 is never a handle)");
  if (tensors_.contains(handle)) {
    return absl::AlreadyExistsError(
        absl::StrCat("tensor ", handle, " already exists in this session"));
  }
  const std::string what = absl::StrCat("tensor ", handle, ": ");
  if (!v1::ElementType_IsValid(request.element_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "unknown element type ", static_cast<int>(request.element_type())));
  }
  if (!v1::MemoryType_IsValid(request.memory_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "unknown memory type ", static_cast<int>(request.memory_type())));
  }
  const auto type = static_cast<core::ElementType>(request.element_type());
  const auto memory = static_cast<core::MemoryType>(request.memory_type());
  uint32_t element_size = request.element_size();
  if (type == core::ElementType::kBytes) {
    if (element_size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "ELEMENT_TYPE_BYTES needs an element_size above 0"));
    }
  } else if (element_size != 0 && element_size != core::ElementTypeSize(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "element_size ", element_size, " does not match ", core::ElementTypeName(type), " (",
        core::ElementTypeSize(type), " bytes; give 0 or ", core::ElementTypeSize(type), ")"));
  } else {
    element_size = core::ElementTypeSize(type);
  }
  if (request.count() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "count is 0; a tensor needs at least one element"));
  }
  if (request.count() > std::numeric_limits<uint64_t>::max() / element_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, request.count(), " elements of ",
                                                   element_size, " bytes overflow 64 bits"));
  }
  const uint64_t bytes = request.count() * element_size;
  if (!request.data().empty() && request.data().size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "data of ", request.data().size(), " bytes given; ", request.count(),
                     " ", core::ElementTypeName(type), " elements of ", element_size,
                     " bytes need ", bytes, " bytes (or no data: zero-filled)"));
  }
  auto tensor =
      core::Tensor::Create(config_.instance->device, type, request.count(), element_size, memory,
                           request.data().empty() ? nullptr : request.data().data());
  if (!tensor.ok()) {
    config_.device->CheckLost(*config_.instance);
    return Annotate(tensor.status(), what);
  }
  CountUpload(request.data().size());
  AddMemory(MemoryCost(**tensor));
  tensors_.emplace(handle, *std::move(tensor));
  return absl::OkStatus();
}

absl::Status Session::DestroyTensor(const v1::DestroyTensorRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroyTensorLocked(request);
}

absl::Status Session::DestroyTensorLocked(const v1::DestroyTensorRequest& request) {
  auto it = tensors_.find(request.handle());
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", request.handle(), " not found in this session"));
  }
  AddMemory(-MemoryCost(*it->second));
  tensors_.erase(it);  // algorithms and recordings that use it keep it until they go
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<core::Tensor>> Session::HostTensor(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return HostTensorLocked(handle);
}

// ---------------------------------------------------------------------------------------------
// Algorithms

absl::StatusOr<core::AlgorithmSpec> Session::SpecLocked(
    const v1::CreateAlgorithmRequest& request) const {
  core::AlgorithmSpec spec;
  KD_ASSIGN_OR_RETURN(spec.tensors, TensorsLocked(request.tensors()));
  switch (request.shader_case()) {
    case v1::CreateAlgorithmRequest::kSpirv: {
      const std::string& bytes = request.spirv();
      if (bytes.empty()) {
        config_.metrics->shader_validations_total("error").Increment();
        return absl::InvalidArgumentError("the SPIR-V is empty");
      }
      if (bytes.size() % 4 != 0) {
        config_.metrics->shader_validations_total("error").Increment();
        return absl::InvalidArgumentError(absl::StrCat(
            "SPIR-V of ", bytes.size(), " bytes is not a whole number of 4-byte words"));
      }
      spec.spirv.resize(bytes.size() / 4);
      std::memcpy(spec.spirv.data(), bytes.data(), bytes.size());
      break;
    }
    case v1::CreateAlgorithmRequest::kGlsl: {
      auto spirv = core::CompileGlsl(request.glsl(), absl::StrCat("algorithm ", request.handle()));
      config_.metrics->shader_compilations_total(spirv.ok() ? "ok" : "error").Increment();
      if (!spirv.ok()) return spirv.status();
      spec.spirv = *std::move(spirv);
      break;
    }
    case v1::CreateAlgorithmRequest::SHADER_NOT_SET:
      return absl::InvalidArgumentError("no shader given: set spirv or glsl");
  }
  spec.workgroup = {request.workgroup().x(), request.workgroup().y(), request.workgroup().z()};
  spec.spec_constants = Bytes(request.spec_constants());
  spec.spec_constant_size = request.spec_constant_size() == 0 ? 4 : request.spec_constant_size();
  spec.push_constants = Bytes(request.push_constants());
  return spec;
}

absl::Status Session::CreateAlgorithm(const v1::CreateAlgorithmRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return CreateAlgorithmLocked(request);
}

absl::Status Session::CreateAlgorithmLocked(const v1::CreateAlgorithmRequest& request) {
  const uint64_t handle = request.handle();
  if (handle == 0)
    return absl::InvalidArgumentError("algorithm handle 0 is not valid (0 is never a handle)");
  if (algorithms_.contains(handle)) {
    return absl::AlreadyExistsError(
        absl::StrCat("algorithm ", handle, " already exists in this session"));
  }
  const std::string what = absl::StrCat("algorithm ", handle, ": ");
  auto spec = SpecLocked(request);
  if (!spec.ok()) return Annotate(spec.status(), what);
  auto algorithm = core::Algorithm::Create(config_.instance->device, *std::move(spec));
  CountValidation(algorithm.status());
  if (!algorithm.ok()) return Annotate(algorithm.status(), what);
  algorithms_.emplace(handle, *std::move(algorithm));
  return absl::OkStatus();
}

absl::Status Session::RebuildAlgorithm(const v1::CreateAlgorithmRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return RebuildAlgorithmLocked(request);
}

absl::Status Session::RebuildAlgorithmLocked(const v1::CreateAlgorithmRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                      AlgorithmLocked(request.handle()));
  const std::string what = absl::StrCat("algorithm ", request.handle(), ": ");
  auto spec = SpecLocked(request);
  if (!spec.ok()) return Annotate(spec.status(), what);
  absl::Status rebuilt = algorithm->Rebuild(*std::move(spec));
  CountValidation(rebuilt);
  return Annotate(rebuilt, what);
}

absl::Status Session::SetPushConstants(const v1::SetPushConstantsRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return SetPushConstantsLocked(request);
}

absl::Status Session::SetPushConstantsLocked(const v1::SetPushConstantsRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                      AlgorithmLocked(request.handle()));
  return Annotate(algorithm->SetPushConstants(Bytes(request.push_constants())),
                  absl::StrCat("algorithm ", request.handle(), ": "));
}

absl::Status Session::DestroyAlgorithm(const v1::DestroyAlgorithmRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroyAlgorithmLocked(request);
}

absl::Status Session::DestroyAlgorithmLocked(const v1::DestroyAlgorithmRequest& request) {
  if (algorithms_.erase(request.handle()) == 0) {
    return absl::NotFoundError(
        absl::StrCat("algorithm ", request.handle(), " not found in this session"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Sequences

absl::Status Session::CreateSequence(const v1::CreateSequenceRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return CreateSequenceLocked(request);
}

absl::Status Session::CreateSequenceLocked(const v1::CreateSequenceRequest& request) {
  const uint64_t handle = request.handle();
  if (handle == 0)
    return absl::InvalidArgumentError("sequence handle 0 is not valid (0 is never a handle)");
  if (sequences_.contains(handle)) {
    return absl::AlreadyExistsError(
        absl::StrCat("sequence ", handle, " already exists in this session"));
  }
  const std::string what = absl::StrCat("sequence ", handle, ": ");
  if (request.queue() >= queue_count()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "queue ", request.queue(),
                                                   " out of range: the session has ", queue_count(),
                                                   " queue(s)"));
  }
  if (request.total_timestamps() > kMaxTimestamps) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, request.total_timestamps(), " timestamps asked for; at most ", kMaxTimestamps));
  }
  auto sequence = core::Sequence::Create(config_.instance->device, config_.queues[request.queue()],
                                         request.total_timestamps());
  if (!sequence.ok()) return Annotate(sequence.status(), what);
  auto entry = std::make_shared<SequenceEntry>();
  entry->sequence = *std::move(sequence);
  sequences_.emplace(handle, std::move(entry));
  return absl::OkStatus();
}

absl::StatusOr<core::Op> Session::OpLocked(const v1::Operation& operation) const {
  switch (operation.op_case()) {
    case v1::Operation::kSyncDevice: {
      KD_ASSIGN_OR_RETURN(auto tensors, TensorsLocked(operation.sync_device().tensors()));
      if (tensors.empty())
        return absl::InvalidArgumentError("sync_device needs at least one tensor");
      return core::Op(core::op::SyncToDevice{std::move(tensors)});
    }
    case v1::Operation::kSyncLocal: {
      KD_ASSIGN_OR_RETURN(auto tensors, TensorsLocked(operation.sync_local().tensors()));
      if (tensors.empty())
        return absl::InvalidArgumentError("sync_local needs at least one tensor");
      return core::Op(core::op::SyncToHost{std::move(tensors)});
    }
    case v1::Operation::kCopy: {
      const auto& handles = operation.copy().tensors();
      KD_ASSIGN_OR_RETURN(auto tensors, TensorsLocked(handles));
      if (tensors.size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "copy needs a source and at least one destination tensor; ", tensors.size(), " given"));
      }
      const core::Tensor& src = *tensors[0];
      for (size_t i = 1; i < tensors.size(); ++i) {
        const core::Tensor& dst = *tensors[i];
        if (dst.element_type() != src.element_type() || dst.element_size() != src.element_size() ||
            dst.count() != src.count()) {
          return absl::InvalidArgumentError(
              absl::StrCat("copy: tensor ", handles[i], " holds ", dst.count(), " ",
                           core::ElementTypeName(dst.element_type()), " elements of ",
                           dst.element_size(), " bytes but the source, tensor ", handles[0],
                           ", holds ", src.count(), " ", core::ElementTypeName(src.element_type()),
                           " elements of ", src.element_size(), " bytes"));
        }
      }
      return core::Op(core::op::Copy{std::move(tensors)});
    }
    case v1::Operation::kDispatch: {
      const v1::Dispatch& d = operation.dispatch();
      KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                          AlgorithmLocked(d.algorithm()));
      core::op::Dispatch op{algorithm, std::nullopt};
      if (d.has_push_constants()) {
        const size_t built = algorithm->spec().push_constants.size();
        if (d.push_constants().size() != built) {
          return absl::InvalidArgumentError(
              absl::StrCat("dispatch of algorithm ", d.algorithm(), ": push constants of ",
                           d.push_constants().size(), " bytes given; the algorithm was built with ",
                           built, " bytes"));
        }
        op.push_constants = Bytes(d.push_constants());
      }
      return core::Op(op);
    }
    case v1::Operation::kBarrier: {
      const v1::Barrier& b = operation.barrier();
      KD_ASSIGN_OR_RETURN(auto tensors, TensorsLocked(b.tensors()));
      return core::Op(core::op::MemoryBarrier{std::move(tensors), b.src_access(), b.dst_access(),
                                              b.src_stage(), b.dst_stage(), b.primary()});
    }
    case v1::Operation::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the operation is empty (set one of its fields)");
}

absl::Status Session::Record(const v1::RecordRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return RecordLocked(request);
}

absl::Status Session::RecordLocked(const v1::RecordRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry, SequenceLocked(request.sequence()));
  KD_RETURN_IF_ERROR(SettleLocked(request.sequence(), *entry));
  const std::string what = absl::StrCat("sequence ", request.sequence(), ": ");
  // Every action is converted (and its handles looked up and checked) before any is applied, so
  // that a bad one changes nothing.
  enum class Kind { kRecord, kClear, kRerecord, kNothing };
  std::vector<std::pair<Kind, core::Op>> actions;
  actions.reserve(request.actions_size());
  for (int i = 0; i < request.actions_size(); ++i) {
    const v1::SequenceAction& action = request.actions(i);
    switch (action.action_case()) {
      case v1::SequenceAction::kRecord: {
        auto op = OpLocked(action.record());
        if (!op.ok()) {
          return Annotate(op.status(), absl::StrCat(what, "action ", i, " (record ",
                                                    OperationName(action.record()), "): "));
        }
        actions.emplace_back(Kind::kRecord, *std::move(op));
        break;
      }
      case v1::SequenceAction::kClear:
        actions.emplace_back(action.clear() ? Kind::kClear : Kind::kNothing, core::Op{});
        break;
      case v1::SequenceAction::kRerecord:
        actions.emplace_back(action.rerecord() ? Kind::kRerecord : Kind::kNothing, core::Op{});
        break;
      case v1::SequenceAction::ACTION_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat(what, "action ", i, " is empty (set record, clear or rerecord)"));
    }
  }
  core::Sequence& sequence = *entry->sequence;
  for (size_t i = 0; i < actions.size(); ++i) {
    auto& [kind, op] = actions[i];
    absl::Status s;
    switch (kind) {
      case Kind::kRecord:
        s = sequence.Record(std::move(op));
        break;
      case Kind::kClear:
        s = sequence.Clear();
        break;
      case Kind::kRerecord:
        s = sequence.Rerecord();
        break;
      case Kind::kNothing:
        break;
    }
    if (!s.ok()) return Annotate(s, absl::StrCat(what, "action ", i, ": "));
  }
  return absl::OkStatus();
}

absl::Status Session::DestroySequence(const v1::DestroySequenceRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroySequenceLocked(request);
}

absl::Status Session::DestroySequenceLocked(const v1::DestroySequenceRequest& request) {
  // A submission in flight keeps the sequence (the waiter holds it) until it completes.
  if (sequences_.erase(request.handle()) == 0) {
    return absl::NotFoundError(
        absl::StrCat("sequence ", request.handle(), " not found in this session"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> Session::GetTimestamps(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  KD_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry, SequenceLocked(handle));
  return entry->sequence->Timestamps();
}

// ---------------------------------------------------------------------------------------------
// Eval

absl::Status Session::CommandLocked(const v1::Command& command) {
  // A command's own session_id may be empty; when given it must be this session.
  auto check_session = [&](const std::string& id) -> absl::Status {
    if (!id.empty() && id != config_.id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the command names session ", id, ", but the eval runs in session ", config_.id));
    }
    return absl::OkStatus();
  };
  switch (command.command_case()) {
    case v1::Command::kCreateTensor:
      KD_RETURN_IF_ERROR(check_session(command.create_tensor().session_id()));
      return CreateTensorLocked(command.create_tensor());
    case v1::Command::kDestroyTensor:
      KD_RETURN_IF_ERROR(check_session(command.destroy_tensor().session_id()));
      return DestroyTensorLocked(command.destroy_tensor());
    case v1::Command::kCreateAlgorithm:
      KD_RETURN_IF_ERROR(check_session(command.create_algorithm().session_id()));
      return CreateAlgorithmLocked(command.create_algorithm());
    case v1::Command::kRebuildAlgorithm:
      KD_RETURN_IF_ERROR(check_session(command.rebuild_algorithm().session_id()));
      return RebuildAlgorithmLocked(command.rebuild_algorithm());
    case v1::Command::kSetPushConstants:
      KD_RETURN_IF_ERROR(check_session(command.set_push_constants().session_id()));
      return SetPushConstantsLocked(command.set_push_constants());
    case v1::Command::kDestroyAlgorithm:
      KD_RETURN_IF_ERROR(check_session(command.destroy_algorithm().session_id()));
      return DestroyAlgorithmLocked(command.destroy_algorithm());
    case v1::Command::kCreateSequence:
      KD_RETURN_IF_ERROR(check_session(command.create_sequence().session_id()));
      return CreateSequenceLocked(command.create_sequence());
    case v1::Command::kRecord:
      KD_RETURN_IF_ERROR(check_session(command.record().session_id()));
      return RecordLocked(command.record());
    case v1::Command::kDestroySequence:
      KD_RETURN_IF_ERROR(check_session(command.destroy_sequence().session_id()));
      return DestroySequenceLocked(command.destroy_sequence());
    case v1::Command::COMMAND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the command is empty (set one of its fields)");
}

absl::StatusOr<Session::Prepared> Session::PrepareEvalLocked(const v1::EvalRequest& request) {
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  for (int i = 0; i < request.commands_size(); ++i) {
    absl::Status s = CommandLocked(request.commands(i));
    if (!s.ok()) {
      return Annotate(s,
                      absl::StrCat("command ", i, " (", CommandName(request.commands(i)), "): "));
    }
  }

  // Everything is checked before anything is written or submitted.
  std::vector<std::shared_ptr<core::Tensor>> upload_tensors;
  for (const v1::TensorData& upload : request.uploads()) {
    auto tensor = HostTensorLocked(upload.handle());
    if (!tensor.ok()) return Annotate(tensor.status(), "upload: ");
    if (!Inside(upload.offset(), upload.data().size(), (*tensor)->byte_size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload to tensor ", upload.handle(), ": ", upload.data().size(), " bytes at offset ",
          upload.offset(), " do not fit in its ", (*tensor)->byte_size(), " bytes"));
    }
    upload_tensors.push_back(*std::move(tensor));
  }
  Prepared prepared;
  uint64_t download_bytes = 0;
  for (uint64_t handle : request.downloads()) {
    auto tensor = HostTensorLocked(handle);
    if (!tensor.ok()) return Annotate(tensor.status(), "download: ");
    download_bytes += (*tensor)->byte_size();
    prepared.downloads.emplace_back(handle, *std::move(tensor));
  }
  if (download_bytes + kMessageOverhead > config_.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "downloads of ", download_bytes, " bytes do not fit in one message (the daemon's limit is ",
        config_.max_message_bytes, " bytes); read large tensors with ReadTensor"));
  }
  if (request.sequence() != 0) {
    KD_ASSIGN_OR_RETURN(prepared.sequence, SequenceLocked(request.sequence()));
    prepared.sequence_handle = request.sequence();
    KD_RETURN_IF_ERROR(SettleLocked(request.sequence(), *prepared.sequence));
  }

  for (int i = 0; i < request.uploads_size(); ++i) {
    const v1::TensorData& upload = request.uploads(i);
    std::memcpy(HostData(*upload_tensors[i]) + upload.offset(), upload.data().data(),
                upload.data().size());
    CountUpload(upload.data().size());
  }
  if (prepared.sequence != nullptr) {
    core::Sequence& sequence = *prepared.sequence->sequence;
    absl::Status submitted = sequence.Submit();
    if (!submitted.ok()) {
      config_.device->CheckLost(*config_.instance);
      return Annotate(submitted, absl::StrCat("sequence ", request.sequence(), ": "));
    }
    // Nothing is submitted for a sequence that never recorded anything.
    prepared.submitted = sequence.IsRunning();
    if (prepared.submitted) config_.device->Submitted(sequence.queue());
    prepared.sequence->awaited.store(true);
  }
  return prepared;
}

void Session::Eval(const v1::EvalRequest& request, absl::Time deadline, v1::EvalResponse* response,
                   bool may_wait_inline, std::function<void(absl::Status)> on_done) {
  Touch();
  WorkGate* const gate = config_.gate;
  if (gate != nullptr && !gate->Enter()) {
    on_done(WorkGate::Refusal("evaluations"));
    return;
  }
  // The gate counts the eval in flight until its caller has been told.
  auto done = [gate, on_done = std::move(on_done)](absl::Status status) {
    on_done(std::move(status));
    if (gate != nullptr) gate->Exit();
  };
  absl::StatusOr<Prepared> prepared;
  {
    absl::MutexLock lock(&mu_);
    prepared = PrepareEvalLocked(request);
  }
  if (!prepared.ok()) {
    done(prepared.status());
    return;
  }
  if (prepared->sequence == nullptr) {
    CountDownload(CollectDownloads(prepared->downloads, response));
    done(absl::OkStatus());
    return;
  }
  const absl::Duration timeout =
      request.timeout_ms() > 0
          ? absl::Milliseconds(static_cast<int64_t>(std::min(request.timeout_ms(), kMaxTimeoutMs)))
          : config_.eval_timeout;
  deadline = std::min(deadline, absl::Now() + timeout);
  std::shared_ptr<SequenceEntry> entry = prepared->sequence;
  const uint64_t handle = prepared->sequence_handle;
  const bool submitted = prepared->submitted;
  PooledDevice* const device = config_.device;  // the pool outlives the waiter's callbacks
  // The instance outlives its waiter's callbacks (and the inline wait holds the session).
  DeviceInstance* const instance = config_.instance.get();
  prometheus::Counter* const downloaded = downloads_;
  // What runs once the submission has completed (or failed, or run past the deadline).
  auto finish = [entry, handle, timeout, submitted, device, instance, downloaded,
                 downloads = std::move(prepared->downloads), response,
                 done = std::move(done)](absl::Status status) mutable {
    uint64_t gpu_ns = 0;
    if (status.ok()) {
      downloaded->Increment(static_cast<double>(CollectDownloads(downloads, response)));
      std::vector<uint64_t> timestamps = entry->sequence->Timestamps();
      for (uint64_t t : timestamps) response->add_timestamps_ns(t);
      if (timestamps.size() >= 2) {
        gpu_ns = timestamps.back() - timestamps.front();
        response->set_device_time_ns(gpu_ns);
      }
    } else if (absl::IsDeadlineExceeded(status)) {
      status = absl::DeadlineExceededError(
          absl::StrCat("sequence ", handle, ": the submission did not complete within ",
                       absl::FormatDuration(timeout),
                       " (it is still running; a later eval of the "
                       "sequence fails until it has completed)"));
    } else {
      status = Annotate(status, absl::StrCat("sequence ", handle, ": "));
      device->CheckLost(*instance);
    }
    if (submitted) device->Completed(entry->sequence->queue(), gpu_ns);
    entry->awaited.store(false);
    done(status);
  };
  // Short work: wait on this thread, then reply from it (no hand-off to the waiter thread and
  // back). Bounded in time and in the number of threads doing it, so that long submissions and
  // many concurrent ones still go to the waiter.
  if (may_wait_inline && submitted && config_.inline_wait > absl::ZeroDuration() &&
      device->BeginInlineWait(config_.inline_waiters)) {
    const absl::Duration budget =
        std::min(config_.inline_wait, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (config_.spin > absl::ZeroDuration() && !device->is_cpu()) {
      entry->sequence->Poll(std::min(budget, config_.spin));
    }
    absl::Status status = entry->sequence->Wait(budget);
    device->EndInlineWait();
    if (!absl::IsDeadlineExceeded(status)) {
      finish(std::move(status));
      return;
    }
  }
  // The waiter holds the sequence (and through its recording, its tensors and algorithms) until
  // the submission completes, even if the session is closed meanwhile.
  config_.instance->waiter->Watch(entry->sequence, deadline, std::move(finish));
}

// ---------------------------------------------------------------------------------------------
// Chunked host data access

absl::StatusOr<std::unique_ptr<TensorWrite>> TensorWrite::Begin(std::shared_ptr<Session> session,
                                                                const Chunk& chunk) {
  const v1::TensorChunk& first = chunk.fields;
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, session->HostTensor(first.handle()));
  const std::string what = absl::StrCat("WriteTensor to tensor ", first.handle(), ": ");
  if (first.total_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     "the first message declares total_bytes 0; it must give the number of "
                     "bytes the call writes"));
  }
  if (!Inside(first.offset(), first.total_bytes(), tensor->byte_size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, first.total_bytes(), " bytes at offset ",
                                                   first.offset(), " do not fit in its ",
                                                   tensor->byte_size(), " bytes"));
  }
  auto write = std::unique_ptr<TensorWrite>(new TensorWrite());
  write->session_ = std::move(session);
  write->tensor_ = std::move(tensor);
  write->handle_ = first.handle();
  write->begin_ = first.offset();
  write->end_ = first.offset() + first.total_bytes();
  KD_RETURN_IF_ERROR(write->Write(chunk));
  return write;
}

absl::Status TensorWrite::Write(const Chunk& chunk) {
  session_->Touch();
  const uint64_t offset = chunk.fields.offset();
  const uint64_t length = chunk.data_bytes;
  if (length == 0) return absl::OkStatus();
  const std::string what = absl::StrCat("WriteTensor to tensor ", handle_, ": ");
  if (offset < begin_ || !Inside(offset - begin_, length, end_ - begin_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "the chunk of ", length, " bytes at offset ", offset, " falls outside [",
                     begin_, ", ", end_, "), the range that the first message declared"));
  }
  const uint64_t end = offset + length;
  auto next = ranges_.lower_bound(offset);
  if (next != ranges_.end() && next->first < end) {
    return absl::InvalidArgumentError(absl::StrCat(what, "the chunk [", offset, ", ", end,
                                                   ") overlaps bytes already written at [",
                                                   next->first, ", ", next->second, ")"));
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, "the chunk [", offset, ", ", end,
                                                     ") overlaps bytes already written at [",
                                                     prev->first, ", ", prev->second, ")"));
    }
  }
  v1::wire::CopyData(chunk, HostData(*tensor_) + offset);
  written_ += length;
  session_->CountUpload(length);
  // Keep the written ranges merged, so that the map stays small.
  uint64_t start = offset;
  uint64_t stop = end;
  if (next != ranges_.end() && next->first == end) {
    stop = next->second;
    next = ranges_.erase(next);
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == offset) {
      start = prev->first;
      ranges_.erase(prev);
    }
  }
  ranges_[start] = stop;
  return absl::OkStatus();
}

absl::Status TensorWrite::Finish() const {
  if (written_ != end_ - begin_) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteTensor to tensor ", handle_, ": the chunks cover ", written_, " of the ",
                     end_ - begin_, " bytes that the first message declared (total_bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorRead>> TensorRead::Begin(std::shared_ptr<Session> session,
                                                              const v1::ReadTensorRequest& request,
                                                              uint64_t max_chunk_bytes) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, session->HostTensor(request.handle()));
  const uint64_t size = tensor->byte_size();
  if (request.offset() > size) {
    return absl::InvalidArgumentError(absl::StrCat("ReadTensor of tensor ", request.handle(),
                                                   ": offset ", request.offset(), " is beyond its ",
                                                   size, " bytes"));
  }
  const uint64_t length = request.length() == 0 ? size - request.offset() : request.length();
  if (!Inside(request.offset(), length, size)) {
    return absl::InvalidArgumentError(absl::StrCat("ReadTensor of tensor ", request.handle(), ": ",
                                                   length, " bytes at offset ", request.offset(),
                                                   " do not fit in its ", size, " bytes"));
  }
  auto read = std::unique_ptr<TensorRead>(new TensorRead());
  read->session_ = std::move(session);
  read->tensor_ = std::move(tensor);
  read->handle_ = request.handle();
  read->next_ = request.offset();
  read->end_ = request.offset() + length;
  const uint64_t chunk = request.chunk_bytes() == 0 ? kDefaultChunkBytes : request.chunk_bytes();
  read->chunk_bytes_ = std::max<uint64_t>(1, std::min(chunk, max_chunk_bytes));
  return read;
}

grpc::ByteBuffer TensorRead::Next() {
  session_->Touch();
  const uint64_t n = std::min(chunk_bytes_, end_ - next_);
  v1::TensorChunk fields;
  fields.set_handle(handle_);
  fields.set_offset(next_);
  grpc::ByteBuffer chunk = v1::wire::SerializeTensorChunk(
      fields, HostData(*tensor_) + next_, n,
      [](void* held) { delete static_cast<std::shared_ptr<core::Tensor>*>(held); },
      new std::shared_ptr<core::Tensor>(tensor_));
  next_ += n;
  session_->CountDownload(n);
  return chunk;
}

}  // namespace komputed::server
