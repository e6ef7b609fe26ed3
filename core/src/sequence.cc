#include "komputed/core/sequence.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/spin.h"
#include "komputed/core/status.h"

namespace komputed::core {
namespace {

constexpr VkAccessFlags kAnyShaderAccess = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
constexpr VkAccessFlags kAnyTransferAccess =
    VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

void GlobalBarrier(VkCommandBuffer cb, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
                   VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
  VkMemoryBarrier b{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, &b, 0, nullptr, 0, nullptr);
}

}  // namespace

absl::Status ValidateOp(const Op& op, const Device& device) {
  const absl::string_view name = OpName(op.kind);
  std::vector<TensorFacts> facts;
  facts.reserve(op.tensors.size());
  for (size_t i = 0; i < op.tensors.size(); ++i) {
    const Tensor* t = op.tensors[i].get();
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": tensor ", i, " is null"));
    }
    if (&t->device() != &device) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, ": tensor ", i, " belongs to another device"));
    }
    facts.push_back(t->facts());
  }
  KD_RETURN_IF_ERROR(ValidateOpTensors(op.kind, facts));
  // A barrier over no tensors records nothing, so its masks do not matter.
  if (op.kind == OpKind::kBarrier && !op.tensors.empty()) return ValidateBarrierMasks(op.barrier);
  if (op.kind != OpKind::kDispatch) return absl::OkStatus();
  if (op.algorithm == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no algorithm"));
  }
  if (&op.algorithm->device() != &device) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": the algorithm belongs to another device"));
  }
  if (op.push_constants.has_value()) {
    if (absl::Status s =
            CheckPushConstantSize(op.push_constants->size(), op.algorithm->push_constant_size());
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

std::vector<TensorFacts> FactsOf(const std::vector<std::shared_ptr<Tensor>>& tensors) {
  std::vector<TensorFacts> facts;
  facts.reserve(tensors.size());
  for (const auto& t : tensors) facts.push_back(t->facts());
  return facts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Sequence>> Sequence::Create(std::shared_ptr<Device> device,
                                                           uint32_t queue,
                                                           uint32_t total_timestamps) {
  if (queue >= device->queue_count()) {
    return absl::InvalidArgumentError(absl::StrCat("queue index ", queue,
                                                   " out of range: ", device->queue_count(),
                                                   " queue(s) were requested for the device"));
  }
  const Queue& q = device->queue(queue);
  if (total_timestamps > 0 && q.timestamp_valid_bits == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "queue family ", q.family, " does not support timestamps (timestampValidBits = 0)"));
  }
  auto s = std::unique_ptr<Sequence>(new Sequence());
  s->device_ = device;
  s->queue_ = queue;
  s->total_timestamps_ = total_timestamps;
  VkDevice dev = device->handle();
  {
    absl::MutexLock lock(&s->mu_);
    KD_RETURN_IF_ERROR(s->AllocateLocked());
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkFence fence = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(device->Check(vkCreateFence(dev, &fi, nullptr, &fence), "vkCreateFence"));
  s->fence_ = FenceHandle(dev, fence);
  if (device->timeline_supported()) {
    VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    ti.initialValue = 0;
    VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    si.pNext = &ti;
    VkSemaphore semaphore = VK_NULL_HANDLE;
    KD_RETURN_IF_ERROR(
        device->Check(vkCreateSemaphore(dev, &si, nullptr, &semaphore), "vkCreateSemaphore"));
    s->timeline_ = SemaphoreHandle(dev, semaphore);
  }
  if (total_timestamps > 0) {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = total_timestamps;
    VkQueryPool query_pool = VK_NULL_HANDLE;
    KD_RETURN_IF_ERROR(
        device->Check(vkCreateQueryPool(dev, &qi, nullptr, &query_pool), "vkCreateQueryPool"));
    s->query_pool_ = QueryPoolHandle(dev, query_pool);
  }
  return s;
}

Sequence::~Sequence() {
  absl::MutexLock lock(&mu_);
  if (!running_ && timeline_value_ == 0) return;
  // Bounded: the command buffer, and what its commands use, must not be freed while the device
  // may still run them. The fence can signal before the driver is done with the timeline
  // semaphore of the same submission, so that is waited for as well.
  constexpr absl::Duration kReleaseWait = absl::Seconds(10);
  const absl::Status waited = running_ ? WaitInFlightLocked(kReleaseWait) : absl::OkStatus();
  bool idle = waited.ok();
  if (!waited.ok() && !absl::IsDeadlineExceeded(waited)) {
    // A lost device: its queue returns at once (a loss injected by tests lets the work finish).
    Queue& q = device_->queue(queue_);
    absl::MutexLock queue_lock(&q.mu);
    vkQueueWaitIdle(q.handle);
    return;
  }
  if (idle && timeline_) {
    VkSemaphore semaphore = timeline_.get();
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.semaphoreCount = 1;
    wi.pSemaphores = &semaphore;
    wi.pValues = &timeline_value_;
    idle = vkWaitSemaphores(device_->handle(), &wi, absl::ToInt64Nanoseconds(kReleaseWait)) ==
           VK_SUCCESS;
  }
  if (idle) return;
  // The device did not finish in time (a hung or lost device): its objects are kept rather than
  // freed under a running submission.
  spdlog::error(
      "device {}: a sequence was destroyed while its submission still ran after {}; its command "
      "buffer and the objects it uses are kept until the process exits",
      device_->info().index, absl::FormatDuration(kReleaseWait));
  struct Kept {
    CommandPoolHandle pool;
    FenceHandle fence;
    QueryPoolHandle query_pool;
    SemaphoreHandle timeline;
    std::vector<Op> ops;
    std::vector<Recorded> keep;
    std::shared_ptr<TensorInitBatch> prologue;
  };
  new Kept{
      std::move(pool_),    std::move(fence_),   std::move(query_pool_), std::move(timeline_),
      std::move(all_ops_), std::move(cb_keep_), std::move(prologue_)};  // deliberately never freed
  cb_ops_.clear();
}

absl::Status Sequence::ValidateLocked(const Op& op) const { return ValidateOp(op, *device_); }

absl::Status Sequence::AllocateLocked() {
  if (pool_) return absl::OkStatus();
  const VkDevice dev = device_->handle();
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = device_->queue(queue_).family;
  VkCommandPool pool = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device_->Check(vkCreateCommandPool(dev, &pi, nullptr, &pool), "vkCreateCommandPool"));
  CommandPoolHandle handle(dev, pool);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device_->Check(vkAllocateCommandBuffers(dev, &ai, &cb), "vkAllocateCommandBuffers"));
  pool_ = std::move(handle);
  cb_ = cb;
  return absl::OkStatus();
}

bool Sequence::Release(absl::Time unused_since) {
  absl::MutexLock lock(&mu_);
  if (running_ || recording_ || !pool_ || last_used_ >= unused_since) return false;
  // Not running: the last submission was waited for, so the device is done with the buffer.
  pool_ = CommandPoolHandle();
  cb_ = VK_NULL_HANDLE;
  return true;
}

bool Sequence::IsReleased() const {
  absl::MutexLock lock(&mu_);
  return !pool_;
}

absl::Status Sequence::ReplayLocked() {
  std::vector<Op> ops = std::move(cb_ops_);
  std::vector<Recorded> keep = std::move(cb_keep_);
  const bool host_steps = host_steps_;
  absl::Status s = BeginLocked();
  if (s.ok()) {
    size_t dispatch = 0;
    for (Op& op : ops) {
      const std::vector<uint8_t>* push_constants =
          op.kind == OpKind::kDispatch ? &keep[dispatch++].push_constants : nullptr;
      RecordLocked(op, push_constants);
    }
    recording_ = false;
    s = device_->Check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer");
  }
  host_steps_ = host_steps;
  if (!s.ok()) {
    // Released again: the next submission tries once more, with the same commands.
    pool_ = CommandPoolHandle();
    cb_ = VK_NULL_HANDLE;
    cb_keep_ = std::move(keep);
  }
  cb_ops_ = std::move(ops);
  return s;
}

absl::Status Sequence::BeginLocked() {
  KD_RETURN_IF_ERROR(AllocateLocked());
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  KD_RETURN_IF_ERROR(device_->Check(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer"));
  recording_ = true;
  host_steps_ = true;
  cb_ops_.clear();
  cb_keep_.clear();
  timestamps_written_ = 0;
  if (query_pool_) {
    vkCmdResetQueryPool(cb_, query_pool_.get(), 0, total_timestamps_);
    vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, query_pool_.get(), 0);
    timestamps_written_ = 1;
  }
  return absl::OkStatus();
}

void Sequence::RecordLocked(Op& op, const std::vector<uint8_t>* push_constants) {
  VkCommandBuffer cb = cb_;
  switch (op.kind) {
    case OpKind::kSyncDevice:
      GlobalBarrier(cb, kWorkStages, kAnyShaderAccess | kAnyTransferAccess,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
      for (const auto& t : op.tensors) t->RecordToDevice(cb);
      break;
    case OpKind::kSyncLocal:
      GlobalBarrier(cb, kWorkStages, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, kAnyTransferAccess);
      for (const auto& t : op.tensors) t->RecordToHost(cb);
      GlobalBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
      break;
    case OpKind::kCopy:
      GlobalBarrier(cb, kWorkStages, kAnyShaderAccess | kAnyTransferAccess,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, kAnyTransferAccess);
      for (size_t i = 1; i < op.tensors.size(); ++i)
        op.tensors[0]->RecordCopyTo(cb, *op.tensors[i]);
      break;
    case OpKind::kDispatch: {
      GlobalBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, kAnyShaderAccess);
      Recorded& r = cb_keep_.emplace_back();
      r.algorithm = op.algorithm.get();
      r.pipeline =
          op.algorithm->RecordDispatch(cb, &r.generation, push_constants, &r.push_constants);
      break;
    }
    case OpKind::kBarrier: {
      const BarrierMasks& b = op.barrier;
      for (const auto& t : op.tensors) {
        t->RecordBarrier(cb, b.src_access, b.dst_access, b.src_stage, b.dst_stage, b.primary);
      }
      break;
    }
  }
  if (query_pool_ && timestamps_written_ < total_timestamps_) {
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_.get(),
                        timestamps_written_++);
  }
}

absl::Status Sequence::Record(Op op) {
  absl::MutexLock lock(&mu_);
  if (running_) {
    return absl::FailedPreconditionError("cannot record: the sequence is running; await it first");
  }
  KD_RETURN_IF_ERROR(ValidateLocked(op));
  // An override stays with the algorithm (op_semantics.h); the size was checked above.
  if (op.kind == OpKind::kDispatch && op.push_constants.has_value()) {
    KD_RETURN_IF_ERROR(op.algorithm->SetPushConstants(*op.push_constants));
  }
  if (!recording_) KD_RETURN_IF_ERROR(BeginLocked());
  last_used_ = absl::Now();
  RecordLocked(op);
  cb_ops_.push_back(op);
  all_ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::StatusOr<VkCommandBuffer> Sequence::ReadyLocked() {
  if (running_) {
    return absl::FailedPreconditionError("the sequence is already running; await it first");
  }
  if (!recording_ && cb_ops_.empty()) return VK_NULL_HANDLE;
  for (const Recorded& r : cb_keep_) {
    if (r.algorithm->generation() != r.generation) {
      return absl::FailedPreconditionError(
          "an algorithm recorded in this sequence was rebuilt since; rerecord the sequence");
    }
  }
  if (recording_) {
    KD_RETURN_IF_ERROR(device_->Check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer"));
    recording_ = false;
  }
  if (!pool_) KD_RETURN_IF_ERROR(ReplayLocked());
  if (device_->lost()) {
    return absl::UnavailableError(absl::StrCat("device ", device_->info().index, " was lost"));
  }
  return cb_;
}

void Sequence::SubmittedLocked(std::shared_ptr<TensorInitBatch> prologue, uint64_t order,
                               bool fenced) {
  timeline_value_ += 1;
  submit_order_ = order;
  fenced_ = fenced;
  running_ = true;
  if (prologue != nullptr) prologue->Submitted();
  prologue_ = std::move(prologue);
}

absl::Status Sequence::Submit(std::shared_ptr<TensorInitBatch> prologue) {
  absl::MutexLock lock(&mu_);
  const Submission alone{this, std::move(prologue)};
  absl::Status status;
  SubmitLockedTogether(absl::MakeConstSpan(&alone, 1), absl::MakeSpan(&status, 1));
  return status;
}

std::vector<absl::Status> Sequence::SubmitTogether(absl::Span<const Submission> batch) {
  std::vector<absl::Status> statuses(batch.size());
  // Together only where one vkQueueSubmit can carry them all and each can be followed on its own.
  bool together = !batch.empty();
  for (const Submission& s : batch) {
    together = together && s.sequence->timeline_ &&
               s.sequence->device_ == batch[0].sequence->device_ &&
               s.sequence->queue_ == batch[0].sequence->queue_;
  }
  if (!together) {
    for (size_t i = 0; i < batch.size(); ++i)
      statuses[i] = batch[i].sequence->Submit(batch[i].prologue);
    return statuses;
  }
  // Every sequence is locked for the whole submission, in the order of their addresses (the only
  // place that holds two sequences' locks).
  std::vector<Sequence*> order;
  for (const Submission& s : batch) order.push_back(s.sequence);
  std::sort(order.begin(), order.end(), std::less<Sequence*>());
  if (std::adjacent_find(order.begin(), order.end()) != order.end()) {
    for (absl::Status& s : statuses) {
      s = absl::InvalidArgumentError("a sequence appears twice in one submission");
    }
    return statuses;
  }
  for (Sequence* s : order) s->mu_.Lock();
  SubmitLockedTogether(batch, absl::MakeSpan(statuses));
  for (auto it = order.rbegin(); it != order.rend(); ++it) (*it)->mu_.Unlock();
  return statuses;
}

void Sequence::SubmitLockedTogether(absl::Span<const Submission> batch,
                                    absl::Span<absl::Status> statuses) {
  absl::InlinedVector<Device::SubmitItem, 1> items;
  absl::InlinedVector<size_t, 1> submitted;  // indices into batch, in items' order
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i].sequence;
    absl::StatusOr<VkCommandBuffer> cb = s.ReadyLocked();
    if (!cb.ok()) {
      statuses[i] = cb.status();
      continue;
    }
    if (*cb == VK_NULL_HANDLE) continue;  // nothing recorded: OK, nothing submitted
    const std::shared_ptr<TensorInitBatch>& prologue = batch[i].prologue;
    items.push_back({*cb, prologue != nullptr ? prologue->command_buffer() : VK_NULL_HANDLE,
                     s.timeline_.get(), s.timeline_value_ + 1});
    submitted.push_back(i);
  }
  if (items.empty()) return;
  Sequence& last = *batch[submitted.back()].sequence;
  Device& device = *last.device_;
  VkFence fence = last.fence_.get();
  absl::Status s = device.Check(vkResetFences(device.handle(), 1, &fence), "vkResetFences");
  uint64_t first = 0;
  if (s.ok()) s = device.SubmitBatch(last.queue_, items, fence, &first);
  for (size_t k = 0; k < submitted.size(); ++k) {
    const size_t i = submitted[k];
    if (!s.ok()) {
      statuses[i] = s;
      continue;
    }
    batch[i].sequence->SubmittedLocked(batch[i].prologue, first + k,
                                       /*fenced=*/k + 1 == submitted.size());
  }
}

absl::Status Sequence::WaitInFlightLocked(absl::Duration timeout) const {
  if (fenced_) return device_->Wait(fence_.get(), timeout);
  return device_->WaitTimeline(timeline_.get(), timeline_value_, timeout);
}

absl::Status Sequence::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!running_) return absl::OkStatus();
  absl::Status s = WaitInFlightLocked(timeout);
  if (absl::IsDeadlineExceeded(s)) return s;
  running_ = false;
  prologue_.reset();
  last_used_ = absl::Now();  // idle from the submission's end
  if (!s.ok()) return s;
  FinishLocked();
  return absl::OkStatus();
}

void Sequence::FinishLocked() {
  // Host steps: a copy carries the source's host data to destinations with staging buffers.
  // A cleared command buffer runs without them.
  for (const Op& op : cb_ops_) {
    if (!host_steps_ || op.kind != OpKind::kCopy) continue;
    const Tensor& src = *op.tensors[0];
    for (size_t i : CopyHostTargets(FactsOf(op.tensors))) {
      std::memcpy(op.tensors[i]->host_data(), src.host_data(), src.byte_size());
    }
  }
  timestamps_.clear();
  if (query_pool_ && timestamps_written_ > 0) {
    std::vector<uint64_t> raw(timestamps_written_);
    VkResult r = vkGetQueryPoolResults(device_->handle(), query_pool_.get(), 0, timestamps_written_,
                                       raw.size() * sizeof(uint64_t), raw.data(), sizeof(uint64_t),
                                       VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r != VK_SUCCESS) {
      spdlog::warn("reading timestamps failed: {}", std::string(VkResultName(r)));
      return;
    }
    const uint32_t bits = device_->queue(queue_).timestamp_valid_bits;
    const uint64_t mask = bits >= 64 ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
    const double period = device_->limits().timestampPeriod;
    for (uint64_t ticks : raw) {
      timestamps_.push_back(
          static_cast<uint64_t>(std::llround(static_cast<double>(ticks & mask) * period)));
    }
  }
}

absl::Status Sequence::End() {
  absl::MutexLock lock(&mu_);
  if (running_) {
    return absl::FailedPreconditionError("cannot end: the sequence is running; await it first");
  }
  if (!recording_) return absl::OkStatus();
  KD_RETURN_IF_ERROR(device_->Check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer"));
  recording_ = false;
  return absl::OkStatus();
}

absl::Status Sequence::Clear() {
  absl::MutexLock lock(&mu_);
  if (running_) {
    return absl::FailedPreconditionError("cannot clear: the sequence is running; await it first");
  }
  if (recording_) {
    KD_RETURN_IF_ERROR(device_->Check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer"));
    recording_ = false;
  }
  // cb_ops_ and cb_keep_ stay: they hold what the kept command buffer uses.
  all_ops_.clear();
  host_steps_ = false;
  return absl::OkStatus();
}

absl::Status Sequence::Rerecord() {
  absl::MutexLock lock(&mu_);
  if (running_) return absl::FailedPreconditionError("cannot rerecord: the sequence is running");
  std::vector<Op> ops = all_ops_;
  for (Op& op : ops) KD_RETURN_IF_ERROR(ValidateLocked(op));
  if (pool_) {
    KD_RETURN_IF_ERROR(device_->Check(vkResetCommandBuffer(cb_, 0), "vkResetCommandBuffer"));
  }
  last_used_ = absl::Now();
  recording_ = false;
  cb_ops_.clear();
  cb_keep_.clear();
  for (Op& op : ops) {
    if (op.kind == OpKind::kDispatch && op.push_constants.has_value()) {
      KD_RETURN_IF_ERROR(op.algorithm->SetPushConstants(*op.push_constants));
    }
    if (!recording_) KD_RETURN_IF_ERROR(BeginLocked());
    RecordLocked(op);
    cb_ops_.push_back(op);
  }
  return absl::OkStatus();
}

bool Sequence::IsRunning() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

std::vector<Op> Sequence::RecordedOps() const {
  absl::MutexLock lock(&mu_);
  return cb_ops_;
}

bool Sequence::Poll(absl::Duration limit) const {
  const Completion completion = InFlight();
  if (!completion.running) return true;
  const absl::Time until = absl::Now() + limit;
  while (true) {
    if (completion.fence != VK_NULL_HANDLE) {
      if (vkGetFenceStatus(device_->handle(), completion.fence) != VK_NOT_READY) return true;
    } else {
      uint64_t value = 0;
      const VkResult r = vkGetSemaphoreCounterValue(device_->handle(), completion.timeline, &value);
      if (r != VK_SUCCESS || value >= completion.value) return true;  // errors: Wait reports them
    }
    if (absl::Now() >= until) return false;
    CpuRelax();
  }
}

bool Sequence::IsRecording() const {
  absl::MutexLock lock(&mu_);
  return recording_;
}

bool Sequence::HasCommands() const {
  absl::MutexLock lock(&mu_);
  return recording_ || !cb_ops_.empty();  // as ReadyLocked decides
}

std::vector<uint64_t> Sequence::Timestamps() const {
  absl::MutexLock lock(&mu_);
  return timestamps_;
}

Sequence::Completion Sequence::InFlight() const {
  absl::MutexLock lock(&mu_);
  if (!running_) return {};
  return {true, fenced_ ? fence_.get() : VK_NULL_HANDLE, timeline_.get(), timeline_value_,
          submit_order_};
}

}  // namespace komputed::core
