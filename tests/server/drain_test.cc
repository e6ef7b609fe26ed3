// Server::Drain in-process: while an evaluation runs, new sessions and evaluations (unary and on
// an Execute stream) are refused with UNAVAILABLE; the running one completes; then the server
// stops and the open sessions are counted as reaped for "drain".
#include <chrono>
#include <thread>

#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

// Each v[i] goes units * 32 times through an LCG step (unrolled: llvmpipe stops an invocation's
// loops after 65535 iterations).
constexpr char kSlowShader[] = R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Buf { uint v[]; };
layout(push_constant) uniform Push { uint units; };
#define S x = x * 1664525u + 1013904223u;
#define S8 S S S S S S S S
void main() {
  uint i = gl_GlobalInvocationID.x;
  uint x = v[i];
  for (uint j = 0u; j < units; ++j) { S8 S8 S8 S8 }
  v[i] = x;
}
)";
constexpr uint32_t kCount = 2048;

uint32_t Lcg(uint32_t x, uint32_t units) {
  for (uint64_t k = 0; k < uint64_t{units} * 32; ++k) x = x * 1664525u + 1013904223u;
  return x;
}

class DrainTest : public ServerTest {
 protected:
  // Tensor h (kCount uints), algorithm h+1 (kSlowShader, `units`), sequence h+2.
  void MakeSlow(const std::string& session, uint64_t h, uint32_t units) {
    v1::CreateTensorRequest t;
    t.set_session_id(session);
    t.set_handle(h);
    t.set_element_type(v1::ELEMENT_TYPE_UINT32);
    t.set_count(kCount);
    ASSERT_THAT(CreateTensor(t), IsOk());
    v1::CreateAlgorithmRequest a;
    a.set_session_id(session);
    a.set_handle(h + 1);
    a.add_tensors(h);
    a.set_glsl(kSlowShader);
    a.mutable_workgroup()->set_x(kCount);
    a.mutable_workgroup()->set_y(1);
    a.mutable_workgroup()->set_z(1);
    a.set_push_constants(std::string(reinterpret_cast<const char*>(&units), 4));
    ASSERT_THAT(CreateAlgorithm(a), IsOk());
    ASSERT_THAT(CreateSequence(session, h + 2), IsOk());
    ASSERT_THAT(
        Record(session, h + 2,
               {RecordOp(SyncDevice({h})), RecordOp(Dispatch(h + 1)), RecordOp(SyncLocal({h}))}),
        IsOk());
  }
  static v1::EvalRequest SlowEval(const std::string& session, uint64_t h) {
    std::vector<uint32_t> input(kCount);
    for (uint32_t i = 0; i < kCount; ++i) input[i] = i;
    v1::EvalRequest req;
    req.set_session_id(session);
    req.set_sequence(h + 2);
    v1::TensorData* up = req.add_uploads();
    up->set_handle(h);
    up->set_data(std::string(reinterpret_cast<const char*>(input.data()), kCount * 4));
    req.add_downloads(h);
    return req;
  }
  // Units that take about `target` (a probe pipeline at 900..902).
  uint32_t UnitsFor(const std::string& session, absl::Duration target) {
    constexpr uint32_t kProbe = 64;
    MakeSlow(session, 900, kProbe);
    v1::EvalResponse resp;
    EXPECT_THAT(Eval(SlowEval(session, 900), &resp), IsOk());  // pays for the JIT
    double seconds = 1e9;  // the fastest of three (a slowed-down probe makes the eval short)
    for (int i = 0; i < 3; ++i) {
      const absl::Time start = absl::Now();
      EXPECT_THAT(Eval(SlowEval(session, 900), &resp), IsOk());
      seconds = std::min(seconds, std::max(1e-4, absl::ToDoubleSeconds(absl::Now() - start)));
    }
    return static_cast<uint32_t>(
        std::clamp(kProbe * absl::ToDoubleSeconds(target) / seconds, 1.0, 60000.0));
  }
};

TEST_F(DrainTest, RefusesNewWorkWhileTheRunningEvalCompletes) {
  const std::string slow_session = Open("slow");
  const std::string other = Open("other");
  MakePipeline(other, 1, 16, 2.0f);
  const uint32_t units = UnitsFor(slow_session, absl::Milliseconds(800));
  MakeSlow(slow_session, 1, units);
  grpc::ClientContext execute_ctx;
  auto stream = client_->sequences->Execute(&execute_ctx);  // opened before the drain

  grpc::Status slow_status;
  v1::EvalResponse slow_result;
  std::thread slow([&] { slow_status = Eval(SlowEval(slow_session, 1), &slow_result); });
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (server_->metrics().queue_depth("0", "0").Value() < 1 && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(server_->metrics().queue_depth("0", "0").Value(), 1);
  std::thread drain([&] { server_->Drain(absl::Seconds(30)); });
  while (!server_->draining()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  auto health = grpc::health::v1::Health::NewStub(client_->channel);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_THAT(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp), IsOk());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  grpc::ClientContext octx;
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse opened;
  grpc::Status refused = client_->sessions->OpenSession(&octx, open, &opened);
  EXPECT_THAT(refused, HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(refused.error_message(), HasSubstr("komputed is draining"));

  v1::EvalResponse resp;
  grpc::Status eval = Eval(PipelineEval(other, 1, std::vector<float>(16, 1.0f)), &resp);
  EXPECT_THAT(eval, HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(eval.error_message(), HasSubstr("komputed is draining"));

  v1::ExecuteRequest request;
  *request.mutable_eval() = PipelineEval(other, 1, std::vector<float>(16, 1.0f));
  request.mutable_eval()->set_request_id(5);
  ASSERT_TRUE(stream->Write(request));
  v1::ExecuteEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.request_id(), 5u);
  EXPECT_EQ(event.code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(event.message(), HasSubstr("komputed is draining"));
  stream->WritesDone();
  EXPECT_THAT(stream->Finish(), IsOk());

  slow.join();
  drain.join();
  EXPECT_THAT(slow_status, IsOk());
  ASSERT_EQ(slow_result.downloads_size(), 1);
  uint32_t out[2];
  std::memcpy(out, slow_result.downloads(0).data().data(), sizeof(out));
  EXPECT_EQ(out[0], Lcg(0, units));
  EXPECT_EQ(out[1], Lcg(1, units));
  EXPECT_EQ(server_->metrics().sessions_reaped_total("drain").Value(), 2);
  EXPECT_EQ(server_->metrics().device_memory_used_bytes("0").Value(), 0);
}

}  // namespace
}  // namespace komputed::server::testing
