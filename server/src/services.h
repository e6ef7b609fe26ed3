#pragma once

#include <cstdint>
#include <functional>

#include "auth.h"
#include "build_pool.h"
#include "device_pool.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "metrics.h"
#include "server_options.h"
#include "session_manager.h"

namespace komputed::server {

// What the services act on. Everything it points to outlives the services.
struct ServiceContext {
  DevicePool* pool = nullptr;
  SessionManager* sessions = nullptr;
  const Authenticator* auth = nullptr;
  const ServerOptions* options = nullptr;  // the daemon's (max_message_bytes, idle timeout)
  Metrics* metrics = nullptr;
  BuildPool* builds = nullptr;  // where algorithms are compiled and built
};

// The komputed.v1 services, on gRPC's callback API. The handlers are thin: they look the session
// up, call it, and translate the result with ToGrpcStatus. No handler blocks a gRPC thread on the
// device: evals finish their call from the device's completion waiter. Thread-safe.

class DevicesService final : public v1::Devices::CallbackService {
 public:
  explicit DevicesService(ServiceContext context) : ctx_(context) {}
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* context,
                                        const v1::ListDevicesRequest* request,
                                        v1::ListDevicesResponse* response) override;

 private:
  ServiceContext ctx_;
};

// Ping is served on the completion-queue API, by the UnaryQueue (unary_queue.h) that calls
// ServePing; the other methods on the callback API.
class SessionsService final
    : public v1::Sessions::WithCallbackMethod_OpenSession<
          v1::Sessions::WithCallbackMethod_CloseSession<v1::Sessions::WithCallbackMethod_KeepAlive<
              v1::Sessions::WithCallbackMethod_ListSessions<
                  v1::Sessions::WithAsyncMethod_Ping<v1::Sessions::Service>>>>> {
 public:
  explicit SessionsService(ServiceContext context) : ctx_(context) {}
  // Serves one Ping call: fills `response` and returns the call's status.
  grpc::Status ServePing(grpc::ServerContext* context, const v1::PingRequest* request,
                         v1::PingResponse* response);
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* context,
                                        const v1::OpenSessionRequest* request,
                                        v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* context,
                                      const v1::KeepAliveRequest* request,
                                      v1::KeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;

 private:
  ServiceContext ctx_;
};

// WriteTensor and ReadTensor are served raw (grpc::ByteBuffer), so that tensor data does not pass
// through protobuf strings: on its way in it is copied from the received messages into staging and
// from there into the tensor at the end (a call is all or nothing); on its way out each chunk is
// copied once from the tensor, into the message that gRPC sends (tensor_io.h).
class TensorsService final
    : public v1::Tensors::WithRawCallbackMethod_WriteTensor<
          v1::Tensors::WithRawCallbackMethod_ReadTensor<v1::Tensors::CallbackService>> {
 public:
  explicit TensorsService(ServiceContext context) : ctx_(context) {}
  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* context,
                                         const v1::CreateTensorRequest* request,
                                         v1::CreateTensorResponse* response) override;
  grpc::ServerUnaryReactor* DestroyTensor(grpc::CallbackServerContext* context,
                                          const v1::DestroyTensorRequest* request,
                                          v1::DestroyTensorResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* WriteTensor(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadTensor(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;

 private:
  ServiceContext ctx_;
};

class AlgorithmsService final : public v1::Algorithms::CallbackService {
 public:
  explicit AlgorithmsService(ServiceContext context) : ctx_(context) {}
  grpc::ServerUnaryReactor* CreateAlgorithm(grpc::CallbackServerContext* context,
                                            const v1::CreateAlgorithmRequest* request,
                                            v1::CreateAlgorithmResponse* response) override;
  grpc::ServerUnaryReactor* RebuildAlgorithm(grpc::CallbackServerContext* context,
                                             const v1::CreateAlgorithmRequest* request,
                                             v1::CreateAlgorithmResponse* response) override;
  grpc::ServerUnaryReactor* SetPushConstants(grpc::CallbackServerContext* context,
                                             const v1::SetPushConstantsRequest* request,
                                             v1::SetPushConstantsResponse* response) override;
  grpc::ServerUnaryReactor* DestroyAlgorithm(grpc::CallbackServerContext* context,
                                             const v1::DestroyAlgorithmRequest* request,
                                             v1::DestroyAlgorithmResponse* response) override;
  grpc::ServerUnaryReactor* CompileGlsl(grpc::CallbackServerContext* context,
                                        const v1::CompileGlslRequest* request,
                                        v1::CompileGlslResponse* response) override;

 private:
  ServiceContext ctx_;
};

// Eval is served on the completion-queue API, by the UnaryQueue (unary_queue.h) that calls
// ServeEval; the other methods on the callback API.
class SequencesService final
    : public v1::Sequences::WithCallbackMethod_CreateSequence<
          v1::Sequences::WithCallbackMethod_Record<
              v1::Sequences::WithCallbackMethod_DestroySequence<
                  v1::Sequences::WithCallbackMethod_GetTimestamps<
                      v1::Sequences::WithCallbackMethod_Execute<
                          v1::Sequences::WithAsyncMethod_Eval<v1::Sequences::Service>>>>>> {
 public:
  explicit SequencesService(ServiceContext context) : ctx_(context) {}
  // Serves one Eval call: `finish` is called once, with the call's status, after `response` has
  // been filled (on this thread, or on the device's completion waiter or the build pool later).
  // The call's context, request and response live until then.
  void ServeEval(grpc::ServerContext* context, const v1::EvalRequest* request,
                 v1::EvalResponse* response, std::function<void(const grpc::Status&)> finish);
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* context,
                                           const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse* response) override;
  grpc::ServerUnaryReactor* Record(grpc::CallbackServerContext* context,
                                   const v1::RecordRequest* request,
                                   v1::RecordResponse* response) override;
  grpc::ServerUnaryReactor* DestroySequence(grpc::CallbackServerContext* context,
                                            const v1::DestroySequenceRequest* request,
                                            v1::DestroySequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetTimestamps(grpc::CallbackServerContext* context,
                                          const v1::GetTimestampsRequest* request,
                                          v1::GetTimestampsResponse* response) override;
  grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteEvent>* Execute(
      grpc::CallbackServerContext* context) override;

 private:
  ServiceContext ctx_;
};

}  // namespace komputed::server
