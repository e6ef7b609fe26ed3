#include "host_writes.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "host_data.h"
#include "komputed/core/op_semantics.h"

namespace komputed::server {

void HostWrites::ChangedLocked(const core::Tensor* tensor) {
  ++clock_;
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) {
    if (reads_ == 0) return;  // no read to tell
    it = tensors_.emplace(tensor, State()).first;
  }
  it->second.last_write = clock_;
}

void HostWrites::Write(const core::Tensor& tensor, uint64_t offset, absl::string_view data) {
  absl::MutexLock lock(&mu_);
  std::memcpy(HostData(tensor) + offset, data.data(), data.size());
  ChangedLocked(&tensor);
}

void HostWrites::Write(const core::Tensor& tensor, const std::vector<StagedWrite>& pieces) {
  absl::MutexLock lock(&mu_);
  char* const host = HostData(tensor);
  for (const StagedWrite& piece : pieces) {
    std::memcpy(host + piece.offset, piece.data.data(), piece.data.size());
  }
  ChangedLocked(&tensor);
}

std::string HostWrites::Copy(const core::Tensor& tensor) const {
  absl::MutexLock lock(&mu_);
  return std::string(HostData(tensor), tensor.byte_size());
}

HostWrites::Token HostWrites::Submitting(std::vector<std::shared_ptr<core::Tensor>> tensors) {
  if (tensors.empty()) return nullptr;
  {
    absl::MutexLock lock(&mu_);
    ++clock_;
    for (const auto& tensor : tensors) {
      State& state = tensors_[tensor.get()];
      ++state.submissions;
      state.last_write = clock_;
    }
  }
  return std::make_shared<Submission>(shared_from_this(), std::move(tensors));
}

HostWrites::Submission::~Submission() {
  absl::MutexLock lock(&writes_->mu_);
  writes_->FinishedLocked(tensors_);
}

void HostWrites::FinishedLocked(const std::vector<std::shared_ptr<core::Tensor>>& tensors) {
  ++clock_;
  for (const auto& tensor : tensors) {
    auto it = tensors_.find(tensor.get());
    if (it == tensors_.end()) continue;
    it->second.last_write = clock_;
    if (--it->second.submissions == 0 && reads_ == 0) tensors_.erase(it);
  }
}

uint64_t HostWrites::BeginRead() {
  absl::MutexLock lock(&mu_);
  ++reads_;
  return clock_;
}

void HostWrites::EndRead() {
  absl::MutexLock lock(&mu_);
  if (--reads_ > 0) return;
  // No read is left to tell of changes: only the submissions in flight stay.
  absl::erase_if(tensors_, [](const auto& entry) { return entry.second.submissions == 0; });
}

absl::Status HostWrites::Read(const core::Tensor& tensor, uint64_t since, uint64_t offset,
                              uint64_t size, char* to) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(&tensor);
  if (it != tensors_.end()) {
    if (it->second.submissions > 0) {
      return absl::FailedPreconditionError(
          "a submission in flight may change its host data (a sync_local into it, or a dispatch "
          "or copy on a host tensor): read it once that eval has completed");
    }
    if (it->second.last_write > since) {
      return absl::AbortedError(
          "its host data changed during the read (a WriteTensor, an eval's upload or a "
          "submission wrote it): read it again");
    }
  }
  if (size > 0) std::memcpy(to, HostData(tensor) + offset, size);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<core::Tensor>> TensorsOf(const core::Op& op) {
  std::vector<std::shared_ptr<core::Tensor>> tensors = op.tensors;
  if (op.kind == core::OpKind::kDispatch && op.algorithm != nullptr) {
    for (auto& tensor : op.algorithm->tensors()) tensors.push_back(std::move(tensor));
  }
  return tensors;
}

std::vector<std::shared_ptr<core::Tensor>> HostDataWritten(const std::vector<core::Op>& ops) {
  std::vector<std::shared_ptr<core::Tensor>> written;
  absl::flat_hash_set<const core::Tensor*> seen;
  auto add = [&](const std::shared_ptr<core::Tensor>& tensor) {
    if (HostData(*tensor) != nullptr && seen.insert(tensor.get()).second) written.push_back(tensor);
  };
  for (const core::Op& op : ops) {
    for (const auto& tensor : TensorsOf(op)) {
      if (core::HostDataComesBack(op.kind, tensor->memory_type())) add(tensor);
    }
    if (op.kind == core::OpKind::kCopy) {
      std::vector<core::TensorFacts> facts;
      facts.reserve(op.tensors.size());
      for (const auto& tensor : op.tensors) facts.push_back(tensor->facts());
      for (size_t i : core::CopyHostTargets(facts)) add(op.tensors[i]);
    }
  }
  return written;
}

}  // namespace komputed::server
