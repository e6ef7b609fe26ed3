#pragma once
// What the server tests share beyond tests/support: a client, request builders for the scale
// pipeline, and a fixture that runs a daemon in-process.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "server.h"
#include "support/bytes.h"
#include "support/grpc_matchers.h"
#include "support/requests.h"
#include "support/stubs.h"
#include "test_options.h"

namespace komputed::server::testing {

namespace v1 = ::komputed::v1;
using namespace ::komputed::test_support;

inline std::string PushFloat(float value) { return FloatBytes({value}); }

// An eval's stage moments (EvalStages) come in order, after `before` and up to `after` (the
// test's MonotonicNs around the call: one clock for the test and the daemon it runs).
inline void ExpectStagesInOrder(uint64_t before, const v1::EvalStages& s, uint64_t after) {
  EXPECT_LE(before, s.received_ns());
  EXPECT_LE(s.received_ns(), s.started_ns());
  EXPECT_LE(s.started_ns(), s.submitting_ns());
  EXPECT_LE(s.submitting_ns(), s.submitted_ns());
  EXPECT_LE(s.submitted_ns(), s.completed_ns());
  EXPECT_LE(s.completed_ns(), s.answered_ns());
  EXPECT_LE(s.answered_ns(), after);
}

// The stubs of every komputed service over one channel, for messages up to 256 MiB unless
// `large_messages` is false.
struct Client : Stubs {
  explicit Client(const std::string& address, bool large_messages = true)
      : Stubs(address, large_messages ? 256 << 20 : 0) {}
};

// Builders for requests.
inline v1::CreateAlgorithmRequest ScaleAlgorithm(const std::string& session, uint64_t handle,
                                                 uint64_t in, uint64_t out, uint32_t count,
                                                 float scale) {
  return GlslAlgorithm(session, handle, {in, out}, kScaleShader, count, PushFloat(scale));
}

inline v1::SequenceAction RecordOp(const v1::Operation& op) {
  v1::SequenceAction a;
  *a.mutable_record() = op;
  return a;
}

// Unary calls through any client's stubs; each returns the call's status.
inline grpc::Status CreateTensor(Stubs& c, const v1::CreateTensorRequest& req) {
  grpc::ClientContext ctx;
  v1::CreateTensorResponse resp;
  return c.tensors->CreateTensor(&ctx, req, &resp);
}
inline grpc::Status DestroyTensor(Stubs& c, const std::string& id, uint64_t handle) {
  grpc::ClientContext ctx;
  v1::DestroyTensorRequest req;
  req.set_session_id(id);
  req.set_handle(handle);
  v1::DestroyTensorResponse resp;
  return c.tensors->DestroyTensor(&ctx, req, &resp);
}
inline grpc::Status Eval(Stubs& c, const v1::EvalRequest& req, v1::EvalResponse* resp) {
  grpc::ClientContext ctx;
  return c.sequences->Eval(&ctx, req, resp);
}
inline grpc::Status CreateAlgorithm(Stubs& c, const v1::CreateAlgorithmRequest& req) {
  grpc::ClientContext ctx;
  v1::CreateAlgorithmResponse resp;
  return c.algorithms->CreateAlgorithm(&ctx, req, &resp);
}
inline grpc::Status CreateSequence(Stubs& c, const std::string& id, uint64_t handle,
                                   uint32_t queue = 0, uint32_t timestamps = 0) {
  grpc::ClientContext ctx;
  v1::CreateSequenceRequest req;
  req.set_session_id(id);
  req.set_handle(handle);
  req.set_queue(queue);
  req.set_total_timestamps(timestamps);
  v1::CreateSequenceResponse resp;
  return c.sequences->CreateSequence(&ctx, req, &resp);
}
inline grpc::Status Record(Stubs& c, const std::string& id, uint64_t sequence,
                           const std::vector<v1::SequenceAction>& actions) {
  grpc::ClientContext ctx;
  v1::RecordRequest req;
  req.set_session_id(id);
  req.set_sequence(sequence);
  for (const auto& a : actions) *req.add_actions() = a;
  v1::RecordResponse resp;
  return c.sequences->Record(&ctx, req, &resp);
}

// A running in-process daemon (on 127.0.0.1:0) and a client connected to it; each test gets its
// own daemon, so that totals (memory, sessions) start at zero.
class ServerTest : public ::testing::Test {
 protected:
  virtual ServerOptions Options() { return TestServerOptions(); }

  void SetUp() override {
    auto server = Server::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    client_ = std::make_unique<Client>(server_->address());
  }

  void TearDown() override {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  // Opens a session (and fails the test when it cannot).
  // OpenSession on device 0 with one queue, for a test that expects it to fail: its status.
  grpc::Status TryOpen() {
    grpc::ClientContext ctx;
    v1::OpenSessionResponse resp;
    return client_->sessions->OpenSession(&ctx, v1::OpenSessionRequest(), &resp);
  }
  std::string Open(const std::string& name = "test", std::vector<uint32_t> families = {}) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest req;
    req.set_client_name(name);
    for (uint32_t f : families) req.add_queue_families(f);
    v1::OpenSessionResponse resp;
    grpc::Status s = client_->sessions->OpenSession(&ctx, req, &resp);
    EXPECT_THAT(s, IsOk());
    return resp.session_id();
  }

  grpc::Status CreateTensor(const v1::CreateTensorRequest& req) {
    return testing::CreateTensor(*client_, req);
  }
  grpc::Status DestroyTensor(const std::string& session, uint64_t handle) {
    return testing::DestroyTensor(*client_, session, handle);
  }
  grpc::Status CreateAlgorithm(const v1::CreateAlgorithmRequest& req) {
    return testing::CreateAlgorithm(*client_, req);
  }
  grpc::Status CreateSequence(const std::string& session, uint64_t handle, uint32_t queue = 0,
                              uint32_t timestamps = 0) {
    return testing::CreateSequence(*client_, session, handle, queue, timestamps);
  }
  grpc::Status Record(const std::string& session, uint64_t sequence,
                      std::vector<v1::SequenceAction> actions) {
    return testing::Record(*client_, session, sequence, actions);
  }
  grpc::Status Eval(const v1::EvalRequest& req, v1::EvalResponse* resp) {
    return testing::Eval(*client_, req, resp);
  }

  // Sets up, in `session`, tensors in (h) and out (h+1) of `n` floats, a scale algorithm (h+2)
  // and a sequence (h+3) recording sync_device(in), dispatch, sync_local(out).
  void MakePipeline(const std::string& session, uint64_t h, uint32_t n, float scale) {
    std::vector<float> zeros(n, 0.0f);
    ASSERT_THAT(CreateTensor(FloatTensor(session, h, zeros)), IsOk());
    ASSERT_THAT(CreateTensor(FloatTensor(session, h + 1, zeros)), IsOk());
    ASSERT_THAT(CreateAlgorithm(ScaleAlgorithm(session, h + 2, h, h + 1, n, scale)), IsOk());
    ASSERT_THAT(CreateSequence(session, h + 3), IsOk());
    ASSERT_THAT(Record(session, h + 3,
                       {RecordOp(SyncDevice({h})), RecordOp(Dispatch(h + 2)),
                        RecordOp(SyncLocal({h + 1}))}),
                IsOk());
  }

  // An eval of MakePipeline's sequence with `input` uploaded and the output downloaded.
  static v1::EvalRequest PipelineEval(const std::string& session, uint64_t h,
                                      const std::vector<float>& input) {
    return UploadEvalDownload(session, h + 3, h, FloatBytes(input), h + 1);
  }

  // Runs MakePipeline's sequence on fresh input and checks the output.
  void ExpectPipelineWorks(const std::string& session, uint64_t h, uint32_t n, float scale) {
    std::vector<float> input(n);
    for (uint32_t i = 0; i < n; ++i) input[i] = static_cast<float>(i) + 0.5f;
    v1::EvalResponse resp;
    ASSERT_THAT(Eval(PipelineEval(session, h, input), &resp), IsOk());
    ASSERT_EQ(resp.downloads_size(), 1);
    EXPECT_EQ(resp.downloads(0).handle(), h + 1);
    std::vector<float> out = Floats(resp.downloads(0).data());
    ASSERT_EQ(out.size(), n);
    for (uint32_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(out[i], input[i] * scale) << "element " << i;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace komputed::server::testing
