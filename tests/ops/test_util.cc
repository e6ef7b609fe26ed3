#include "test_util.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace komputed::ops_testing {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Client

Client::Client(const std::string& address)
    : Stubs(address, 64 << 20), health(grpc::health::v1::Health::NewStub(channel)) {}

grpc::Status Client::Open(std::string* session_id, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::OpenSessionRequest req;
  req.set_client_name(name);
  v1::OpenSessionResponse resp;
  grpc::Status s = sessions->OpenSession(&ctx, req, &resp);
  *session_id = resp.session_id();
  return s;
}

grpc::Status Client::Close(const std::string& session_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CloseSessionRequest req;
  req.set_session_id(session_id);
  v1::CloseSessionResponse resp;
  return sessions->CloseSession(&ctx, req, &resp);
}

grpc::Status Client::CreateTensor(const v1::CreateTensorRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateTensorResponse resp;
  return tensors->CreateTensor(&ctx, request, &resp);
}

grpc::Status Client::CreateAlgorithm(const v1::CreateAlgorithmRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateAlgorithmResponse resp;
  return algorithms->CreateAlgorithm(&ctx, request, &resp);
}

grpc::Status Client::CreateSequence(const std::string& session, uint64_t handle,
                                    uint32_t timestamps) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::CreateSequenceRequest req;
  req.set_session_id(session);
  req.set_handle(handle);
  req.set_total_timestamps(timestamps);
  v1::CreateSequenceResponse resp;
  return sequences->CreateSequence(&ctx, req, &resp);
}

grpc::Status Client::Record(const std::string& session, uint64_t sequence,
                            const std::vector<v1::Operation>& ops) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::RecordRequest req;
  req.set_session_id(session);
  req.set_sequence(sequence);
  for (const auto& op : ops) *req.add_actions()->mutable_record() = op;
  v1::RecordResponse resp;
  return sequences->Record(&ctx, req, &resp);
}

grpc::Status Client::Eval(const v1::EvalRequest& request, v1::EvalResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(60)));
  return sequences->Eval(&ctx, request, response);
}

grpc::health::v1::HealthCheckResponse::ServingStatus Client::Health(const std::string& service,
                                                                    grpc::Status* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = health->Check(&ctx, req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

// ---------------------------------------------------------------------------------------------
// Pipelines

void MakeScalePipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                       float scale, uint32_t timestamps) {
  const std::vector<float> zeros(n, 0.0f);
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, h, zeros)), IsOk());
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, h + 1, zeros)), IsOk());
  ASSERT_THAT(client.CreateAlgorithm(
                  GlslAlgorithm(session, h + 2, {h, h + 1}, kScaleShader, n, FloatBytes({scale}))),
              IsOk());
  ASSERT_THAT(client.CreateSequence(session, h + 3, timestamps), IsOk());
  ASSERT_THAT(client.Record(session, h + 3, {SyncDevice({h}), Dispatch(h + 2), SyncLocal({h + 1})}),
              IsOk());
}

v1::EvalRequest ScaleEval(const std::string& session, uint64_t h, const std::vector<float>& input) {
  return UploadEvalDownload(session, h + 3, h, FloatBytes(input), h + 1);
}

void MakeSlowPipeline(Client& client, const std::string& session, uint64_t h, uint32_t n,
                      const test_support::SlowWork& work) {
  v1::CreateTensorRequest t;
  t.set_session_id(session);
  t.set_handle(h);
  t.set_element_type(v1::ELEMENT_TYPE_UINT32);
  t.set_count(n);
  ASSERT_THAT(client.CreateTensor(t), IsOk());
  ASSERT_THAT(client.CreateAlgorithm(GlslAlgorithm(session, h + 1, {h}, test_support::kSlowShader,
                                                   n, work.PushConstants())),
              IsOk());
  ASSERT_THAT(client.CreateSequence(session, h + 2), IsOk());
  ASSERT_THAT(client.Record(session, h + 2, {SyncDevice({h}), Dispatch(h + 1), SyncLocal({h})}),
              IsOk());
}

v1::EvalRequest SlowEval(const std::string& session, uint64_t h,
                         const std::vector<uint32_t>& input) {
  return UploadEvalDownload(session, h + 2, h, UintBytes(input), h);
}

bool DeviceIsCpu(Client& client) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListDevicesResponse response;
  const grpc::Status status =
      client.devices->ListDevices(&context, v1::ListDevicesRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok() && response.devices_size() > 0 &&
         response.devices(0).device_type() == 4;  // VK_PHYSICAL_DEVICE_TYPE_CPU
}

}  // namespace komputed::ops_testing
