#pragma once
// What the ops tests share: the real komputed binary started on 127.0.0.1:0 with its metrics on
// 127.0.0.1:0 (both addresses read from its stdout, its stderr kept in a file), a Prometheus
// scrape over a plain socket, the stubs of every service, and request builders.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/types.h>

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
#include "support/slow_kernel.h"

namespace komputed::ops_testing {

namespace v1 = ::komputed::v1;

// A komputed process. The constructor waits (bounded) for "komputed listening on ADDRESS" and
// "komputed metrics on ADDRESS" and fails the test (fatally: check started()) otherwise.
class Daemon {
 public:
  // Starts KOMPUTED_BINARY --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 `flags...`.
  explicit Daemon(const std::vector<std::string>& flags = {});
  // SIGKILL if it still runs.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  bool started() const { return !address_.empty() && !metrics_address_.empty(); }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return pid_; }
  // Sends `signal`, waits for the exit up to `timeout`: the wait status, or -1.
  int Stop(int signal, absl::Duration timeout);
  // Waits for an exit already under way: the wait status, or -1 after `timeout`.
  int WaitExit(absl::Duration timeout);
  // What it wrote to stderr (its log) so far.
  std::string Log() const;
  // Waits until the log contains `text`; false after `timeout`.
  bool WaitForLog(const std::string& text, absl::Duration timeout) const;

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::string metrics_address_;
  std::string log_path_;
};

// Runs a program to its end (killed after `timeout`): its exit code (-1 when it did not exit
// normally), with its stdout and stderr.
int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err,
               absl::Duration timeout = absl::Seconds(60));

// GET http://ADDRESS/metrics: the body, or "" when the daemon does not answer.
std::string Scrape(const std::string& metrics_address);

// One scrape's samples, by series: a metric name and its labels (in any order).
class Samples {
 public:
  explicit Samples(const std::string& text);
  static Samples From(const Daemon& daemon) { return Samples(Scrape(daemon.metrics_address())); }

  // The value of a series; 0 when absent (a counter that never moved is not written yet).
  double Get(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  bool Has(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // Every metric name that has a # TYPE line, with its type.
  const std::map<std::string, std::string>& types() const { return types_; }
  size_t size() const { return values_.size(); }

 private:
  static std::string Key(const std::string& name, const std::map<std::string, std::string>& labels);
  std::map<std::string, double> values_;
  std::map<std::string, std::string> types_;
};

// The stubs of every komputed service and of grpc.health.v1 over one channel.
struct Client {
  explicit Client(const std::string& address);

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Devices::Stub> devices;
  std::unique_ptr<v1::Sessions::Stub> sessions;
  std::unique_ptr<v1::Tensors::Stub> tensors;
  std::unique_ptr<v1::Algorithms::Stub> algorithms;
  std::unique_ptr<v1::Sequences::Stub> sequences;
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

// Matchers for grpc::Status that print the message when they fail.
MATCHER(IsOk, "") {
  if (arg.ok()) return true;
  *result_listener << "code " << static_cast<int>(arg.error_code()) << ": " << arg.error_message();
  return false;
}
MATCHER_P(HasCode, code, "") {
  if (arg.error_code() == code) return true;
  *result_listener << "code " << static_cast<int>(arg.error_code()) << ": " << arg.error_message();
  return false;
}

// out[i] = in[i] * scale (push constant); one invocation per element.
inline constexpr char kScaleShader[] = R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer In { float a[]; };
layout(set = 0, binding = 1) writeonly buffer Out { float b[]; };
layout(push_constant) uniform Push { float scale; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * scale;
}
)";

std::string FloatBytes(const std::vector<float>& values);
std::vector<float> Floats(const std::string& bytes);
std::string UintBytes(const std::vector<uint32_t>& values);
std::vector<uint32_t> Uints(const std::string& bytes);

v1::CreateTensorRequest FloatTensor(const std::string& session, uint64_t handle,
                                    const std::vector<float>& data,
                                    v1::MemoryType memory = v1::MEMORY_TYPE_DEVICE);
v1::CreateAlgorithmRequest GlslAlgorithm(const std::string& session, uint64_t handle,
                                         std::vector<uint64_t> tensors, const std::string& glsl,
                                         uint32_t workgroups, const std::string& push);
v1::Operation SyncDevice(std::vector<uint64_t> tensors);
v1::Operation SyncLocal(std::vector<uint64_t> tensors);
v1::Operation Dispatch(uint64_t algorithm);

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
