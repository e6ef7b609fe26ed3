#include "session.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "host_data.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/shader.h"
#include "komputed/core/status.h"
#include "status.h"

namespace komputed::server {
namespace {

// The most GPU timestamps one sequence may ask for.
constexpr uint32_t kMaxTimestamps = 1 << 16;

// Tensor memory that a tensor of `bytes` holds: its buffer, and its staging buffer when it has
// one (saturated, so that a huge size asked for cannot wrap to a small one).
uint64_t MemoryBytes(core::MemoryType memory, uint64_t bytes) {
  if (!core::HasStaging(memory)) return bytes;
  return bytes > UINT64_MAX / 2 ? UINT64_MAX : 2 * bytes;
}

int64_t MemoryCost(const core::Tensor& tensor) {
  return static_cast<int64_t>(MemoryBytes(tensor.memory_type(), tensor.byte_size()));
}

// Whether an algorithm build failed on core's SPIR-V validation (ValidateSpirv reports
// INVALID_ARGUMENT "invalid SPIR-V: ..." or "not SPIR-V: ..."); other failures happen before
// the validation (sizes, workgroups) or after it (Vulkan objects).
bool FailedSpirvValidation(const absl::Status& status) {
  return absl::IsInvalidArgument(status) &&
         (absl::StrContains(status.message(), "invalid SPIR-V") ||
          absl::StrContains(status.message(), "not SPIR-V"));
}

// A failed operation's error with the session's names for what core numbers by position:
// "... (its tensors 0, 1 are tensors 5, 5 of this session)".
absl::Status NameOperands(const absl::Status& status, const HandleOp& op) {
  if (!absl::IsInvalidArgument(status)) return status;
  std::string names;
  if (!op.tensors.empty()) {
    std::vector<size_t> positions(op.tensors.size());
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = i;
    names = absl::StrCat(" (its tensors ", absl::StrJoin(positions, ", "), " are tensors ",
                         absl::StrJoin(op.tensors, ", "), " of this session)");
  } else if (op.kind == core::OpKind::kDispatch) {
    names = absl::StrCat(" (algorithm ", op.algorithm, ")");
  }
  return absl::Status(status.code(), absl::StrCat(status.message(), names));
}

// A tensor with its tenant's memory charges: they are given back when the last user of the tensor
// (the session's table, an algorithm, a recording, a submission in flight) lets it go, which is
// when its Vulkan memory is freed.
struct ChargedTensor {
  Charge device_memory;
  Charge host_memory;
  std::shared_ptr<core::Tensor> tensor;  // destroyed first (declared last)
};

const std::string kNoTenant;

}  // namespace

Session::Session(SessionFacts facts, const ServerOptions& options, Metrics* metrics, WorkGate* gate,
                 Charge session_charge)
    : facts_(std::move(facts)),
      memory_pool_(facts_.instance == nullptr
                       ? nullptr
                       : facts_.instance->MemoryPoolFor(
                             facts_.account != nullptr ? facts_.account->tenant() : "")),
      options_(options),
      metrics_(metrics),
      gate_(gate),
      uploads_(&metrics_->bytes_transferred_total("upload")),
      downloads_(&metrics_->bytes_transferred_total("download")),
      submitted_together_(&metrics_->submitted_together_total()),
      created_(absl::Now()),
      last_activity_ns_(absl::ToUnixNanos(created_)),
      session_charge_(std::move(session_charge)) {}

const std::string& Session::tenant() const {
  return facts_.account != nullptr ? facts_.account->tenant() : kNoTenant;
}

Session::~Session() { Close(); }

void Session::Touch() {
  last_activity_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
}

absl::Time Session::last_activity() const {
  return absl::FromUnixNanos(last_activity_ns_.load(std::memory_order_relaxed));
}

void Session::AddMemory(int64_t bytes) {
  memory_bytes_.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  facts_.device->AddMemory(bytes);
}

void Session::CountValidation(const absl::Status& build) const {
  if (build.ok()) {
    metrics_->shader_validations_total("ok").Increment();
  } else if (FailedSpirvValidation(build)) {
    metrics_->shader_validations_total("error").Increment();
  }
}

void Session::Close() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Tensor>> tensors;
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Algorithm>> algorithms;
  absl::flat_hash_map<uint64_t, std::shared_ptr<SequenceEntry>> sequences;
  Charge session_charge;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    session_charge = std::move(session_charge_);
    tensors = tensors_.TakeAll();
    algorithms = algorithms_.TakeAll();
    sequences = sequences_.TakeAll();
    shared_memory_.clear();
  }
  // Every tensor was counted under the lock before closed_ was set.
  const uint64_t held = memory_bytes_.exchange(0, std::memory_order_relaxed);
  facts_.device->AddMemory(-static_cast<int64_t>(held));
  for (auto& [handle, entry] : sequences) ReleaseSequence(entry);
  // The tables are freed here, outside the lock; the waiter keeps what is still in flight.
}

size_t Session::ReleaseIdleSequences(absl::Time unused_since) {
  std::vector<std::shared_ptr<core::Sequence>> sequences;
  {
    absl::MutexLock lock(&mu_);
    sequences_.ForEach([&](uint64_t, const std::shared_ptr<SequenceEntry>& entry) {
      sequences.push_back(entry->sequence);
    });
  }
  // Outside the session's lock: each sequence's own lock keeps a release from meeting its use.
  size_t released = 0;
  for (const auto& sequence : sequences) released += sequence->Release(unused_since) ? 1 : 0;
  return released;
}

void Session::ReleaseSequence(const std::shared_ptr<SequenceEntry>& entry) const {
  if (entry == nullptr || !entry->sequence->IsRunning()) return;
  // Freed on the waiter's thread once the submission has completed (the watchdog bounds how long
  // that takes), never by waiting on the device here.
  facts_.instance->waiter->Watch(entry->sequence, absl::Now() + options_.eval_timeout,
                                 [](absl::Status) {});
}

SessionSummary Session::Describe() const {
  const absl::Time now = absl::Now();
  SessionSummary summary;
  summary.id = facts_.id;
  summary.tenant = tenant();
  summary.client_name = facts_.client_name;
  summary.peer = facts_.peer;
  summary.device_index = facts_.device->index();
  summary.memory_bytes = memory_bytes();
  summary.age = now - created_;
  summary.idle = now - last_activity();
  absl::MutexLock lock(&mu_);
  summary.tensors = static_cast<uint32_t>(tensors_.size());
  summary.algorithms = static_cast<uint32_t>(algorithms_.size());
  summary.sequences = static_cast<uint32_t>(sequences_.size());
  return summary;
}

// ---------------------------------------------------------------------------------------------
// Lookups

bool Session::open() const {
  absl::MutexLock lock(&mu_);
  return !closed_;
}

absl::Status Session::CheckOpenLocked() const {
  if (closed_) return absl::NotFoundError(absl::StrCat("session ", facts_.id, " was closed"));
  return absl::OkStatus();
}

absl::Status Session::CheckUsableLocked() const {
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  if (facts_.instance->device->lost()) {
    return absl::UnavailableError(
        absl::StrCat("device ", facts_.device->index(),
                     " was lost (VK_ERROR_DEVICE_LOST, or it stopped answering) with session ",
                     facts_.id, "'s objects on it: close this session and open a new one",
                     facts_.device->usable() ? " (the device has been opened again)" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<core::Tensor>> Session::HostTensorLocked(uint64_t handle) const {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, tensors_.Find(handle));
  if (HostData(*tensor) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", handle, " is a ", core::MemoryTypeName(tensor->memory_type()),
                     " tensor: it has no host data (copy it into a device or host tensor first)"));
  }
  return tensor;
}

absl::StatusOr<std::vector<std::shared_ptr<core::Tensor>>> Session::TensorsLocked(
    const std::vector<uint64_t>& handles) const {
  std::vector<std::shared_ptr<core::Tensor>> tensors;
  tensors.reserve(handles.size());
  for (uint64_t handle : handles) {
    KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, tensors_.Find(handle));
    tensors.push_back(std::move(tensor));
  }
  return tensors;
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

absl::Status Session::CreateTensor(const TensorRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return CreateTensorLocked(request);
}

absl::Status Session::CheckNewObjectLocked() const {
  if (facts_.account == nullptr) return absl::OkStatus();
  return facts_.account->CheckCount(&Quota::objects_per_session,
                                    tensors_.size() + algorithms_.size() + sequences_.size(), 1,
                                    "tensors, algorithms and sequences of this session");
}

absl::Status Session::CreateTensorLocked(const TensorRequest& request) {
  KD_RETURN_IF_ERROR(tensors_.CheckNew(request.handle));
  KD_RETURN_IF_ERROR(CheckNewObjectLocked());
  const std::string what = absl::StrCat("tensor ", request.handle, ": ");
  absl::StatusOr<uint32_t> element_size =
      core::CheckTensorShape(request.type, request.memory, request.count, request.element_size);
  if (!element_size.ok()) return Annotate(element_size.status(), what);
  // The one check of the wire's own: initial data of the tensor's size.
  const uint64_t bytes = request.count * *element_size;
  if (!request.data.empty() && request.data.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "data of ", request.data.size(), " bytes given; ", request.count, " ",
                     core::ElementTypeName(request.type), " elements of ", *element_size,
                     " bytes need ", bytes, " bytes (or no data: zero-filled)"));
  }
  auto charged = std::make_shared<ChargedTensor>();
  if (TenantAccount* account = facts_.account.get()) {
    KD_RETURN_IF_ERROR(
        account->CheckSize(&Quota::tensor_bytes, bytes, absl::StrCat(what, bytes, " bytes")));
    absl::StatusOr<Charge> device_memory =
        account->Take(Counted::kDeviceMemory, MemoryBytes(request.memory, bytes));
    if (!device_memory.ok()) return Annotate(device_memory.status(), what);
    charged->device_memory = *std::move(device_memory);
    absl::StatusOr<Charge> host_memory =
        account->Take(Counted::kHostMemory, core::HasHostData(request.memory) ? bytes : 0);
    if (!host_memory.ok()) return Annotate(host_memory.status(), what);
    charged->host_memory = *std::move(host_memory);
  }
  const void* initial = request.data.empty() ? nullptr : request.data.data();
  std::optional<core::HostMemory> host_memory;
  if (request.shared_memory != 0) {
    auto it = shared_memory_.find(request.shared_memory);
    if (it == shared_memory_.end()) {
      return absl::NotFoundError(absl::StrCat(what, "shared-memory region ", request.shared_memory,
                                              " was not passed to this session (or is taken)"));
    }
    if (!request.data.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "initial data given with shared memory, whose data it is"));
    }
    if (request.memory != core::MemoryType::kDevice &&
        (request.memory != core::MemoryType::kHost || request.image.is_image())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "a ", core::MemoryTypeName(request.memory),
                       request.image.is_image() ? " image" : " tensor",
                       " cannot take shared memory (device tensors and images, host tensors can)"));
    }
    if (it->second.size < ((bytes + 3) & ~uint64_t{3})) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, bytes, " bytes do not fit in shared-memory region ",
                       request.shared_memory, " of ", it->second.size, " bytes"));
    }
    host_memory = std::move(it->second);
    shared_memory_.erase(it);  // the tensor holds it from here on, or it goes
  }
  const core::HostMemory* shared = host_memory ? &*host_memory : nullptr;
  auto tensor =
      request.image.is_image()
          ? core::Tensor::CreateImage(facts_.instance->device, request.type, request.image,
                                      request.memory, initial, core::TensorInit::kDeferred, shared)
          : core::Tensor::Create(facts_.instance->device, request.type, request.count,
                                 *element_size, request.memory, initial,
                                 core::TensorInit::kDeferred, shared, memory_pool_.get());
  if (!tensor.ok()) {
    facts_.device->CheckLost(*facts_.instance);
    return Annotate(tensor.status(), what);
  }
  if (shared != nullptr) metrics_->shared_memory_tensors_total().Increment();
  CountUpload(request.data.size());
  AddMemory(MemoryCost(**tensor));
  if ((*tensor)->init_pending()) pending_init_.push_back(*tensor);
  charged->tensor = *std::move(tensor);
  core::Tensor* const raw = charged->tensor.get();
  tensors_.Insert(request.handle, std::shared_ptr<core::Tensor>(std::move(charged), raw));
  return absl::OkStatus();
}

absl::Status Session::AttachSharedMemory(uint64_t region,
                                         std::shared_ptr<core::SharedMemory> memory) {
  if (region == 0) return absl::InvalidArgumentError("shared-memory region 0 (regions start at 1)");
  // Imported now: a device that does not take this memory refuses it here, and the client keeps
  // the tensor on the socket path, rather than failing the tensor later.
  core::HostMemory host = core::SharedMemory::AsHostMemory(memory);
  absl::StatusOr<std::shared_ptr<const core::ImportedMemory>> imported = core::ImportHostMemory(
      *facts_.instance->device, host, absl::StrCat("shared-memory region ", region));
  if (!imported.ok()) return imported.status();
  host.imported = *std::move(imported);
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  if (shared_memory_.contains(region)) {
    return absl::AlreadyExistsError(
        absl::StrCat("shared-memory region ", region, " was passed already"));
  }
  if (shared_memory_.size() >= kMaxSharedMemoryWaiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session holds ", shared_memory_.size(),
                     " shared-memory regions that no tensor has taken yet (the most is ",
                     kMaxSharedMemoryWaiting, ")"));
  }
  shared_memory_.emplace(region, std::move(host));
  return absl::OkStatus();
}

absl::Status Session::DestroyTensor(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroyTensorLocked(handle);
}

absl::Status Session::DestroyTensorLocked(uint64_t handle) {
  // Algorithms and recordings that use the tensor keep it until they go.
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Tensor> tensor, tensors_.Take(handle));
  AddMemory(-MemoryCost(*tensor));
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

absl::StatusOr<core::AlgorithmSpec> Session::SpecLocked(const AlgorithmRequest& request) const {
  if (facts_.account != nullptr) {
    // Before anything is compiled.
    KD_RETURN_IF_ERROR(facts_.account->CheckSize(
        &Quota::source_bytes, request.shader.size(),
        absl::StrCat(request.shader_kind == AlgorithmRequest::Shader::kGlsl ? "GLSL" : "SPIR-V",
                     " of ", request.shader.size(), " bytes")));
  }
  core::AlgorithmSpec spec;
  spec.share_scope = tenant();
  KD_ASSIGN_OR_RETURN(spec.tensors, TensorsLocked(request.tensors));
  switch (request.shader_kind) {
    case AlgorithmRequest::Shader::kSpirv: {
      const absl::string_view bytes = request.shader;
      if (bytes.empty()) {
        metrics_->shader_validations_total("error").Increment();
        return absl::InvalidArgumentError("the SPIR-V is empty");
      }
      if (bytes.size() % 4 != 0) {
        metrics_->shader_validations_total("error").Increment();
        return absl::InvalidArgumentError(absl::StrCat(
            "SPIR-V of ", bytes.size(), " bytes is not a whole number of 4-byte words"));
      }
      spec.spirv.resize(bytes.size() / 4);
      std::memcpy(spec.spirv.data(), bytes.data(), bytes.size());
      break;
    }
    case AlgorithmRequest::Shader::kGlsl:
      break;  // compiled by Compiled, outside the lock
    case AlgorithmRequest::Shader::kNone:
      return absl::InvalidArgumentError("no shader given: set spirv or glsl");
  }
  spec.workgroup = request.workgroup;
  spec.spec_constants = request.spec_constants;
  spec.spec_constant_size = request.spec_constant_size;
  spec.push_constants = request.push_constants;
  if (facts_.watchdog != nullptr) {
    KD_ASSIGN_OR_RETURN(spec.cancel, CancelWordLocked());
  }
  return spec;
}

absl::StatusOr<std::shared_ptr<core::CancelWord>> Session::CancelWordLocked() const {
  if (cancel_ == nullptr) {
    KD_ASSIGN_OR_RETURN(cancel_, core::CancelWord::Create(facts_.instance->device));
  }
  return cancel_;
}

absl::Duration Session::KernelTimeLimit() const {
  absl::Duration limit = options_.max_kernel_time;
  if (facts_.account != nullptr) {
    const uint64_t ms = facts_.account->quota().kernel_time_ms;
    if (ms != 0) limit = std::min(limit, absl::Milliseconds(static_cast<int64_t>(ms)));
  }
  return limit;
}

absl::StatusOr<core::AlgorithmSpec> Session::Compiled(const AlgorithmRequest& request,
                                                      core::AlgorithmSpec spec) const {
  if (request.shader_kind == AlgorithmRequest::Shader::kGlsl) {
    const std::string name = absl::StrCat("algorithm ", request.handle);
    auto spirv =
        CompileClientGlsl(options_.glsl_compiler, options_.glsl_limits, request.shader, name);
    metrics_->shader_compilations_total(spirv.ok() ? "ok" : "error").Increment();
    if (!spirv.ok()) return spirv.status();
    spec.spirv = *std::move(spirv);
  }
  KD_RETURN_IF_ERROR(CheckDispatchQuota(spec));
  return spec;
}

absl::StatusOr<std::shared_ptr<core::Algorithm>> Session::Built(const AlgorithmRequest& request,
                                                                core::AlgorithmSpec spec) const {
  KD_ASSIGN_OR_RETURN(spec, Compiled(request, std::move(spec)));
  auto algorithm = core::Algorithm::Create(facts_.instance->device, std::move(spec));
  CountValidation(algorithm.status());
  return algorithm;
}

absl::Status Session::CheckDispatchQuota(const core::AlgorithmSpec& spec) const {
  if (facts_.account == nullptr) return absl::OkStatus();
  const std::array<uint64_t, 3> local =
      core::ShaderLocalSize(spec.spirv, spec.spec_constants, spec.spec_constant_size);
  // Each factor is below 2^32: the products of two fit, the product of six is saturated.
  const uint64_t groups = static_cast<uint64_t>(spec.workgroup.x) * spec.workgroup.y;
  const uint64_t per_group = local[0] * local[1];
  auto times = [](uint64_t a, uint64_t b) {
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
  };
  const uint64_t invocations = times(times(groups, spec.workgroup.z), times(per_group, local[2]));
  return facts_.account->CheckSize(
      &Quota::dispatch_invocations, invocations,
      absl::StrCat("a dispatch of ", spec.workgroup.x, "x", spec.workgroup.y, "x", spec.workgroup.z,
                   " workgroups of ", local[0], "x", local[1], "x", local[2], " invocations (",
                   invocations, ")"));
}

absl::Status Session::CreateAlgorithm(const AlgorithmRequest& request) {
  Touch();
  const std::string what = absl::StrCat("algorithm ", request.handle, ": ");
  absl::StatusOr<core::AlgorithmSpec> spec;
  {
    absl::MutexLock lock(&mu_);
    KD_RETURN_IF_ERROR(CheckUsableLocked());
    KD_RETURN_IF_ERROR(algorithms_.CheckNew(request.handle));
    KD_RETURN_IF_ERROR(CheckNewObjectLocked());
    spec = SpecLocked(request);
  }
  if (!spec.ok()) return Annotate(spec.status(), what);
  // Compiled and built outside the lock: the session's other calls do not wait for it.
  auto algorithm = Built(request, *std::move(spec));
  if (!algorithm.ok()) return Annotate(algorithm.status(), what);
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  // Checked again: another call may have taken the handle or the last object meanwhile.
  KD_RETURN_IF_ERROR(algorithms_.CheckNew(request.handle));
  KD_RETURN_IF_ERROR(CheckNewObjectLocked());
  algorithms_.Insert(request.handle, *std::move(algorithm));
  return absl::OkStatus();
}

absl::Status Session::CreateAlgorithmLocked(const AlgorithmRequest& request) {
  KD_RETURN_IF_ERROR(algorithms_.CheckNew(request.handle));
  KD_RETURN_IF_ERROR(CheckNewObjectLocked());
  const std::string what = absl::StrCat("algorithm ", request.handle, ": ");
  auto spec = SpecLocked(request);
  if (!spec.ok()) return Annotate(spec.status(), what);
  auto algorithm = Built(request, *std::move(spec));
  if (!algorithm.ok()) return Annotate(algorithm.status(), what);
  algorithms_.Insert(request.handle, *std::move(algorithm));
  return absl::OkStatus();
}

absl::Status Session::RebuildAlgorithm(const AlgorithmRequest& request) {
  Touch();
  const std::string what = absl::StrCat("algorithm ", request.handle, ": ");
  std::shared_ptr<core::Algorithm> algorithm;
  absl::StatusOr<core::AlgorithmSpec> spec;
  {
    absl::MutexLock lock(&mu_);
    KD_RETURN_IF_ERROR(CheckUsableLocked());
    KD_ASSIGN_OR_RETURN(algorithm, algorithms_.Find(request.handle));
    spec = SpecLocked(request);
  }
  if (!spec.ok()) return Annotate(spec.status(), what);
  // Outside the lock, as for CreateAlgorithm; the algorithm swaps its build in under its own.
  spec = Compiled(request, *std::move(spec));
  if (!spec.ok()) return Annotate(spec.status(), what);
  absl::Status rebuilt = algorithm->Rebuild(*std::move(spec));
  CountValidation(rebuilt);
  return Annotate(rebuilt, what);
}

absl::Status Session::RebuildAlgorithmLocked(const AlgorithmRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm, algorithms_.Find(request.handle));
  const std::string what = absl::StrCat("algorithm ", request.handle, ": ");
  auto spec = SpecLocked(request);
  if (spec.ok()) spec = Compiled(request, *std::move(spec));
  if (!spec.ok()) return Annotate(spec.status(), what);
  absl::Status rebuilt = algorithm->Rebuild(*std::move(spec));
  CountValidation(rebuilt);
  return Annotate(rebuilt, what);
}

absl::Status Session::SetPushConstants(const PushConstantsRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return SetPushConstantsLocked(request);
}

absl::Status Session::SetPushConstantsLocked(const PushConstantsRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Algorithm> algorithm,
                      algorithms_.Find(request.algorithm));
  return Annotate(algorithm->SetPushConstants(request.values),
                  absl::StrCat("algorithm ", request.algorithm, ": "));
}

absl::Status Session::DestroyAlgorithm(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroyAlgorithmLocked(handle);
}

absl::Status Session::DestroyAlgorithmLocked(uint64_t handle) {
  return algorithms_.Take(handle).status();
}

// ---------------------------------------------------------------------------------------------
// Sequences

absl::Status Session::CreateSequence(const SequenceRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return CreateSequenceLocked(request);
}

absl::Status Session::CreateSequenceLocked(const SequenceRequest& request) {
  KD_RETURN_IF_ERROR(sequences_.CheckNew(request.handle));
  KD_RETURN_IF_ERROR(CheckNewObjectLocked());
  const std::string what = absl::StrCat("sequence ", request.handle, ": ");
  if (request.queue >= queue_count()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "queue ", request.queue,
                                                   " out of range: the session has ", queue_count(),
                                                   " queue(s)"));
  }
  if (request.total_timestamps > kMaxTimestamps) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, request.total_timestamps, " timestamps asked for; at most ", kMaxTimestamps));
  }
  auto sequence = core::Sequence::Create(facts_.instance->device, facts_.queues[request.queue],
                                         request.total_timestamps);
  if (!sequence.ok()) return Annotate(sequence.status(), what);
  auto entry = std::make_shared<SequenceEntry>();
  entry->sequence = *std::move(sequence);
  sequences_.Insert(request.handle, std::move(entry));
  return absl::OkStatus();
}

absl::StatusOr<core::Op> Session::OpLocked(const HandleOp& op) const {
  core::Op resolved;
  resolved.kind = op.kind;
  KD_ASSIGN_OR_RETURN(resolved.tensors, TensorsLocked(op.tensors));
  if (op.kind == core::OpKind::kDispatch) {
    KD_ASSIGN_OR_RETURN(resolved.algorithm, algorithms_.Find(op.algorithm));
    resolved.push_constants = op.push_constants;
  }
  resolved.barrier = op.barrier;
  return resolved;
}

absl::Status Session::Record(const RecordRequest& request) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  return RecordLocked(request);
}

absl::Status Session::RecordLocked(const RecordRequest& request) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry, sequences_.Find(request.sequence));
  KD_RETURN_IF_ERROR(SettleLocked(request.sequence, *entry));
  const std::string what = absl::StrCat("record into sequence ", request.sequence, ": ");
  auto action_error = [&](size_t i, const absl::Status& status) {
    return Annotate(NameOperands(status, request.actions[i].op),
                    absl::StrCat(what, "action ", i, ": "));
  };
  // Every operation is resolved and checked before any action is applied, so that a bad one
  // changes nothing.
  // The operations the sequence will hold after each action, against ops_per_sequence.
  uint64_t recorded = entry->ops, most = entry->ops;
  for (const SequenceAction& action : request.actions) {
    if (action.kind == SequenceAction::Kind::kRecord) most = std::max(most, ++recorded);
    if (action.kind == SequenceAction::Kind::kClear) recorded = 0;
  }
  if (facts_.account != nullptr && most > entry->ops) {
    KD_RETURN_IF_ERROR(
        Annotate(facts_.account->CheckCount(&Quota::ops_per_sequence, entry->ops, most - entry->ops,
                                            "operations recorded in the sequence"),
                 what));
  }
  std::vector<core::Op> ops(request.actions.size());
  for (size_t i = 0; i < request.actions.size(); ++i) {
    if (request.actions[i].kind != SequenceAction::Kind::kRecord) continue;
    absl::StatusOr<core::Op> op = OpLocked(request.actions[i].op);
    if (!op.ok()) return Annotate(op.status(), absl::StrCat(what, "action ", i, ": "));
    if (absl::Status valid = core::ValidateOp(*op, *facts_.instance->device); !valid.ok()) {
      return action_error(i, valid);
    }
    ops[i] = *std::move(op);
  }
  core::Sequence& sequence = *entry->sequence;
  for (size_t i = 0; i < request.actions.size(); ++i) {
    absl::Status s;
    switch (request.actions[i].kind) {
      case SequenceAction::Kind::kRecord:
        s = sequence.Record(std::move(ops[i]));
        if (s.ok()) ++entry->ops;
        break;
      case SequenceAction::Kind::kClear:
        s = sequence.Clear();
        if (s.ok()) entry->ops = 0;
        break;
      case SequenceAction::Kind::kRerecord:
        s = sequence.Rerecord();
        break;
      case SequenceAction::Kind::kNothing:
        break;
    }
    if (!s.ok()) return action_error(i, s);
  }
  return absl::OkStatus();
}

absl::Status Session::DestroySequence(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  return DestroySequenceLocked(handle);
}

absl::Status Session::DestroySequenceLocked(uint64_t handle) {
  // A submission in flight keeps the sequence (the waiter holds it) until it completes.
  KD_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry, sequences_.Take(handle));
  ReleaseSequence(entry);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> Session::GetTimestamps(uint64_t handle) {
  Touch();
  absl::MutexLock lock(&mu_);
  KD_RETURN_IF_ERROR(CheckOpenLocked());
  KD_ASSIGN_OR_RETURN(std::shared_ptr<SequenceEntry> entry, sequences_.Find(handle));
  return entry->sequence->Timestamps();
}

}  // namespace komputed::server
