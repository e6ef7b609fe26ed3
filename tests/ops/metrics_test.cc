// Prometheus metrics of the real daemon, scraped over HTTP: every metric of the table is there
// with its type, and the numbers move as the work done says they must.
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace komputed::ops_testing {
namespace {

constexpr char kEval[] = "komputed.v1.Sequences/Eval";
constexpr char kCreateTensor[] = "komputed.v1.Tensors/CreateTensor";
constexpr char kCreateAlgorithm[] = "komputed.v1.Algorithms/CreateAlgorithm";

// The contract with deploy/grafana and tests/deploy/check_deploy.py, and what else a daemon without
// tenants serves.
const std::map<std::string, std::string> kTable = {
    {"komputed_rpcs_total", "counter"},
    {"komputed_rpc_duration_seconds", "histogram"},
    {"komputed_sessions_open", "gauge"},
    {"komputed_sessions_opened_total", "counter"},
    {"komputed_sessions_reaped_total", "counter"},
    {"komputed_device_memory_used_bytes", "gauge"},
    {"komputed_device_memory_limit_bytes", "gauge"},
    {"komputed_submissions_total", "counter"},
    {"komputed_gpu_execution_seconds_total", "counter"},
    {"komputed_queue_depth", "gauge"},
    {"komputed_bytes_transferred_total", "counter"},
    {"komputed_shader_compilations_total", "counter"},
    {"komputed_shader_validations_total", "counter"},
    {"komputed_device_losses_total", "counter"},
    {"komputed_device_recoveries_total", "counter"},
    // Served, not on the dashboard.
    {"komputed_execute_queued_bytes", "gauge"},
    {"komputed_execute_messages_total", "counter"},
    {"komputed_execute_evals_total", "counter"},
    {"komputed_submitted_together_total", "counter"},
    {"komputed_shared_memory_tensors_total", "counter"},
    {"komputed_same_host_evals_total", "counter"},
    {"komputed_same_host_rings_total", "counter"},
    {"komputed_same_host_ring_wakes_total", "counter"},
    {"komputed_same_host_ring_evals_total", "counter"},
    {"komputed_sequences_released_total", "counter"},
};

TEST(Metrics, EveryMetricOfTheTableIsServedWithItsType) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  EXPECT_EQ(client.Health(""), grpc::health::v1::HealthCheckResponse::SERVING);  // one RPC

  const Samples samples = Samples::From(daemon);
  ASSERT_GT(samples.size(), 0u) << "nothing scraped from " << daemon.metrics_address();
  for (const auto& [name, type] : kTable) {
    auto it = samples.types().find(name);
    ASSERT_NE(it, samples.types().end()) << name << " is not served";
    EXPECT_EQ(it->second, type) << name;
  }
  for (const auto& [name, type] : samples.types()) {
    if (name.rfind("komputed_", 0) == 0) {
      EXPECT_TRUE(kTable.contains(name)) << name;
    }
  }
  EXPECT_GT(samples.Get("komputed_device_memory_limit_bytes", {{"device", "0"}}), 0);
  EXPECT_EQ(samples.Get("komputed_device_memory_used_bytes", {{"device", "0"}}), 0);
  EXPECT_EQ(samples.Get("komputed_sessions_open"), 0);
  EXPECT_TRUE(samples.Has("komputed_submissions_total", {{"device", "0"}, {"queue", "0"}}));
  EXPECT_TRUE(samples.Has("komputed_device_losses_total", {{"device", "0"}}));
  EXPECT_TRUE(samples.Has("komputed_device_recoveries_total", {{"device", "0"}}));
  EXPECT_EQ(samples.Get("komputed_rpcs_total",
                        {{"method", "grpc.health.v1.Health/Check"}, {"code", "OK"}}),
            1);
}

TEST(Metrics, CountWhatTheDaemonDoes) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  const Samples before = Samples::From(daemon);

  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  // A host tensor with data (64 bytes, counted once) ...
  ASSERT_THAT(client.CreateTensor(
                  FloatTensor(session, 1, std::vector<float>(16, 1.0f), v1::MEMORY_TYPE_HOST)),
              IsOk());
  // ... and a scale pipeline: two device tensors of 64 floats (256 bytes, counted twice: buffer
  // and staging) created with data, a GLSL algorithm, a sequence with timestamps.
  constexpr uint32_t kN = 64;
  MakeScalePipeline(client, session, 10, kN, 2.0f, /*timestamps=*/4);
  constexpr int kEvals = 5;
  uint64_t device_ns = 0;
  for (int e = 0; e < kEvals; ++e) {
    std::vector<float> input(kN);
    for (uint32_t i = 0; i < kN; ++i) input[i] = static_cast<float>(e * 100 + i);
    v1::EvalResponse resp;
    ASSERT_THAT(client.Eval(ScaleEval(session, 10, input), &resp), IsOk());
    ASSERT_EQ(resp.downloads_size(), 1);
    EXPECT_EQ(Floats(resp.downloads(0).data())[5], input[5] * 2.0f);
    device_ns += resp.device_time_ns();
  }
  // Bad requests: INVALID_ARGUMENT (a tensor of no elements), NOT_FOUND (an unknown sequence),
  // a GLSL compile error, SPIR-V that fails validation.
  v1::CreateTensorRequest empty = FloatTensor(session, 2, {});
  EXPECT_THAT(client.CreateTensor(empty), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  v1::EvalRequest unknown;
  unknown.set_session_id(session);
  unknown.set_sequence(999);
  v1::EvalResponse ignored;
  EXPECT_THAT(client.Eval(unknown, &ignored), HasCode(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(
      client.CreateAlgorithm(GlslAlgorithm(session, 20, {1}, "#version 450\nvoid main() {", 1, "")),
      HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  v1::CreateAlgorithmRequest bad_spirv = GlslAlgorithm(session, 21, {1}, "", 1, "");
  const uint32_t words[] = {0x07230203u, 0x00010000u, 0, 1, 0, 0xdeadbeefu};
  bad_spirv.set_spirv(std::string(reinterpret_cast<const char*>(words), sizeof(words)));
  EXPECT_THAT(client.CreateAlgorithm(bad_spirv), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  // WriteTensor and ReadTensor of the host tensor's 64 bytes.
  {
    grpc::ClientContext ctx;
    v1::WriteTensorResponse resp;
    auto writer = client.tensors->WriteTensor(&ctx, &resp);
    v1::TensorChunk chunk;
    chunk.set_session_id(session);
    chunk.set_handle(1);
    chunk.set_total_bytes(64);
    chunk.set_data(FloatBytes(std::vector<float>(16, 3.0f)));
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_THAT(writer->Finish(), IsOk());
  }
  {
    grpc::ClientContext ctx;
    v1::ReadTensorRequest req;
    req.set_session_id(session);
    req.set_handle(1);
    auto reader = client.tensors->ReadTensor(&ctx, req);
    v1::TensorChunk chunk;
    uint64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    ASSERT_THAT(reader->Finish(), IsOk());
    EXPECT_EQ(bytes, 64u);
  }

  const Samples after = Samples::From(daemon);
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
    return after.Get(name, labels) - before.Get(name, labels);
  };
  const std::map<std::string, std::string> dev0 = {{"device", "0"}};
  const std::map<std::string, std::string> queue0 = {{"device", "0"}, {"queue", "0"}};

  EXPECT_EQ(delta("komputed_rpcs_total", {{"method", kEval}, {"code", "OK"}}), kEvals);
  EXPECT_EQ(delta("komputed_rpcs_total", {{"method", kEval}, {"code", "NOT_FOUND"}}), 1);
  EXPECT_EQ(delta("komputed_rpcs_total", {{"method", kCreateTensor}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(delta("komputed_rpcs_total", {{"method", kCreateTensor}, {"code", "OK"}}), 3);
  EXPECT_EQ(
      delta("komputed_rpcs_total", {{"method", kCreateAlgorithm}, {"code", "INVALID_ARGUMENT"}}),
      2);
  EXPECT_EQ(
      delta("komputed_rpcs_total", {{"method", "komputed.v1.Tensors/WriteTensor"}, {"code", "OK"}}),
      1);
  EXPECT_EQ(delta("komputed_rpc_duration_seconds_count", {{"method", kEval}}), kEvals + 1);
  EXPECT_EQ(after.Get("komputed_rpc_duration_seconds_bucket", {{"method", kEval}, {"le", "+Inf"}}),
            after.Get("komputed_rpc_duration_seconds_count", {{"method", kEval}}));
  EXPECT_GT(delta("komputed_rpc_duration_seconds_sum", {{"method", kEval}}), 0);

  EXPECT_EQ(after.Get("komputed_sessions_open"), 1);
  EXPECT_EQ(delta("komputed_sessions_opened_total", {}), 1);
  EXPECT_EQ(after.Get("komputed_device_memory_used_bytes", dev0), 64 + 2 * 2 * kN * 4);
  EXPECT_EQ(delta("komputed_submissions_total", queue0), kEvals);
  EXPECT_EQ(after.Get("komputed_queue_depth", queue0), 0);
  if (device_ns > 0) {
    EXPECT_NEAR(delta("komputed_gpu_execution_seconds_total", queue0), device_ns * 1e-9, 1e-6);
  }
  // Uploads: the host tensor's data, both pipeline tensors' data, each eval's input, the
  // WriteTensor chunk. Downloads: each eval's output, the ReadTensor chunk.
  EXPECT_EQ(delta("komputed_bytes_transferred_total", {{"direction", "upload"}}),
            64 + 2 * kN * 4 + kEvals * kN * 4 + 64);
  EXPECT_EQ(delta("komputed_bytes_transferred_total", {{"direction", "download"}}),
            kEvals * kN * 4 + 64);
  EXPECT_EQ(delta("komputed_shader_compilations_total", {{"result", "ok"}}), 1);
  EXPECT_EQ(delta("komputed_shader_compilations_total", {{"result", "error"}}), 1);
  EXPECT_EQ(delta("komputed_shader_validations_total", {{"result", "ok"}}), 1);
  EXPECT_EQ(delta("komputed_shader_validations_total", {{"result", "error"}}), 1);
  EXPECT_EQ(delta("komputed_device_losses_total", dev0), 0);
  EXPECT_EQ(delta("komputed_device_recoveries_total", dev0), 0);

  // Closing the session returns its memory.
  ASSERT_THAT(client.Close(session), IsOk());
  const Samples closed = Samples::From(daemon);
  EXPECT_EQ(closed.Get("komputed_device_memory_used_bytes", dev0), 0);
  EXPECT_EQ(closed.Get("komputed_sessions_open"), 0);
  EXPECT_EQ(closed.Get("komputed_sessions_reaped_total", {{"reason", "idle"}}), 0);
}

TEST(Metrics, GpuTimeComesFromTimestamps) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  MakeScalePipeline(client, session, 1, 256, 3.0f, /*timestamps=*/4);
  MakeScalePipeline(client, session, 11, 256, 3.0f, /*timestamps=*/0);
  uint64_t device_ns = 0;
  for (int e = 0; e < 3; ++e) {
    v1::EvalResponse resp;
    ASSERT_THAT(client.Eval(ScaleEval(session, 1, std::vector<float>(256, 1.0f)), &resp), IsOk());
    EXPECT_GE(resp.timestamps_ns_size(), 2);
    device_ns += resp.device_time_ns();
    v1::EvalResponse untimed;
    ASSERT_THAT(client.Eval(ScaleEval(session, 11, std::vector<float>(256, 1.0f)), &untimed),
                IsOk());
    EXPECT_EQ(untimed.device_time_ns(), 0u);
  }
  const double seconds = Samples::From(daemon).Get("komputed_gpu_execution_seconds_total",
                                                   {{"device", "0"}, {"queue", "0"}});
  // Only the timed sequence adds GPU time: exactly what its evals reported.
  EXPECT_NEAR(seconds, device_ns * 1e-9, 1e-6);
  EXPECT_GT(device_ns, 0u) << "the device reported no GPU time between its timestamps";
}

}  // namespace
}  // namespace komputed::ops_testing
