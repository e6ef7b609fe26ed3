#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "komputed/core/device.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

// Where an instrumented shader reads its cancel word: descriptor set 1 (set 0 is the tensors'),
// binding 0.
inline constexpr uint32_t kCancelSet = 1;
inline constexpr uint32_t kCancelBinding = 0;
// The word is kept in kCancelWordCopies copies, kCancelWordStrideBytes apart (each in a cache line
// of its own), and each workgroup reads one of them: a large dispatch whose every invocation read
// one address queued at it (5 times slower, a loop-bound kernel on the H200).
inline constexpr uint32_t kCancelWordCopies = 256;
inline constexpr uint32_t kCancelWordStrideBytes = 256;
inline constexpr uint32_t kCancelWordBytes = kCancelWordCopies * kCancelWordStrideBytes;

// How AddCancelChecks instruments a module.
struct CancelCheckOptions {
  // Where the word is: a storage buffer's first 32-bit word.
  uint32_t set = kCancelSet;
  uint32_t binding = kCancelBinding;
  // Loop back-edges read the word once per `interval` of them (a function's loops together):
  // reading memory the host writes takes a round trip to the device's memory, so a loop that read
  // it every iteration would wait on it every iteration (60 times slower, measured on the H200).
  uint32_t interval = 256;
  // Whether each entry point reads the word before anything else, so that the invocations of a
  // stopped dispatch that have not begun return at once. It costs every invocation that round
  // trip at its start, which a short memory-bound kernel notices (1.4 times, saxpy on the H200).
  bool check_entry = true;
  // Functions that also read the word first, as entry points do with `check_entry` (the body
  // that a workgroup loop calls once per virtual workgroup: workgroup_loop.h).
  std::vector<uint32_t> entry_checked_functions;
  // Functions whose loops are not counted (a workgroup loop's main, whose loop is the same for a
  // whole workgroup and ends once every call of its body returns at its entry check: left
  // alone, the workgroup leaves it together).
  std::vector<uint32_t> unchecked_loop_functions;
};

// Rewrites a compute module so that a running dispatch of it can be stopped: every loop back-edge
// counts down its function's countdown (a Function variable) and, each time it reaches zero, reads
// the word with a relaxed atomic load of device scope (which always reaches the memory the host
// writes: a Volatile load was served from a cache that never saw the host's write on NVIDIA, and
// an atomic load is never hoisted out of a loop); with `check_entry`, every GLCompute entry point
// reads it first. Once the word is nonzero, entry points return at once and every loop exits at
// its next check. A dispatch then ends within `interval` loop iterations per invocation still
// running, plus the time to start and return the invocations not yet begun (or, without entry
// checks, to run them).
//
// Takes a module that passed ValidateSpirv (Logical addressing). INVALID_ARGUMENT for a loop whose
// back edge it cannot check (a back-edge block that branches anywhere but to its loop's header
// and merge block); the result is what the caller should validate again.
absl::StatusOr<std::vector<uint32_t>> AddCancelChecks(absl::Span<const uint32_t> spirv,
                                                      const CancelCheckOptions& options = {});

// For a module without loops (no OpLoopMerge): at most how many instructions one invocation of its
// GLCompute entry points executes, its calls followed (saturating at UINT64_MAX). nullopt for a
// module with a loop, where no bound is known; INVALID_ARGUMENT for a malformed module.
absl::StatusOr<std::optional<uint64_t>> LoopFreeInstructionBound(absl::Span<const uint32_t> spirv);

// The most instructions that a stoppable dispatch of a loop-free module may execute in all
// without entry checks (what it takes to run them bounds the time from a set word to its end):
// 2^32 on a CPU device (about half a second for lavapipe on two cores), 2^40 on a GPU (a few
// milliseconds on the H200). Algorithm::Create estimates a dispatch's instructions as
// LoopFreeInstructionBound times its workgroups times maxComputeWorkGroupInvocations.
uint64_t UncheckedWorkLimit(const Device& device);

// The word that AddCancelChecks' shaders read, set by the host while a dispatch runs. Thread-safe.
//
// Words are slots of shared host-visible, host-coherent storage buffers (slabs) of the device:
// a word's kCancelWordCopies copies sit kCancelWordStrideBytes apart, and the copies of up to
// kCancelWordStrideBytes / (the device's minStorageBufferOffsetAlignment) words interleave in one
// slab, so that a word costs that fraction of kCancelWordBytes. A descriptor binds a word as
// {buffer(), offset(), kCancelWordBytes}. A slot is cleared when it is handed out and returns to
// its slab when the word goes (no dispatch can read it then: its algorithms hold the word).
class CancelWord {
 public:
  static absl::StatusOr<std::shared_ptr<CancelWord>> Create(std::shared_ptr<Device> device);
  ~CancelWord();
  CancelWord(const CancelWord&) = delete;
  CancelWord& operator=(const CancelWord&) = delete;

  VkBuffer buffer() const;
  // Where the word's block (kCancelWordBytes long) begins in buffer().
  uint64_t offset() const { return offset_; }
  // Stops every instrumented dispatch that reads this word, now and later.
  void Set();
  bool set() const;

  struct Slab;  // cancel_check.cc

 private:
  CancelWord() = default;
  // The first copy of the word in the slab's mapping; the others follow every
  // kCancelWordStrideBytes.
  uint32_t* words() const;
  // Writes `value` to every copy of the word.
  void Store(uint32_t value);

  std::shared_ptr<Slab> slab_;  // holds the device
  uint32_t slot_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace komputed::core
