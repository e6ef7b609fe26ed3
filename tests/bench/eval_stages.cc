#include "eval_stages.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench_common.h"
#include "eval.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/requests.h"
#include "support/stubs.h"

namespace komputed_bench {
namespace {

namespace v1 = komputed::v1;
namespace ts = komputed::test_support;
using komputed::server::MonotonicNs;  // the clock of EvalStages

constexpr uint64_t kTensor = 1;
constexpr uint64_t kAlgorithm = 2;
constexpr uint64_t kSequence = 3;

void Deadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// Fails with the call's name and status.
std::string Failed(const char* what, const grpc::Status& st) {
  return absl::StrCat("tiny_eval/stages: ", what, ": ", st.error_message());
}

// Runs `call` with a fresh context and the deadline: empty when it succeeded, else what failed.
template <typename Call>
std::string Run(const char* what, Call call) {
  grpc::ClientContext context;
  Deadline(context);
  const grpc::Status st = call(&context);
  return st.ok() ? std::string() : Failed(what, st);
}

// The session and its objects; closes the session at the end.
class StagesSession {
 public:
  explicit StagesSession(const std::string& address) : stubs_(address) {}
  ~StagesSession() {
    if (id_.empty()) return;
    grpc::ClientContext context;
    Deadline(context);
    v1::CloseSessionRequest request;
    request.set_session_id(id_);
    v1::CloseSessionResponse response;
    (void)stubs_.sessions->CloseSession(&context, request, &response);
  }

  // Empty on success, else what failed.
  std::string Open(const std::vector<uint32_t>& spirv) {
    v1::OpenSessionRequest open;
    open.set_client_name("komputed_bench stages");
    v1::OpenSessionResponse opened;
    std::string error = Run("OpenSession", [&](grpc::ClientContext* c) {
      return stubs_.sessions->OpenSession(c, open, &opened);
    });
    if (!error.empty()) return error;
    id_ = opened.session_id();

    const v1::CreateTensorRequest tensor =
        ts::FloatTensor(id_, kTensor, std::vector<float>(kTinyCount, 0.0f));
    v1::CreateAlgorithmRequest algorithm;
    algorithm.set_session_id(id_);
    algorithm.set_handle(kAlgorithm);
    algorithm.add_tensors(kTensor);
    algorithm.set_spirv(
        std::string(reinterpret_cast<const char*>(spirv.data()), spirv.size() * sizeof(uint32_t)));
    algorithm.mutable_workgroup()->set_x(kTinyCount / kTinyLocalSize);
    algorithm.mutable_workgroup()->set_y(1);
    algorithm.mutable_workgroup()->set_z(1);
    v1::CreateSequenceRequest sequence;
    sequence.set_session_id(id_);
    sequence.set_handle(kSequence);
    v1::RecordRequest record;
    record.set_session_id(id_);
    record.set_sequence(kSequence);
    *record.add_actions()->mutable_record() = ts::SyncDevice({kTensor});
    *record.add_actions()->mutable_record() = ts::Dispatch(kAlgorithm);
    *record.add_actions()->mutable_record() = ts::SyncLocal({kTensor});

    v1::CreateTensorResponse tensor_made;
    v1::CreateAlgorithmResponse algorithm_made;
    v1::CreateSequenceResponse sequence_made;
    v1::RecordResponse recorded;
    error = Run("CreateTensor", [&](grpc::ClientContext* c) {
      return stubs_.tensors->CreateTensor(c, tensor, &tensor_made);
    });
    if (error.empty()) {
      error = Run("CreateAlgorithm", [&](grpc::ClientContext* c) {
        return stubs_.algorithms->CreateAlgorithm(c, algorithm, &algorithm_made);
      });
    }
    if (error.empty()) {
      error = Run("CreateSequence", [&](grpc::ClientContext* c) {
        return stubs_.sequences->CreateSequence(c, sequence, &sequence_made);
      });
    }
    if (error.empty()) {
      error = Run("Record", [&](grpc::ClientContext* c) {
        return stubs_.sequences->Record(c, record, &recorded);
      });
    }
    return error;
  }

  const std::string& id() const { return id_; }
  v1::Sequences::Stub& sequences() { return *stubs_.sequences; }

 private:
  ts::Stubs stubs_;
  std::string id_;
};

}  // namespace

void RunEvalStages(benchmark::State& state, const std::string& address,
                   const std::vector<uint32_t>& tiny_spirv) {
  StagesSession session(address);
  if (std::string error = session.Open(tiny_spirv); !error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  std::vector<float> host(kTinyCount, 0.0f);
  v1::EvalRequest request;
  request.set_session_id(session.id());
  request.set_sequence(kSequence);
  request.set_stage_times(true);
  request.add_downloads(kTensor);
  v1::TensorData* upload = request.add_uploads();
  upload->set_handle(kTensor);
  v1::EvalResponse response;
  double sums[5] = {0, 0, 0, 0, 0};
  int64_t inline_waits = 0;
  uint64_t i = 0;
  for (auto _ : state) {
    const TinyStep step(i++);
    host[step.k] = step.v;
    upload->set_data(reinterpret_cast<const char*>(host.data()), kTinyBytes);
    grpc::ClientContext context;
    Deadline(context);
    const uint64_t sent = MonotonicNs();
    const grpc::Status st = session.sequences().Eval(&context, request, &response);
    const uint64_t back = MonotonicNs();
    if (!st.ok()) {
      state.SkipWithError(Failed("Eval", st).c_str());
      return;
    }
    const v1::EvalStages& s = response.stages();
    if (response.downloads_size() != 1 || response.downloads(0).data().size() != kTinyBytes ||
        !(sent <= s.received_ns() && s.received_ns() <= s.submitted_ns() &&
          s.submitted_ns() <= s.completed_ns() && s.completed_ns() <= s.answered_ns() &&
          s.answered_ns() <= back)) {
      state.SkipWithError("tiny_eval/stages: an answer without its download or stages in order");
      return;
    }
    std::memcpy(host.data(), response.downloads(0).data().data(), kTinyBytes);
    if (host[step.k] != step.expected()) {
      state.SkipWithError("tiny_eval/stages: wrong result");
      return;
    }
    sums[0] += static_cast<double>(s.received_ns() - sent);
    sums[1] += static_cast<double>(s.submitted_ns() - s.received_ns());
    sums[2] += static_cast<double>(s.completed_ns() - s.submitted_ns());
    sums[3] += static_cast<double>(s.answered_ns() - s.completed_ns());
    sums[4] += static_cast<double>(back - s.answered_ns());
    if (s.waited_inline()) ++inline_waits;
  }
  const double n = static_cast<double>(std::max<int64_t>(1, state.iterations()));
  const char* names[5] = {kStageRequest, kStagePrepare, kStageDevice, kStageAnswer, kStageResponse};
  for (int k = 0; k < 5; ++k) state.counters[names[k]] = sums[k] / n / 1e3;
  state.counters[kStageInline] = static_cast<double>(inline_waits) / n;
}

}  // namespace komputed_bench
