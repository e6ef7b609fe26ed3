// Server::Drain in-process: while an evaluation runs, new sessions and evaluations (unary and on
// an Execute stream) are refused with UNAVAILABLE; the running one completes; then the server
// stops and the open sessions are counted as reaped for "drain".
#include <chrono>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "support/slow_kernel.h"
#include "support/stubs.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kCount = 2048;

class DrainTest : public ServerTest {
 protected:
  // Tensor h (kCount uints), algorithm h+1 (kSlowShader doing `work`), sequence h+2.
  void MakeSlow(const std::string& session, uint64_t h, const test_support::SlowWork& work) {
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
    a.set_glsl(test_support::kSlowShader);
    a.mutable_workgroup()->set_x(kCount);
    a.mutable_workgroup()->set_y(1);
    a.mutable_workgroup()->set_z(1);
    a.set_push_constants(work.PushConstants());
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
  // Waits (up to 30 s) until an evaluation is on device 0's queue 0.
  void WaitForAnEvalOnTheDevice() {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (server_->metrics().queue_depth("0", "0").Value() < 1 && absl::Now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Work that takes about `target` on this device (throw-away pipelines from handle 900 on; the
  // first eval of each pays for the JIT).
  test_support::SlowWork WorkFor(const std::string& session, absl::Duration target) {
    grpc::ClientContext context;
    v1::ListDevicesResponse devices;
    EXPECT_THAT(client_->devices->ListDevices(&context, v1::ListDevicesRequest(), &devices),
                IsOk());
    const bool cpu = devices.devices_size() > 0 &&
                     devices.devices(0).device_type() == 4;  // VK_PHYSICAL_DEVICE_TYPE_CPU
    uint64_t h = 900;
    return test_support::SlowWorkFor(target, cpu, [&](test_support::SlowWork work) {
      MakeSlow(session, h, work);
      v1::EvalResponse resp;
      EXPECT_THAT(Eval(SlowEval(session, h), &resp), IsOk());
      double seconds = 1e9;  // the fastest of two (a slowed-down probe makes the eval short)
      for (int i = 0; i < 2; ++i) {
        const absl::Time start = absl::Now();
        EXPECT_THAT(Eval(SlowEval(session, h), &resp), IsOk());
        seconds = std::min(seconds, absl::ToDoubleSeconds(absl::Now() - start));
      }
      h += 3;
      return seconds;
    });
  }
};

TEST_F(DrainTest, RefusesNewWorkWhileTheRunningEvalCompletes) {
  const std::string slow_session = Open("slow");
  const std::string other = Open("other");
  MakePipeline(other, 1, 16, 2.0f);
  const test_support::SlowWork work = WorkFor(slow_session, absl::Milliseconds(800));
  MakeSlow(slow_session, 1, work);
  grpc::ClientContext execute_ctx;
  auto stream = client_->sequences->Execute(&execute_ctx);  // opened before the drain

  grpc::Status slow_status;
  v1::EvalResponse slow_result;
  std::thread slow, drain;
  // An assertion that returns early still joins (the slow eval ends with its kernel).
  absl::Cleanup join = [&] {
    if (slow.joinable()) slow.join();
    if (drain.joinable()) drain.join();
  };
  slow = std::thread([&] { slow_status = Eval(SlowEval(slow_session, 1), &slow_result); });
  WaitForAnEvalOnTheDevice();
  ASSERT_EQ(server_->metrics().queue_depth("0", "0").Value(), 1);
  drain = std::thread([&] { server_->Drain(absl::Seconds(30)); });
  while (!server_->draining()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  auto health = grpc::health::v1::Health::NewStub(client_->channel);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_THAT(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp), IsOk());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  grpc::Status refused = TryOpen();
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
  EXPECT_EQ(out[0], test_support::Lcg(0, work));
  EXPECT_EQ(out[1], test_support::Lcg(1, work));
  EXPECT_EQ(server_->metrics().sessions_reaped_total("drain").Value(), 2);
  EXPECT_EQ(server_->metrics().device_memory_used_bytes("0").Value(), 0);
}

// A shutdown whose grace ends while unary evals are still on the device (one handed to the
// completion waiter, one waiting on a serving thread) cancels them: each call still gets its one
// answer, and the shutdown returns only after they have been answered.
TEST_F(DrainTest, ShutdownPastItsGraceAnswersTheEvalsStillOnTheDevice) {
  const std::string session = Open("slow");
  const test_support::SlowWork work = WorkFor(session, absl::Milliseconds(600));
  MakeSlow(session, 1, work);
  const std::string other = Open("other");
  MakeSlow(other, 1, work);
  grpc::Status statuses[2];
  std::thread evals[2];
  absl::Cleanup join = [&] {
    for (std::thread& t : evals) {
      if (t.joinable()) t.join();
    }
  };
  const std::string* sessions[2] = {&session, &other};
  for (int i = 0; i < 2; ++i) {
    evals[i] = std::thread([&, i] {
      Client client(server_->address());
      grpc::ClientContext ctx;
      v1::EvalResponse resp;
      statuses[i] = client.sequences->Eval(&ctx, SlowEval(*sessions[i], 1), &resp);
    });
  }
  WaitForAnEvalOnTheDevice();
  ASSERT_GE(server_->metrics().queue_depth("0", "0").Value(), 1);
  const absl::Time shutdown = absl::Now();
  server_->Shutdown(absl::Milliseconds(10));
  const absl::Duration took = absl::Now() - shutdown;
  for (std::thread& t : evals) t.join();
  std::printf("shutdown took %s; the evals' answers: %d, %d\n", absl::FormatDuration(took).c_str(),
              statuses[0].error_code(), statuses[1].error_code());
  for (const grpc::Status& status : statuses) {
    // Answered: with its result if it completed within the grace, else cancelled.
    EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED ||
                status.error_code() == grpc::StatusCode::UNAVAILABLE)
        << status.error_code() << ": " << status.error_message();
  }
}

// An Eval that waits for its kernel on the serving thread hands the gRPC queue on before it waits
// (CallQueue::WillWait): another client's Ping is answered while the kernel runs, though the
// inline wait would outlast the kernel and the daemon has only 2 serving threads.
class InlineWaitTest : public DrainTest {
 protected:
  ServerOptions Options() override {
    ServerOptions o = DrainTest::Options();
    o.eval_inline_wait = absl::Seconds(60);
    o.eval_hold = absl::Microseconds(100);  // shorter than the kernel
    o.grpc_threads = 2;
    return o;
  }
  struct PingDuringEvalResult {
    bool eval_still_running = false;  // whether the kernel was on the device when the Ping returned
    absl::Time ping_answered;
    absl::Time eval_answered;
  };
  // Starts the eval of `sequence` (made by MakeSlow), waits until it is on the device, and Pings
  // from another client while it runs. Both calls must succeed.
  PingDuringEvalResult PingDuringEval(const std::string& session, uint64_t sequence) {
    PingDuringEvalResult out;
    grpc::Status eval_status;
    v1::EvalResponse result;
    std::thread slow([&] {
      eval_status = Eval(SlowEval(session, sequence), &result);
      out.eval_answered = absl::Now();
    });
    const absl::Cleanup join = [&] {
      if (slow.joinable()) slow.join();
    };
    WaitForAnEvalOnTheDevice();
    EXPECT_GE(server_->metrics().queue_depth("0", "0").Value(), 1) << "the eval never ran";
    // Another client: a connection of its own (gRPC would share the eval's otherwise).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    test_support::Stubs other(
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::PingResponse pong;
    const grpc::Status ping = other.sessions->Ping(&context, v1::PingRequest(), &pong);
    out.ping_answered = absl::Now();
    out.eval_still_running = server_->metrics().queue_depth("0", "0").Value() >= 1;
    EXPECT_THAT(ping, IsOk());
    slow.join();
    EXPECT_THAT(eval_status, IsOk());
    return out;
  }
};

TEST_F(InlineWaitTest, APingIsAnsweredWhileAnEvalWaitsOnTheServingThread) {
  const std::string session = Open("slow");
  const test_support::SlowWork work = WorkFor(session, absl::Milliseconds(1500));
  MakeSlow(session, 1, work);
  const PingDuringEvalResult r = PingDuringEval(session, 1);
  // The kernel was still on the device when the Ping came back, and the eval was answered after.
  EXPECT_TRUE(r.eval_still_running);
  EXPECT_LT(r.ping_answered, r.eval_answered);
}

// Within --eval_hold the thread that waits for an eval keeps the queue (a short eval wakes no other
// thread): with a hold longer than the kernel, another client's Ping is served only once the eval
// has completed, though a second serving thread is free.
class HeldQueueTest : public InlineWaitTest {
 protected:
  ServerOptions Options() override {
    ServerOptions o = InlineWaitTest::Options();
    o.eval_hold = absl::Seconds(60);
    return o;
  }
};

TEST_F(HeldQueueTest, APingWaitsForAnEvalThatHoldsTheQueue) {
  const std::string session = Open("slow");
  const test_support::SlowWork work = WorkFor(session, absl::Milliseconds(1500));
  MakeSlow(session, 1, work);
  EXPECT_FALSE(PingDuringEval(session, 1).eval_still_running)
      << "the Ping was served while the eval held the queue";
}

// A thread that kept the queue through its wait and then finds another client's call waiting behind
// it stops the holds (eval_hold_off): the next eval hands the queue on before it waits, and another
// client's Ping is answered while its kernel runs.
class HeldQueueOffTest : public HeldQueueTest {
 protected:
  ServerOptions Options() override {
    ServerOptions o = HeldQueueTest::Options();
    o.eval_hold_off = absl::Seconds(60);
    return o;
  }
};

TEST_F(HeldQueueOffTest, AnEvalAfterOneThatCallsWaitedBehindHandsTheQueueOn) {
  const std::string session = Open("slow");
  const test_support::SlowWork work = WorkFor(session, absl::Milliseconds(1500));
  MakeSlow(session, 1, work);
  EXPECT_FALSE(PingDuringEval(session, 1).eval_still_running)
      << "the first eval did not keep the queue";
  EXPECT_TRUE(PingDuringEval(session, 1).eval_still_running) << "the second eval kept the queue";
}

}  // namespace
}  // namespace komputed::server::testing
