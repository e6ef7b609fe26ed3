#pragma once
// Who changes the host data of a session's tensors, and when: the rule that keeps a ReadTensor
// from returning a torn mix of old and new data.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "komputed/core/sequence.h"
#include "komputed/core/tensor.h"

namespace komputed::server {

// A piece of a tensor's host data to write: `data` goes to [offset, offset + data.size()).
struct StagedWrite {
  uint64_t offset = 0;
  absl::string_view data;
};

// The host data of a session's tensors changes in two ways only:
//   - host writes (WriteTensor's commit, an eval's uploads), each made whole under this object's
//     lock (Write);
//   - submissions in flight: from just before a submission until the device has finished it and
//     its host steps have run, it may change the host data of the tensors that HostDataWritten
//     names (Submitting).
// Readers that need one moment's data (ReadTensor, chunk by chunk) copy under the lock (Read):
// each chunk only while no submission in flight may change the tensor and no host write has
// touched it since the read began. So a read returns the data of one moment, or fails: with
// FAILED_PRECONDITION while a submission in flight may change the tensor (read it once that eval
// has completed), with ABORTED when the tensor changed during the read (read it again). Writes
// are never refused: a host write while the device uses the tensor is the program's own race, as
// it is in-process.
//
// Shared by a session and the completion callbacks of its submissions, which may outlive it.
// Thread-safe. The session's lock, where held, is taken before this one.
class HostWrites : public std::enable_shared_from_this<HostWrites> {
 public:
  // Made shared (the tokens of submissions hold it): std::make_shared<HostWrites>().
  HostWrites() = default;
  HostWrites(const HostWrites&) = delete;
  HostWrites& operator=(const HostWrites&) = delete;

  // Marks tensors as changed by a submission until the token goes (drop it once the device has
  // finished the submission and its host steps have run, or at once when nothing was submitted).
  using Token = std::shared_ptr<void>;

  // Copies `data` into the tensor's host data at `offset` (which the caller has checked).
  void Write(const core::Tensor& tensor, uint64_t offset, absl::string_view data);
  // Copies every piece into the tensor's host data at once (the caller has checked the ranges).
  void Write(const core::Tensor& tensor, const std::vector<StagedWrite>& pieces);
  // The tensor's whole host data, copied whole (an eval's downloads).
  std::string Copy(const core::Tensor& tensor) const;

  Token Submitting(std::vector<std::shared_ptr<core::Tensor>> tensors);

  // A read of one moment: Begin, then Read each chunk, then End (once, always).
  uint64_t BeginRead();
  void EndRead();
  // Copies [offset, offset + size) of the tensor's host data into `to`, or fails as the class
  // comment says (the caller puts the tensor's name in front of the message).
  absl::Status Read(const core::Tensor& tensor, uint64_t since, uint64_t offset, uint64_t size,
                    char* to) const;

 private:
  // What a token holds: this object and the tensors (whose addresses stay theirs meanwhile).
  class Submission {
   public:
    Submission(std::shared_ptr<HostWrites> writes,
               std::vector<std::shared_ptr<core::Tensor>> tensors)
        : writes_(std::move(writes)), tensors_(std::move(tensors)) {}
    ~Submission();
    Submission(const Submission&) = delete;
    Submission& operator=(const Submission&) = delete;

   private:
    const std::shared_ptr<HostWrites> writes_;
    const std::vector<std::shared_ptr<core::Tensor>> tensors_;
  };
  struct State {
    uint64_t last_write = 0;  // the clock of the last change
    int submissions = 0;      // submissions in flight that may change it
  };
  void ChangedLocked(const core::Tensor* tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishedLocked(const std::vector<std::shared_ptr<core::Tensor>>& tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;  // reads in progress
  // Tensors that a submission in flight may change, or that changed while a read was in progress
  // (an entry matters only to reads that began before its last change: entries of destroyed
  // tensors, whose address a new tensor may take, have changes older than any such read).
  absl::flat_hash_map<const core::Tensor*, State> tensors_ ABSL_GUARDED_BY(mu_);
};

// The tensors whose host data a submission of `ops` (a command buffer's operations) may change:
// every host-coherent tensor it touches (a dispatch's algorithm's included), the tensors with
// staging that a sync_local brings back, and a copy's destinations with staging (its host step).
std::vector<std::shared_ptr<core::Tensor>> HostDataWritten(const std::vector<core::Op>& ops);
// The tensors that `op` uses: its own, and a dispatch's algorithm's.
std::vector<std::shared_ptr<core::Tensor>> TensorsOf(const core::Op& op);

}  // namespace komputed::server
