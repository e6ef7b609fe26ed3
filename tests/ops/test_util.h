#pragma once
// What the ops tests share beyond tests/support: the stubs of every service, and pipelines built
// through them.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/bytes.h"
#include "support/daemon_process.h"
#include "support/grpc_matchers.h"
#include "support/metrics.h"
#include "support/process.h"
#include "support/requests.h"
#include "support/slow_kernel.h"
#include "support/stubs.h"

namespace komputed::ops_testing {

namespace v1 = ::komputed::v1;
using namespace ::komputed::test_support;

// The stubs of every komputed service and of grpc.health.v1 over one channel.
struct Client : Stubs {
  explicit Client(const std::string& address);

  std::unique_ptr<grpc::health::v1::Health::Stub> health;

  // The calls the tests make, each with a 30 s deadline.
  grpc::Status Open(std::string* session_id, const std::string& name = "ops-test");
  grpc::Status Close(const std::string& session_id);
  grpc::Status CreateTensor(const v1::CreateTensorRequest& request);
  grpc::Status CreateAlgorithm(const v1::CreateAlgorithmRequest& request);
  grpc::Status CreateSequence(const std::string& session, uint64_t handle, uint32_t timestamps = 0);
  grpc::Status Record(const std::string& session, uint64_t sequence,
                      const std::vector<v1::Operation>& ops);
  grpc::Status Eval(const v1::EvalRequest& request, v1::EvalResponse* response);
  // The health status of `service`; NOT_FOUND etc. in `status`.
  grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& service,
                                                              grpc::Status* status = nullptr);
};

// A scale pipeline in `session`: tensors h (in) and h+1 (out) of n floats (device memory),
// algorithm h+2 (out = in * scale), sequence h+3 recording sync_device(in), dispatch,
// sync_local(out), with `timestamps` GPU timestamps.
void MakeScalePipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                       float scale, uint32_t timestamps = 0);
// An eval of that sequence uploading `input` and downloading the output.
v1::EvalRequest ScaleEval(const std::string& session, uint64_t h, const std::vector<float>& input);

// A slow pipeline: tensor h of n uints (device memory), algorithm h+1 (kSlowShader doing
// `work`), sequence h+2 recording sync_device, dispatch, sync_local.
void MakeSlowPipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                      const test_support::SlowWork& work);
// Whether the daemon's device 0 is a CPU (lavapipe).
bool DeviceIsCpu(Client& client);
v1::EvalRequest SlowEval(const std::string& session, uint64_t h,
                         const std::vector<uint32_t>& input);

}  // namespace komputed::ops_testing
