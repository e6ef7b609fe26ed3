// Session::Eval: an eval's commands, uploads and submission, the inline wait or the hand-off to
// the device's completion waiter, and the result.
#include "eval.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "call_queue.h"
#include "host_data.h"
#include "host_writes.h"
#include "komputed/core/status.h"
#include "session.h"
#include "status.h"

namespace komputed::server {
namespace {

// Room left in a message for everything but the data bytes.
constexpr uint64_t kMessageOverhead = 4096;

// The tensors whose host data comes back, by handle.
using Downloads = std::vector<std::pair<uint64_t, std::shared_ptr<core::Tensor>>>;

// Copies the downloads' host data into the result, each tensor's whole (HostWrites::Copy);
// returns their bytes.
uint64_t CollectDownloads(const Downloads& downloads, const HostWrites& writes,
                          EvalResult& result) {
  uint64_t bytes = 0;
  result.downloads.reserve(downloads.size());
  for (const auto& [handle, tensor] : downloads) {
    result.downloads.push_back({handle, writes.Copy(*tensor)});
    bytes += tensor->byte_size();
  }
  return bytes;
}

// The inline wait of a submitted sequence, for up to `budget`: OK once it has completed,
// DEADLINE_EXCEEDED when it still runs after `budget`, else the device's error. A serving thread
// keeps the gRPC queue for the first `hold` of it where it may (CallQueue::MayHold: a short eval
// then wakes no other thread) and hands it on before it waits longer (CallQueue::WillWait). The
// fence is polled for the first `spin` (0 on CPU devices, whose work needs the cores), then
// waited on.
absl::Status WaitInline(core::Sequence& sequence, absl::Duration budget, absl::Duration hold,
                        absl::Duration spin) {
  const absl::Time began = absl::Now();
  const auto left = [&](absl::Duration until) {
    return std::max(absl::ZeroDuration(), std::min(budget, until) - (absl::Now() - began));
  };
  if (hold > absl::ZeroDuration() && CallQueue::MayHold()) {
    if (spin > absl::ZeroDuration()) sequence.Poll(left(std::min(spin, hold)));
    absl::Status held = sequence.Wait(left(hold));
    if (!absl::IsDeadlineExceeded(held)) return held;
    if (left(budget) <= absl::ZeroDuration()) return held;
  }
  CallQueue::WillWait();
  if (left(spin) > absl::ZeroDuration()) sequence.Poll(left(spin));
  return sequence.Wait(left(budget));
}

}  // namespace

// What an eval hands to the waiter: the sequence it submitted (null when none) and the tensors
// whose host data comes back.
struct Session::Prepared {
  std::shared_ptr<SequenceEntry> sequence;
  uint64_t sequence_handle = 0;
  bool submitted = false;  // a command buffer went to the device queue
  uint64_t order = 0;      // the submission's place in its queue's order (the watchdog's)
  Downloads downloads;
  std::shared_ptr<core::CancelWord> cancel;  // what the watchdog sets to stop it (null: none yet)
  // Held while the submission may change host data (HostWrites), until the device has finished it.
  HostWrites::Token host_writes;
  uint64_t submitting_ns = 0;  // MonotonicNs before the submission, when the plan asked for stages
};

namespace {

// What a submission holds until the device has finished it: its place in the tenant's
// inflight_submissions quota and its watchdog ticket.
struct InFlight {
  Charge submission;
  std::unique_ptr<Watchdog::Ticket> ticket;
  HostWrites::Token host_writes;  // the tensors it may change stay marked
};

// The most evals whose submissions go to the device in one vkQueueSubmit.
constexpr size_t kMostTogether = 64;

}  // namespace

struct Session::Admitted {
  EvalDone done;  // tells the caller, then lets the drain gate go
  std::shared_ptr<InFlight> in_flight;
  uint64_t started_ns = 0;
};

struct Session::Together {
  std::vector<core::Sequence::Submission> submissions;
  std::vector<size_t> indices;  // the evals' places in EvalMany's plans
  size_t queue = 0;
  // The tensors that their submissions use and that they download (an upload into one waits
  // for the next run).
  absl::flat_hash_set<const core::Tensor*> touched;
};

absl::Status Session::CommandLocked(const SessionCommand& command) {
  // (server:: names the command types, which the member functions of the same names hide.)
  if (const auto* c = std::get_if<TensorRequest>(&command)) return CreateTensorLocked(*c);
  if (const auto* c = std::get_if<server::DestroyTensor>(&command)) {
    return DestroyTensorLocked(c->handle);
  }
  if (const auto* c = std::get_if<AlgorithmRequest>(&command)) return CreateAlgorithmLocked(*c);
  if (const auto* c = std::get_if<server::RebuildAlgorithm>(&command)) {
    return RebuildAlgorithmLocked(c->algorithm);
  }
  if (const auto* c = std::get_if<PushConstantsRequest>(&command)) {
    return SetPushConstantsLocked(*c);
  }
  if (const auto* c = std::get_if<server::DestroyAlgorithm>(&command)) {
    return DestroyAlgorithmLocked(c->handle);
  }
  if (const auto* c = std::get_if<SequenceRequest>(&command)) return CreateSequenceLocked(*c);
  if (const auto* c = std::get_if<RecordRequest>(&command)) return RecordLocked(*c);
  return DestroySequenceLocked(std::get<server::DestroySequence>(command).handle);
}

absl::StatusOr<Session::Prepared> Session::PrepareEvalLocked(const EvalPlan& plan,
                                                             Together* together, size_t index) {
  KD_RETURN_IF_ERROR(CheckUsableLocked());
  for (size_t i = 0; i < plan.commands.size(); ++i) {
    const EvalPlan::Command& command = plan.commands[i];
    absl::Status s =
        command.command.ok() ? CommandLocked(*command.command) : command.command.status();
    if (!s.ok()) return Annotate(s, absl::StrCat("command ", i, " (", command.name, "): "));
  }

  // Everything is checked before anything is written or submitted.
  std::vector<std::shared_ptr<core::Tensor>> upload_tensors;
  for (const EvalPlan::Upload& upload : plan.uploads) {
    auto tensor = HostTensorLocked(upload.tensor);
    if (!tensor.ok()) return Annotate(tensor.status(), "upload: ");
    if (!Inside(upload.offset, upload.data.size(), (*tensor)->byte_size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload to tensor ", upload.tensor, ": ", upload.data.size(), " bytes at offset ",
          upload.offset, " do not fit in its ", (*tensor)->byte_size(), " bytes"));
    }
    upload_tensors.push_back(*std::move(tensor));
  }
  Prepared prepared;
  uint64_t download_bytes = 0;
  for (uint64_t handle : plan.downloads) {
    auto tensor = HostTensorLocked(handle);
    if (!tensor.ok()) return Annotate(tensor.status(), "download: ");
    download_bytes += (*tensor)->byte_size();
    prepared.downloads.emplace_back(handle, *std::move(tensor));
  }
  const uint64_t max_message_bytes = static_cast<uint64_t>(options_.max_message_bytes);
  if (download_bytes + kMessageOverhead > max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "downloads of ", download_bytes, " bytes do not fit in one message (the daemon's limit is ",
        max_message_bytes, " bytes); read large tensors with ReadTensor"));
  }
  if (plan.sequence != 0) {
    KD_ASSIGN_OR_RETURN(prepared.sequence, sequences_.Find(plan.sequence));
    prepared.sequence_handle = plan.sequence;
    KD_RETURN_IF_ERROR(SettleLocked(plan.sequence, *prepared.sequence));
  }

  for (size_t i = 0; i < plan.uploads.size(); ++i) {
    const EvalPlan::Upload& upload = plan.uploads[i];
    host_writes_->Write(*upload_tensors[i], upload.offset, upload.data);
    CountUpload(upload.data.size());
  }
  if (prepared.sequence != nullptr) {
    core::Sequence& sequence = *prepared.sequence->sequence;
    const std::vector<core::Op> ops = sequence.RecordedOps();
    // Marked before the submission: the device may change host data from its first moment.
    prepared.host_writes = host_writes_->Submitting(HostDataWritten(ops));
    std::shared_ptr<core::TensorInitBatch> inits;
    if (plan.stage_times) prepared.submitting_ns = MonotonicNs();
    if (together != nullptr) {
      // Submitted with the others (SubmitTogetherLocked); no inits are pending (JoinsLocked).
      if (together->indices.empty()) together->queue = sequence.queue();
      together->submissions.push_back({&sequence, nullptr});
      together->indices.push_back(index);
      for (const core::Op& op : ops) {
        for (const auto& tensor : TensorsOf(op)) together->touched.insert(tensor.get());
      }
      // Its downloads are read once it has completed (or, with nothing submitted, once the run
      // proceeds): after the later members' uploads were written.
      for (const auto& download : prepared.downloads) {
        together->touched.insert(download.second.get());
      }
      return prepared;
    }
    if (!pending_init_.empty()) {
      std::vector<std::shared_ptr<core::Tensor>> pending;
      for (const auto& weak : pending_init_) {
        if (auto tensor = weak.lock()) pending.push_back(std::move(tensor));
      }
      core::Device& device = *facts_.instance->device;
      auto batch = core::TensorInitBatch::Record(facts_.instance->device,
                                                 device.queue(sequence.queue()).family, pending);
      if (batch.ok()) {
        inits = *std::move(batch);
      } else if (absl::IsNotFound(batch.status())) {
        pending_init_.clear();  // none is pending any more
      } else {
        facts_.device->CheckLost(*facts_.instance);
        return Annotate(batch.status(), "recording new tensors' first contents: ");
      }
    }
    KD_RETURN_IF_ERROR(
        SubmittedLocked(plan.sequence, sequence.Submit(inits), inits != nullptr, prepared));
  }
  return prepared;
}

absl::Status Session::SubmittedLocked(uint64_t handle, const absl::Status& submitted, bool inits,
                                      Prepared& prepared) {
  if (!submitted.ok()) {
    facts_.device->CheckLost(*facts_.instance);
    return Annotate(submitted, absl::StrCat("sequence ", handle, ": "));
  }
  const core::Sequence& sequence = *prepared.sequence->sequence;
  // Nothing is submitted for a sequence that never recorded anything.
  prepared.submitted = sequence.IsRunning();
  if (prepared.submitted && inits) pending_init_.clear();
  if (prepared.submitted) {
    prepared.order = sequence.InFlight().order;
    facts_.device->Submitted(sequence.queue());
  } else {
    prepared.host_writes.reset();
  }
  prepared.cancel = cancel_;
  prepared.sequence->awaited.store(true);
  return absl::OkStatus();
}

bool Session::CanGoTogetherLocked(const EvalPlan& plan) const {
  // An eval's commands change what earlier evals' submissions would run; a submission that
  // carries new tensors' first contents (pending_init_) goes alone.
  if (!options_.submit_together || plan.sequence == 0 || !plan.commands.empty() ||
      !pending_init_.empty()) {
    return false;
  }
  // One that submits nothing reads its downloads as it proceeds: alone, before a later eval's
  // submission can change them.
  absl::StatusOr<std::shared_ptr<SequenceEntry>> entry = sequences_.Find(plan.sequence);
  return entry.ok() && (*entry)->sequence->HasCommands();
}

bool Session::JoinsLocked(const EvalPlan& plan, const Together& together) const {
  if (together.indices.empty()) return true;  // the first of a run
  if (together.indices.size() >= kMostTogether) return false;
  absl::StatusOr<std::shared_ptr<SequenceEntry>> entry = sequences_.Find(plan.sequence);
  if (!entry.ok() || (*entry)->sequence->queue() != together.queue) return false;
  const core::Sequence* sequence = (*entry)->sequence.get();
  for (const core::Sequence::Submission& s : together.submissions) {
    // Its earlier eval must be submitted first (and then refuses this one).
    if (s.sequence == sequence) return false;
  }
  for (const EvalPlan::Upload& upload : plan.uploads) {
    absl::StatusOr<std::shared_ptr<core::Tensor>> tensor = tensors_.Find(upload.tensor);
    if (tensor.ok() && together.touched.contains(tensor->get())) return false;
  }
  return true;
}

void Session::SubmitTogetherLocked(Together& together,
                                   std::vector<absl::StatusOr<Prepared>>& prepared) {
  if (together.indices.empty()) return;
  const std::vector<absl::Status> statuses = core::Sequence::SubmitTogether(together.submissions);
  size_t submitted = 0;
  for (size_t k = 0; k < together.indices.size(); ++k) {
    absl::StatusOr<Prepared>& mine = prepared[together.indices[k]];
    absl::Status s = SubmittedLocked(mine->sequence_handle, statuses[k], /*inits=*/false, *mine);
    if (!s.ok()) {
      mine = std::move(s);
    } else if (mine->submitted) {
      ++submitted;
    }
  }
  // Counted where they really shared one (SubmitTogether submits each alone on a device without
  // timeline semaphores).
  if (submitted > 1 && facts_.instance->device->timeline_supported()) {
    submitted_together_->Increment(static_cast<double>(submitted));
  }
  together = Together();
}

std::optional<Session::Admitted> Session::Admit(const EvalPlan& plan, EvalDone on_done) {
  Admitted admitted;
  admitted.started_ns = plan.stage_times ? MonotonicNs() : 0;
  Touch();
  WorkGate* const gate = gate_;
  if (gate != nullptr && !gate->Enter()) {
    on_done(WorkGate::Refusal("evaluations"));
    return std::nullopt;
  }
  // The gate counts the eval in flight until its caller has been told.
  admitted.done = [gate, on_done = std::move(on_done)](absl::StatusOr<EvalResult> result) {
    on_done(std::move(result));
    if (gate != nullptr) gate->Exit();
  };
  // The eval's place in its tenant's inflight_submissions quota, taken before anything is
  // applied and held until the submission has completed.
  admitted.in_flight = std::make_shared<InFlight>();
  if (plan.sequence != 0 && facts_.account != nullptr) {
    absl::StatusOr<Charge> charge = facts_.account->Take(Counted::kSubmissions, 1);
    if (!charge.ok()) {
      admitted.done(charge.status());
      return std::nullopt;
    }
    admitted.in_flight->submission = *std::move(charge);
  }
  return admitted;
}

void Session::Eval(const EvalPlan& plan, absl::Time deadline, bool may_wait_inline,
                   EvalDone on_done) {
  std::optional<Admitted> admitted = Admit(plan, std::move(on_done));
  if (!admitted.has_value()) return;
  absl::StatusOr<Prepared> prepared;
  {
    absl::MutexLock lock(&mu_);
    prepared = PrepareEvalLocked(plan);
  }
  Proceed(plan, *std::move(admitted), std::move(prepared), deadline, may_wait_inline);
}

void Session::EvalMany(absl::Span<const EvalPlan> plans, std::vector<EvalDone> dones,
                       const std::function<bool()>& cancelled) {
  std::vector<std::optional<Admitted>> admitted(plans.size());
  std::vector<absl::StatusOr<Prepared>> prepared(plans.size());
  size_t admitted_end = 0;  // evals [0, admitted_end) have been let in or refused
  // Run by run: an eval that cannot go with others alone, or evals that go together. A run is
  // prepared and submitted under the session's lock, then proceeds (an eval without a submission
  // collects its downloads then) before the next run's commands and uploads are applied.
  size_t i = 0;
  while (i < plans.size()) {
    if (cancelled != nullptr && cancelled()) {
      const absl::Status why =
          absl::CancelledError("the stream was cancelled before this eval ran");
      for (; i < plans.size(); ++i) {
        if (i >= admitted_end) {
          dones[i](why);
        } else if (admitted[i].has_value()) {
          admitted[i]->done(why);
          admitted[i].reset();  // gives its place in the quota back
        }
      }
      return;
    }
    // Evals are let in (the drain gate, the tenant's inflight_submissions quota) one at a time,
    // as Eval does, except those that may go together: those are let in up to one run ahead, so
    // that no eval holds a place in the quota long before its submission. Those let in already
    // were found able to go together then, so the look ahead goes on from the first one not let
    // in (each eval is looked at once here, however short the runs).
    size_t until = i + 1;
    if (options_.submit_together) {
      absl::MutexLock lock(&mu_);
      size_t j = std::max(i, admitted_end);
      while (j < plans.size() && j < i + kMostTogether && CanGoTogetherLocked(plans[j])) ++j;
      until = std::max(until, j);
    }
    for (; admitted_end < until; ++admitted_end) {
      admitted[admitted_end] = Admit(plans[admitted_end], std::move(dones[admitted_end]));
    }
    std::vector<size_t> run;
    {
      absl::MutexLock lock(&mu_);
      Together together;
      for (; i < admitted_end; ++i) {
        if (!admitted[i].has_value()) continue;
        const EvalPlan& plan = plans[i];
        if (!CanGoTogetherLocked(plan)) {
          if (run.empty()) {
            prepared[i] = PrepareEvalLocked(plan);
            run.push_back(i++);
          }
          break;
        }
        if (!JoinsLocked(plan, together)) break;
        prepared[i] = PrepareEvalLocked(plan, &together, i);
        run.push_back(i);
      }
      SubmitTogetherLocked(together, prepared);
    }
    for (size_t k : run) {
      Proceed(plans[k], *std::move(admitted[k]), std::move(prepared[k]), absl::InfiniteFuture(),
              /*may_wait_inline=*/false);
    }
  }
}

void Session::Proceed(const EvalPlan& plan, Admitted admitted, absl::StatusOr<Prepared> prepared,
                      absl::Time deadline, bool may_wait_inline) {
  EvalDone done = std::move(admitted.done);
  std::shared_ptr<InFlight> in_flight = std::move(admitted.in_flight);
  const uint64_t started_ns = admitted.started_ns;
  if (!prepared.ok()) {
    done(prepared.status());
    return;
  }
  // The stages' moments, when the plan asked for them (the waiter's callback fills in the rest).
  std::shared_ptr<EvalResult::Stages> stages;
  if (plan.stage_times) {
    stages = std::make_shared<EvalResult::Stages>();
    stages->received_ns = plan.received_ns != 0 ? plan.received_ns : started_ns;
    stages->started_ns = started_ns;
    stages->submitted_ns = MonotonicNs();
    // Nothing submitted (or nothing to submit): the submission's start is its end.
    stages->submitting_ns =
        prepared->submitting_ns != 0 ? prepared->submitting_ns : stages->submitted_ns;
  }
  if (prepared->sequence == nullptr) {
    EvalResult result;
    CountDownload(CollectDownloads(prepared->downloads, *host_writes_, result));
    if (stages != nullptr) {
      stages->completed_ns = stages->submitted_ns;
      result.stages = *stages;
    }
    done(std::move(result));
    return;
  }
  const absl::Duration timeout =
      plan.timeout > absl::ZeroDuration() ? plan.timeout : options_.eval_timeout;
  deadline = std::min(deadline, absl::Now() + timeout);
  std::shared_ptr<SequenceEntry> entry = prepared->sequence;
  const uint64_t handle = prepared->sequence_handle;
  const bool submitted = prepared->submitted;
  const absl::Duration kernel_limit = KernelTimeLimit();
  std::shared_ptr<core::CancelWord> cancel = prepared->cancel;
  if (submitted && facts_.watchdog != nullptr) {
    in_flight->ticket = facts_.watchdog->Started(
        {facts_.instance.get(), static_cast<uint32_t>(entry->sequence->queue())}, facts_.id, cancel,
        kernel_limit, prepared->order);
  }
  PooledDevice* const device = facts_.device;  // the pool outlives the waiter's callbacks
  // The instance outlives its waiter's callbacks (and the inline wait holds the session).
  DeviceInstance* const instance = facts_.instance.get();
  prometheus::Counter* const downloaded = downloads_;
  // What runs once the submission has completed (or failed, or run past the deadline).
  const absl::Duration hold = options_.eval_timeout;
  const std::string session_id = facts_.id;
  in_flight->host_writes = std::move(prepared->host_writes);
  auto finish = [entry, handle, timeout, hold, submitted, device, instance, downloaded, in_flight,
                 cancel, kernel_limit, session_id, stages, writes = host_writes_,
                 downloads = std::move(prepared->downloads),
                 done = std::move(done)](absl::Status status) mutable {
    uint64_t gpu_ns = 0;
    EvalResult result;
    if (stages != nullptr) {
      stages->completed_ns = MonotonicNs();
      result.stages = *stages;
    }
    if (status.ok() && cancel != nullptr && cancel->set()) {
      // The watchdog stopped the session's dispatches: what they wrote is incomplete.
      status = absl::DeadlineExceededError(absl::StrCat(
          "sequence ", handle, ": stopped by the kernel watchdog: a submission of session ",
          session_id, " ran longer than its limit of ", absl::FormatDuration(kernel_limit),
          " (--max_kernel_time, or the tenant's kernel_time_ms quota); the session is closed"));
    } else if (status.ok()) {
      downloaded->Increment(static_cast<double>(CollectDownloads(downloads, *writes, result)));
      result.timestamps_ns = entry->sequence->Timestamps();
      if (result.timestamps_ns.size() >= 2) {
        gpu_ns = result.timestamps_ns.back() - result.timestamps_ns.front();
        result.device_time_ns = gpu_ns;
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
    if (absl::IsDeadlineExceeded(status) && submitted && entry->sequence->IsRunning()) {
      // The submission still runs: it keeps its place in the tenant's quota, its watchdog ticket
      // and the marks on the tensors it may change until it completes (or the daemon's eval
      // timeout has passed once more), not just until its eval gave up.
      instance->waiter->Watch(entry->sequence, absl::Now() + hold,
                              [in_flight](absl::Status) mutable { in_flight.reset(); });
    }
    in_flight.reset();
    if (status.ok()) {
      done(std::move(result));
    } else {
      done(std::move(status));
    }
  };
  // From here on `finish` alone holds the eval's place and its marks on the tensors, so that they
  // are given back before the caller is told (a client that reads a tensor as soon as its eval
  // has answered must not find it still marked).
  in_flight.reset();
  // Short work: wait on this thread, then reply from it (no hand-off to the waiter thread and
  // back). Bounded in time and in the number of threads doing it, so that long submissions and
  // many concurrent ones still go to the waiter.
  if (may_wait_inline && submitted && options_.eval_inline_wait > absl::ZeroDuration() &&
      device->BeginInlineWait(options_.eval_inline_waiters)) {
    const absl::Duration budget =
        std::min(options_.eval_inline_wait, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    absl::Status status = WaitInline(*entry->sequence, budget, options_.eval_hold,
                                     device->is_cpu() ? absl::ZeroDuration() : options_.eval_spin);
    device->EndInlineWait();
    if (!absl::IsDeadlineExceeded(status)) {
      if (stages != nullptr) stages->waited_inline = true;
      finish(std::move(status));
      return;
    }
  }
  // The waiter holds the sequence (and through its recording, its tensors and algorithms) until
  // the submission completes, even if the session is closed meanwhile.
  facts_.instance->waiter->Watch(entry->sequence, deadline, std::move(finish));
}

}  // namespace komputed::server
