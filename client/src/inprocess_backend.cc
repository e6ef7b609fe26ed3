// The in-process backend: kp objects map one to one onto core objects.
#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backend.h"
#include "komputed/core/memory_pool.h"
#include "komputed/core/sequence.h"
#include "komputed/core/spin.h"
#include "komputed/core/status.h"

namespace kp::internal {

namespace {

// $name in microseconds, when it is set to 0..10000.
std::optional<absl::Duration> EnvMicroseconds(const char* name) {
  const char* value = std::getenv(name);
  int64_t us = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &us) || us < 0 || us > 10000) {
    return std::nullopt;
  }
  return absl::Microseconds(us);
}

}  // namespace

absl::Duration WaitSpin(VkPhysicalDeviceType type) {
  if (std::optional<absl::Duration> set = EnvMicroseconds("KOMPUTED_FENCE_SPIN_US")) return *set;
  if (type == VK_PHYSICAL_DEVICE_TYPE_CPU) return absl::ZeroDuration();
  return absl::Microseconds(50);
}

absl::Duration WaitSpinLimit(absl::Duration base) {
  return std::max(base, EnvMicroseconds("KOMPUTED_FENCE_SPIN_MAX_US").value_or(base * 10));
}

namespace {

namespace core = komputed::core;

class LocalTensor final : public BackendTensor {
 public:
  LocalTensor(const void* owner, std::shared_ptr<core::Tensor> tensor)
      : BackendTensor(owner), tensor_(std::move(tensor)) {}
  void* host_data() override { return tensor_->host_data(); }
  const std::shared_ptr<core::Tensor>& tensor() const { return tensor_; }

 private:
  std::shared_ptr<core::Tensor> tensor_;
};

class LocalAlgorithm final : public BackendAlgorithm {
 public:
  LocalAlgorithm(const void* owner, std::shared_ptr<core::Algorithm> algorithm)
      : BackendAlgorithm(owner), algorithm_(std::move(algorithm)) {}
  const std::shared_ptr<core::Algorithm>& algorithm() const { return algorithm_; }
  std::vector<uint8_t> PushConstants() const override { return algorithm_->push_constants(); }

 private:
  std::shared_ptr<core::Algorithm> algorithm_;
};

absl::Status NotMine(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat("the ", what, " belongs to another Manager"));
}

absl::StatusOr<std::vector<std::shared_ptr<core::Tensor>>> Unwrap(
    const void* owner, const std::vector<std::shared_ptr<BackendTensor>>& tensors) {
  std::vector<std::shared_ptr<core::Tensor>> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t == nullptr) return absl::InvalidArgumentError("a tensor is null or destroyed");
    if (t->owner() != owner) return NotMine("tensor");
    out.push_back(static_cast<const LocalTensor&>(*t).tensor());
  }
  return out;
}

absl::StatusOr<std::shared_ptr<core::Algorithm>> Unwrap(const void* owner,
                                                        const BackendAlgorithm* algorithm) {
  if (algorithm == nullptr) return absl::InvalidArgumentError("the algorithm is not initialised");
  if (algorithm->owner() != owner) return NotMine("algorithm");
  return static_cast<const LocalAlgorithm*>(algorithm)->algorithm();
}

class LocalSequence final : public BackendSequence {
 public:
  // `spin`: how long a wait polls the fence before it sleeps, at least (WaitSpin).
  LocalSequence(const void* owner, std::unique_ptr<core::Sequence> sequence, absl::Duration spin)
      : BackendSequence(owner), sequence_(std::move(sequence)), spin_(spin, WaitSpinLimit(spin)) {}

  absl::Status Record(const Op& op) override {
    const void* me = owner();
    core::Op local{op.kind, {}, nullptr, op.push_constants, op.barrier};
    KD_ASSIGN_OR_RETURN(local.tensors, Unwrap(me, op.tensors));
    if (op.algorithm != nullptr) {
      KD_ASSIGN_OR_RETURN(local.algorithm, Unwrap(me, op.algorithm.get()));
    }
    return sequence_->Record(std::move(local));
  }
  absl::Status Submit() override {
    KD_RETURN_IF_ERROR(sequence_->Submit());
    absl::MutexLock lock(&mu_);
    submitted_ = absl::Now();
    unobserved_ = true;
    return absl::OkStatus();
  }
  absl::Status Wait(absl::Duration timeout) override {
    // A short submission ends sooner than a sleeping wait wakes: poll first, then sleep; for as
    // long as the sequence's submissions have been taking (spin_).
    if (spin_.base() <= absl::ZeroDuration()) return sequence_->Wait(timeout);
    absl::Time submitted;
    {
      absl::MutexLock lock(&mu_);
      if (!unobserved_) return sequence_->Wait(timeout);  // seen complete already, or never run
      submitted = submitted_;
    }
    const absl::Time start = absl::Now();
    const bool seen_running = !sequence_->Poll(absl::ZeroDuration());
    absl::Time done = absl::InfiniteFuture();  // when a look saw it complete
    if (!seen_running || sequence_->Poll(std::min(timeout, spin_.Window(submitted, start)))) {
      done = absl::Now();
    }
    // What is left of the timeout after the polling; and the host steps.
    const absl::Status status =
        sequence_->Wait(std::max(absl::ZeroDuration(), start + timeout - absl::Now()));
    if (!status.ok()) return status;  // still running (seen by a later wait), or failed
    absl::MutexLock lock(&mu_);
    if (unobserved_ && submitted_ == submitted) {
      spin_.Observe(std::min(done, absl::Now()) - submitted, seen_running);
      unobserved_ = false;
    }
    return status;
  }
  absl::Status End() override { return sequence_->End(); }
  absl::Status Clear() override { return sequence_->Clear(); }
  absl::Status Rerecord() override { return sequence_->Rerecord(); }
  bool IsRunning() const override { return sequence_->IsRunning(); }
  bool IsRecording() const override { return sequence_->IsRecording(); }
  std::vector<uint64_t> Timestamps() const override { return sequence_->Timestamps(); }

 private:
  std::unique_ptr<core::Sequence> sequence_;
  core::SpinWindow spin_;
  absl::Mutex mu_;
  absl::Time submitted_ ABSL_GUARDED_BY(mu_);     // the last submission's
  bool unobserved_ ABSL_GUARDED_BY(mu_) = false;  // no wait has seen it complete yet
};

class InProcessBackend final : public Backend {
 public:
  explicit InProcessBackend(std::shared_ptr<core::Device> device)
      : device_(std::move(device)),
        spin_(WaitSpin(device_->properties().deviceType)),
        memory_pool_(core::MemoryPool::Create(device_)) {}

  // The device goes with the last object that holds it.
  absl::Status Close(absl::Duration) override { return absl::OkStatus(); }

  absl::StatusOr<std::shared_ptr<BackendTensor>> CreateTensor(const TensorSpec& spec,
                                                              const void* data) override {
    KD_ASSIGN_OR_RETURN(
        auto tensor,
        spec.image.is_image()
            ? core::Tensor::CreateImage(device_, spec.type, spec.image, spec.memory, data)
            : core::Tensor::Create(device_, spec.type, spec.count, spec.element_size, spec.memory,
                                   data, core::TensorInit::kWait, nullptr, memory_pool_.get()));
    return std::make_shared<LocalTensor>(this, std::move(tensor));
  }

  absl::StatusOr<std::shared_ptr<BackendAlgorithm>> CreateAlgorithm(
      const AlgorithmSpec& spec) override {
    KD_ASSIGN_OR_RETURN(core::AlgorithmSpec core_spec, ToCore(spec));
    KD_ASSIGN_OR_RETURN(auto algorithm, core::Algorithm::Create(device_, std::move(core_spec)));
    return std::make_shared<LocalAlgorithm>(this, std::move(algorithm));
  }

  absl::Status RebuildAlgorithm(BackendAlgorithm& algorithm, const AlgorithmSpec& spec) override {
    KD_ASSIGN_OR_RETURN(auto local, Unwrap(this, &algorithm));
    KD_ASSIGN_OR_RETURN(core::AlgorithmSpec core_spec, ToCore(spec));
    return local->Rebuild(std::move(core_spec));
  }

  absl::Status SetPushConstants(BackendAlgorithm& algorithm, std::vector<uint8_t> values) override {
    KD_ASSIGN_OR_RETURN(auto local, Unwrap(this, &algorithm));
    return local->SetPushConstants(std::move(values));
  }

  absl::StatusOr<std::shared_ptr<BackendSequence>> CreateSequence(
      uint32_t queue, uint32_t total_timestamps) override {
    KD_ASSIGN_OR_RETURN(auto sequence, core::Sequence::Create(device_, queue, total_timestamps));
    return std::make_shared<LocalSequence>(this, std::move(sequence), spin_);
  }

  VkPhysicalDeviceProperties Properties() const override { return device_->properties(); }

  // The process's shared instance (the one kp's devices are made on): its handles stay valid
  // until exit.
  absl::StatusOr<std::vector<DeviceEntry>> ListDevices() const override {
    KD_ASSIGN_OR_RETURN(std::shared_ptr<core::Instance> instance, core::Instance::Shared());
    const std::vector<VkPhysicalDevice>& handles = instance->physical_devices();
    const std::vector<core::PhysicalDeviceInfo> infos = instance->Describe();
    std::vector<DeviceEntry> out;
    for (size_t i = 0; i < infos.size() && i < handles.size(); ++i) {
      out.push_back({infos[i].properties, handles[i]});
    }
    return out;
  }

 private:
  absl::StatusOr<core::AlgorithmSpec> ToCore(const AlgorithmSpec& spec) const {
    core::AlgorithmSpec out;
    KD_ASSIGN_OR_RETURN(out.tensors, Unwrap(this, spec.tensors));
    out.spirv = spec.spirv;
    out.workgroup = spec.workgroup;
    out.spec_constants = spec.spec_constants;
    out.spec_constant_size = spec.spec_constant_size;
    out.push_constants = spec.push_constants;
    return out;
  }

  std::shared_ptr<core::Device> device_;
  const absl::Duration spin_;
  // The Manager's small tensors share its blocks (the daemon's sessions share their tenant's).
  const std::shared_ptr<core::MemoryPool> memory_pool_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> CreateInProcessBackend(
    const komputed::core::DeviceOptions& options) {
  KD_ASSIGN_OR_RETURN(auto device, core::Device::Create(options));
  return std::make_shared<InProcessBackend>(std::move(device));
}

}  // namespace kp::internal
