// fuzz_session: the wire's requests through the session layer on a real device. Each input is a
// serialized komputed.fuzz.SessionScript (session_script.proto): steps that either convert one
// komputed.v1.Command with session_wire's FromWire and apply it through the session's own method,
// or convert a whole komputed.v1.EvalRequest and run it with Session::Eval. Every input gets a new
// session, closed at its end; the account's charges must all come back.
//
// Checked: no crash, leak or undefined behaviour; every error is one that bad input may cause
// (fuzz_support.h CheckClientError); every eval calls its callback exactly once, within its bound;
// a successful eval returns one download per tensor asked for; after the session closes, nothing
// stays charged. The harness caps the counts (steps, commands, actions, tensors per list) and
// the quotas (FuzzQuota) cap sizes, so that one input runs in milliseconds.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "fuzz_support.h"
#include "komputed/v1/komputed.pb.h"
#include "session.h"
#include "session_script.pb.h"
#include "session_wire.h"

namespace komputed::fuzz {
namespace {

constexpr int kMaxSteps = 16;
constexpr int kMaxCommands = 16;
constexpr int kMaxActions = 32;
constexpr int kMaxList = 8;  // tensors of an algorithm or an operation, uploads, downloads
constexpr uint64_t kMaxTimeoutMs = 100;
constexpr uint32_t kMaxTimestamps = 256;

template <typename Field>
void CapRepeated(Field* field, int most) {
  if (field->size() > most) field->Truncate(most);
}
template <typename Message>
void CapMessages(google::protobuf::RepeatedPtrField<Message>* field, int most) {
  if (field->size() > most) field->DeleteSubrange(most, field->size() - most);
}

// mutable_* on a oneof's member sets it: only the member that is set is touched.
void Cap(v1::Operation* op) {
  switch (op->op_case()) {
    case v1::Operation::kSyncDevice:
      CapRepeated(op->mutable_sync_device()->mutable_tensors(), kMaxList);
      break;
    case v1::Operation::kSyncLocal:
      CapRepeated(op->mutable_sync_local()->mutable_tensors(), kMaxList);
      break;
    case v1::Operation::kCopy:
      CapRepeated(op->mutable_copy()->mutable_tensors(), kMaxList);
      break;
    case v1::Operation::kBarrier:
      CapRepeated(op->mutable_barrier()->mutable_tensors(), kMaxList);
      break;
    default:
      break;
  }
}

void Cap(v1::CreateAlgorithmRequest* algorithm) {
  CapRepeated(algorithm->mutable_tensors(), kMaxList);
}

void Cap(v1::Command* command) {
  switch (command->command_case()) {
    case v1::Command::kCreateAlgorithm:
      Cap(command->mutable_create_algorithm());
      break;
    case v1::Command::kRebuildAlgorithm:
      Cap(command->mutable_rebuild_algorithm());
      break;
    case v1::Command::kCreateSequence: {
      v1::CreateSequenceRequest* s = command->mutable_create_sequence();
      if (s->total_timestamps() > kMaxTimestamps) s->set_total_timestamps(kMaxTimestamps);
      break;
    }
    case v1::Command::kRecord: {
      v1::RecordRequest* r = command->mutable_record();
      CapMessages(r->mutable_actions(), kMaxActions);
      for (v1::SequenceAction& action : *r->mutable_actions()) {
        if (action.has_record()) Cap(action.mutable_record());
      }
      break;
    }
    default:
      break;
  }
}

void Cap(v1::EvalRequest* eval) {
  CapMessages(eval->mutable_commands(), kMaxCommands);
  for (v1::Command& command : *eval->mutable_commands()) Cap(&command);
  CapMessages(eval->mutable_uploads(), kMaxList);
  CapRepeated(eval->mutable_downloads(), kMaxList);
  if (eval->timeout_ms() > kMaxTimeoutMs) eval->set_timeout_ms(kMaxTimeoutMs);
}

// One command through the session's own method, as the unary RPCs apply them.
absl::Status Call(server::Session& session, const v1::Command& command) {
  namespace wire = server::wire;
  switch (command.command_case()) {
    case v1::Command::kCreateTensor: {
      absl::StatusOr<server::TensorRequest> tensor = wire::FromWire(command.create_tensor());
      if (!tensor.ok()) return tensor.status();
      return session.CreateTensor(*tensor);
    }
    case v1::Command::kDestroyTensor:
      return session.DestroyTensor(command.destroy_tensor().handle());
    case v1::Command::kCreateAlgorithm:
      return session.CreateAlgorithm(wire::FromWire(command.create_algorithm()));
    case v1::Command::kRebuildAlgorithm:
      return session.RebuildAlgorithm(wire::FromWire(command.rebuild_algorithm()));
    case v1::Command::kSetPushConstants:
      return session.SetPushConstants(wire::FromWire(command.set_push_constants()));
    case v1::Command::kDestroyAlgorithm:
      return session.DestroyAlgorithm(command.destroy_algorithm().handle());
    case v1::Command::kCreateSequence:
      return session.CreateSequence(wire::FromWire(command.create_sequence()));
    case v1::Command::kRecord: {
      absl::StatusOr<server::RecordRequest> record = wire::FromWire(command.record());
      if (!record.ok()) return record.status();
      return session.Record(*record);
    }
    case v1::Command::kDestroySequence:
      return session.DestroySequence(command.destroy_sequence().handle());
    case v1::Command::COMMAND_NOT_SET:
      break;
  }
  return absl::OkStatus();
}

// What the eval's callback saw; shared with the callback, which may run on the waiter's thread.
struct EvalOutcome {
  std::atomic<int> calls{0};
  std::optional<absl::StatusOr<server::EvalResult>> result;
  absl::Notification done;
};

void Eval(server::Session& session, const v1::EvalRequest& request) {
  const server::EvalPlan plan = server::wire::FromWire(request, session.id());
  auto outcome = std::make_shared<EvalOutcome>();
  // request_id means nothing to a unary eval: its low bit picks the inline wait.
  const bool inline_wait = (request.request_id() & 1) != 0;
  session.Eval(plan, absl::Now() + absl::Seconds(1), inline_wait,
               [outcome](absl::StatusOr<server::EvalResult> result) {
                 if (outcome->calls.fetch_add(1) == 0) {
                   outcome->result = std::move(result);
                   outcome->done.Notify();
                 }
               });
  // The wait is bounded by the plan's timeout (at most kMaxTimeoutMs) or the daemon's 200 ms.
  Check(outcome->done.WaitForNotificationWithTimeout(absl::Seconds(5)),
        "Session::Eval did not call back within 5 s");
  const absl::StatusOr<server::EvalResult>& result = *outcome->result;
  CheckClientError(result.status(), "Eval");
  if (result.ok()) {
    Check(result->downloads.size() == static_cast<size_t>(request.downloads_size()),
          "an eval returned another number of downloads than it asked for");
    v1::EvalResponse response;
    server::wire::ToWire(*result, &response);
    Check(response.downloads_size() == request.downloads_size(), "ToWire lost downloads");
  }
  // A second call would come late: look once more after the wait.
  Check(outcome->calls.load() == 1, "Session::Eval called back more than once");
}

void Run(const komputed::fuzz::SessionScript& script) {
  SessionEnv& env = SessionEnv::Get();
  std::shared_ptr<server::Session> session = env.NewSession();
  for (const SessionStep& step : script.steps()) {
    switch (step.step_case()) {
      case SessionStep::kCall:
        CheckClientError(Call(*session, step.call()), "a call");
        break;
      case SessionStep::kEval:
        Eval(*session, step.eval());
        break;
      case SessionStep::kTimestamps: {
        absl::StatusOr<std::vector<uint64_t>> t =
            session->GetTimestamps(step.timestamps().handle());
        CheckClientError(t.status(), "GetTimestamps");
        break;
      }
      case SessionStep::kDescribe: {
        v1::SessionInfo info;
        server::wire::ToWire(session->Describe(), &info);
        break;
      }
      case SessionStep::STEP_NOT_SET:
        break;
    }
  }
  env.CloseAndCheck(std::move(session));
  CheckNoValidationErrors();
}

}  // namespace
}  // namespace komputed::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  komputed::fuzz::InitProcess();
  komputed::fuzz::SessionEnv::Get();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  komputed::fuzz::SessionScript script;
  if (!script.ParseFromArray(data, static_cast<int>(size))) return -1;  // not kept in the corpus
  komputed::fuzz::CapMessages(script.mutable_steps(), komputed::fuzz::kMaxSteps);
  for (komputed::fuzz::SessionStep& step : *script.mutable_steps()) {
    if (step.has_call()) komputed::fuzz::Cap(step.mutable_call());
    if (step.has_eval()) komputed::fuzz::Cap(step.mutable_eval());
  }
  komputed::fuzz::Run(script);
  return 0;
}
