#include "eval_stages.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "bench_common.h"
#include "eval.h"
#include "komputed/core/shared_memory.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "komputed/v1/shared_memory_wire.h"
#include "remote/same_host_channel.h"
#include "support/requests.h"
#include "support/stubs.h"

namespace komputed_bench {
namespace {

namespace v1 = komputed::v1;
namespace core = komputed::core;
namespace remote = kp::internal::remote;
namespace ts = komputed::test_support;
using komputed::server::MonotonicNs;  // the clock of EvalStages

// The handles of lane `lane`'s tensor, algorithm and sequence.
constexpr uint64_t kTensor = 1;
constexpr uint64_t kAlgorithm = 2;
constexpr uint64_t kSequence = 3;
uint64_t Handle(uint64_t base, uint32_t lane) { return base + 3 * uint64_t{lane}; }

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

  // Opens the session and makes `lanes` tiny sequences in it. Empty on success, else what failed.
  std::string Open(const std::vector<uint32_t>& spirv, uint32_t lanes = 1) {
    v1::OpenSessionRequest open;
    open.set_client_name("komputed_bench stages");
    v1::OpenSessionResponse opened;
    std::string error = Run("OpenSession", [&](grpc::ClientContext* c) {
      return stubs_.sessions->OpenSession(c, open, &opened);
    });
    if (!error.empty()) return error;
    id_ = opened.session_id();
    socket_ = opened.shared_memory_socket();
    ticket_ = opened.shared_memory_ticket();
    for (uint32_t lane = 0; lane < lanes && error.empty(); ++lane) error = MakeLane(spirv, lane);
    return error;
  }

  // Opens the session and makes one tiny sequence whose tensor's host data is `memory`, passed to
  // the daemon as region 1 over its shared-memory socket. Empty on success, else what failed.
  std::string OpenShared(const std::vector<uint32_t>& spirv, const core::SharedMemory& memory) {
    std::string error = Open(spirv, 0);
    if (!error.empty()) return error;
    if (socket_.empty()) return "tiny_eval/same_host_stages: the daemon offers no shared memory";
    const absl::Status passed = v1::wire::PassSharedMemory(socket_, ticket_, kRegion, memory.fd(),
                                                           memory.size(), absl::Seconds(30));
    if (!passed.ok()) return absl::StrCat("passing shared memory: ", passed.ToString());
    return MakeLane(spirv, 0, kRegion);
  }

  const std::string& id() const { return id_; }
  const std::string& socket() const { return socket_; }
  const std::string& ticket() const { return ticket_; }
  v1::Sequences::Stub& sequences() { return *stubs_.sequences; }

 private:
  static constexpr uint64_t kRegion = 1;

  // Makes lane `lane`'s tensor (over shared-memory region `region` where it is not 0),
  // algorithm and sequence.
  std::string MakeLane(const std::vector<uint32_t>& spirv, uint32_t lane, uint64_t region = 0) {
    const uint64_t tensor_handle = Handle(kTensor, lane);
    const uint64_t algorithm_handle = Handle(kAlgorithm, lane);
    const uint64_t sequence_handle = Handle(kSequence, lane);
    std::string error;

    v1::CreateTensorRequest tensor =
        ts::FloatTensor(id_, tensor_handle, std::vector<float>(kTinyCount, 0.0f));
    if (region != 0) {
      tensor.clear_data();  // the region's
      tensor.set_shared_memory(region);
    }
    v1::CreateAlgorithmRequest algorithm;
    algorithm.set_session_id(id_);
    algorithm.set_handle(algorithm_handle);
    algorithm.add_tensors(tensor_handle);
    algorithm.set_spirv(
        std::string(reinterpret_cast<const char*>(spirv.data()), spirv.size() * sizeof(uint32_t)));
    algorithm.mutable_workgroup()->set_x(kTinyCount / kTinyLocalSize);
    algorithm.mutable_workgroup()->set_y(1);
    algorithm.mutable_workgroup()->set_z(1);
    v1::CreateSequenceRequest sequence;
    sequence.set_session_id(id_);
    sequence.set_handle(sequence_handle);
    v1::RecordRequest record;
    record.set_session_id(id_);
    record.set_sequence(sequence_handle);
    *record.add_actions()->mutable_record() = ts::SyncDevice({tensor_handle});
    *record.add_actions()->mutable_record() = ts::Dispatch(algorithm_handle);
    *record.add_actions()->mutable_record() = ts::SyncLocal({tensor_handle});

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

  ts::Stubs stubs_;
  std::string id_;
  std::string socket_;  // the daemon's shared-memory socket, and the session's ticket for it
  std::string ticket_;
};

// The stages' sums over the evals of a run, set as the counters of eval_stages.h at the end.
class StageSums {
 public:
  // Whether the moments are in order, from `sent` (the client's write) to `back` (its read).
  static bool InOrder(uint64_t sent, const v1::EvalStages& s, uint64_t back) {
    const std::array<uint64_t, kStages + 1> moments = Moments(sent, s, back);
    return std::is_sorted(moments.begin(), moments.end());
  }
  void Add(uint64_t sent, const v1::EvalStages& s, uint64_t back) {
    const std::array<uint64_t, kStages + 1> moments = Moments(sent, s, back);
    for (int k = 0; k < kStages; ++k) {
      sums_[k] += static_cast<double>(moments[k + 1] - moments[k]);
    }
    if (s.waited_inline()) ++inline_waits_;
  }
  // Means per eval, in microseconds.
  void SetCounters(benchmark::State& state) const {
    const double n = static_cast<double>(std::max<int64_t>(1, state.iterations()));
    const char* names[kStages] = {kStageRequest, kStageQueued, kStagePrepare, kStageSubmit,
                                  kStageDevice,  kStageAnswer, kStageResponse};
    for (int k = 0; k < kStages; ++k) state.counters[names[k]] = sums_[k] / n / 1e3;
    state.counters[kStageInline] = static_cast<double>(inline_waits_) / n;
  }

 private:
  static constexpr int kStages = 7;
  // The moments that bound the stages, from the client's write to its read.
  static std::array<uint64_t, kStages + 1> Moments(uint64_t sent, const v1::EvalStages& s,
                                                   uint64_t back) {
    return {sent,
            s.received_ns(),
            s.started_ns(),
            s.submitting_ns(),
            s.submitted_ns(),
            s.completed_ns(),
            s.answered_ns(),
            back};
  }
  double sums_[kStages] = {};
  int64_t inline_waits_ = 0;
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
  StageSums sums;
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
        !StageSums::InOrder(sent, s, back)) {
      state.SkipWithError("tiny_eval/stages: an answer without its download or stages in order");
      return;
    }
    std::memcpy(host.data(), response.downloads(0).data().data(), kTinyBytes);
    if (host[step.k] != step.expected()) {
      state.SkipWithError("tiny_eval/stages: wrong result");
      return;
    }
    sums.Add(sent, s, back);
  }
  sums.SetCounters(state);
}

void RunSameHostEvalStages(benchmark::State& state, const std::string& address,
                           const std::vector<uint32_t>& tiny_spirv, absl::Duration spin) {
  absl::StatusOr<std::shared_ptr<core::SharedMemory>> memory =
      core::SharedMemory::Create(kTinyBytes, "komputed-bench-stages");
  if (!memory.ok()) {
    state.SkipWithError(
        absl::StrCat("tiny_eval/same_host_stages: ", memory.status().ToString()).c_str());
    return;
  }
  StagesSession session(address);
  if (std::string error = session.OpenShared(tiny_spirv, **memory); !error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  absl::StatusOr<std::unique_ptr<remote::SameHostChannel>> channel =
      remote::SameHostChannel::Open(session.socket(), session.ticket(), absl::Seconds(30),
                                    /*ring=*/remote::SameHostChannel::RingWanted());
  if (!channel.ok()) {
    state.SkipWithError(absl::StrCat("tiny_eval/same_host_stages: opening the channel: ",
                                     channel.status().ToString())
                            .c_str());
    return;
  }
  float* host = static_cast<float*>((*memory)->data());
  core::SpinWindow window(spin, kp::internal::WaitSpinLimit(spin));  // as kp's sessions poll
  v1::EvalRequest request;
  request.set_session_id(session.id());
  request.set_sequence(kSequence);
  request.set_stage_times(true);
  StageSums sums;
  uint64_t i = 0;
  for (auto _ : state) {
    const TinyStep step(i++);
    host[step.k] = step.v;
    bool sent = false;
    const uint64_t before = MonotonicNs();
    absl::StatusOr<v1::EvalResponse> response =
        (*channel)->Eval(request, absl::Seconds(30), window, &sent);
    const uint64_t back = MonotonicNs();
    if (!response.ok()) {
      state.SkipWithError(
          absl::StrCat("tiny_eval/same_host_stages: ", response.status().ToString()).c_str());
      return;
    }
    if (!StageSums::InOrder(before, response->stages(), back)) {
      state.SkipWithError("tiny_eval/same_host_stages: stages out of order");
      return;
    }
    if (host[step.k] != step.expected()) {
      state.SkipWithError("tiny_eval/same_host_stages: wrong result");
      return;
    }
    sums.Add(before, response->stages(), back);
  }
  sums.SetCounters(state);
}

void RunAsyncEvalStages(benchmark::State& state, const std::string& address,
                        const std::vector<uint32_t>& tiny_spirv, uint32_t depth) {
  depth = std::max<uint32_t>(depth, 1);
  StagesSession session(address);
  if (std::string error = session.Open(tiny_spirv, depth); !error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  std::unique_ptr<grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteEvent>> stream =
      session.sequences().Execute(&context);
  std::vector<std::vector<float>> host(depth, std::vector<float>(kTinyCount, 0.0f));
  std::vector<TinyStep> steps(depth, TinyStep(0));
  std::vector<uint64_t> sent(depth, 0);
  uint64_t next_step = 0;
  // The lane's next eval (request_id: the lane + 1; a lane has one eval in flight at a time).
  auto write = [&](uint32_t lane) {
    steps[lane] = TinyStep(next_step++);
    host[lane][steps[lane].k] = steps[lane].v;
    v1::ExecuteRequest request;
    v1::EvalRequest& eval = *request.mutable_eval();
    eval.set_session_id(session.id());
    eval.set_request_id(lane + 1);
    eval.set_sequence(Handle(kSequence, lane));
    eval.set_stage_times(true);
    eval.add_downloads(Handle(kTensor, lane));
    v1::TensorData* upload = eval.add_uploads();
    upload->set_handle(Handle(kTensor, lane));
    upload->set_data(reinterpret_cast<const char*>(host[lane].data()), kTinyBytes);
    sent[lane] = MonotonicNs();
    return stream->Write(request);
  };
  std::string error;
  for (uint32_t lane = 0; lane < depth && error.empty(); ++lane) {
    if (!write(lane)) error = "async_evals/stages: the Execute stream refused a write";
  }
  StageSums sums;
  for (auto _ : state) {
    if (!error.empty()) break;
    v1::ExecuteEvent event;
    if (!stream->Read(&event)) {
      error = "async_evals/stages: the Execute stream ended";
      break;
    }
    const uint64_t back = MonotonicNs();
    const uint64_t id = event.request_id();
    if (id == 0 || id > depth || event.code() != 0) {
      error = absl::StrCat("async_evals/stages: event ", id, ": code ", event.code(), " ",
                           event.message());
      break;
    }
    const uint32_t lane = static_cast<uint32_t>(id - 1);
    const v1::EvalResponse& response = event.result();
    const v1::EvalStages& s = response.stages();
    if (response.downloads_size() != 1 || response.downloads(0).data().size() != kTinyBytes ||
        !StageSums::InOrder(sent[lane], s, back)) {
      error = "async_evals/stages: an event without its download or stages in order";
      break;
    }
    std::memcpy(host[lane].data(), response.downloads(0).data().data(), kTinyBytes);
    if (host[lane][steps[lane].k] != steps[lane].expected()) {
      error = "async_evals/stages: wrong result";
      break;
    }
    sums.Add(sent[lane], s, back);
    if (!write(lane)) error = "async_evals/stages: the Execute stream refused a write";
  }
  // The evals still in flight are read and dropped; the stream ends with the session.
  stream->WritesDone();
  for (v1::ExecuteEvent rest; stream->Read(&rest);) {
  }
  const grpc::Status finished = stream->Finish();
  if (error.empty() && !finished.ok()) error = Failed("Execute", finished);
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  state.SetItemsProcessed(state.iterations());
  sums.SetCounters(state);
}

}  // namespace komputed_bench
