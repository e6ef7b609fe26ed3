#pragma once

#include <cstdint>
#include <functional>

#include "auth.h"
#include "build_pool.h"
#include "call_queue.h"
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

// The komputed.v1 services, on gRPC's completion-queue API: AddTo adds their methods to the
// CallQueue that serves them (call_queue.h). The handlers are thin: they look the session up, call
// it, and translate the result with ToGrpcStatus. No handler blocks a serving thread on the
// device: evals finish their call from the device's completion waiter. Thread-safe.

class DevicesService final : public v1::Devices::AsyncService {
 public:
  explicit DevicesService(ServiceContext context) : ctx_(context) {}
  void AddTo(CallQueue& queue);
  void ServeListDevices(grpc::ServerContext* context, const v1::ListDevicesRequest* request,
                        v1::ListDevicesResponse* response, Answer answer);

 private:
  ServiceContext ctx_;
};

class SessionsService final : public v1::Sessions::AsyncService {
 public:
  explicit SessionsService(ServiceContext context) : ctx_(context) {}
  void AddTo(CallQueue& queue);
  void ServeOpenSession(grpc::ServerContext* context, const v1::OpenSessionRequest* request,
                        v1::OpenSessionResponse* response, Answer answer);
  void ServeCloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest* request,
                         v1::CloseSessionResponse* response, Answer answer);
  void ServeKeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest* request,
                      v1::KeepAliveResponse* response, Answer answer);
  void ServeListSessions(grpc::ServerContext* context, const v1::ListSessionsRequest* request,
                         v1::ListSessionsResponse* response, Answer answer);
  void ServePing(grpc::ServerContext* context, const v1::PingRequest* request,
                 v1::PingResponse* response, Answer answer);

 private:
  ServiceContext ctx_;
};

// WriteTensor and ReadTensor are served raw (grpc::ByteBuffer), so that tensor data does not pass
// through protobuf strings: on its way in it is copied from the received messages into staging and
// from there into the tensor at the end (a call is all or nothing); on its way out each chunk is
// copied once from the tensor, into the message that gRPC sends (tensor_io.h).
class TensorsService final
    : public v1::Tensors::WithAsyncMethod_CreateTensor<
          v1::Tensors::WithAsyncMethod_DestroyTensor<v1::Tensors::WithRawMethod_WriteTensor<
              v1::Tensors::WithRawMethod_ReadTensor<v1::Tensors::Service>>>> {
 public:
  using Chunks = StreamOps<grpc::ByteBuffer, grpc::ByteBuffer>;
  explicit TensorsService(ServiceContext context) : ctx_(context) {}
  void AddTo(CallQueue& queue);
  void ServeCreateTensor(grpc::ServerContext* context, const v1::CreateTensorRequest* request,
                         v1::CreateTensorResponse* response, Answer answer);
  void ServeDestroyTensor(grpc::ServerContext* context, const v1::DestroyTensorRequest* request,
                          v1::DestroyTensorResponse* response, Answer answer);
  StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServeWriteTensor(grpc::ServerContext* context,
                                                                      grpc::ByteBuffer* response,
                                                                      Chunks* chunks);
  StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServeReadTensor(
      grpc::ServerContext* context, const grpc::ByteBuffer* request, Chunks* chunks);

 private:
  ServiceContext ctx_;
};

class AlgorithmsService final : public v1::Algorithms::AsyncService {
 public:
  explicit AlgorithmsService(ServiceContext context) : ctx_(context) {}
  void AddTo(CallQueue& queue);
  void ServeCreateAlgorithm(grpc::ServerContext* context, const v1::CreateAlgorithmRequest* request,
                            v1::CreateAlgorithmResponse* response, Answer answer);
  void ServeRebuildAlgorithm(grpc::ServerContext* context,
                             const v1::CreateAlgorithmRequest* request,
                             v1::CreateAlgorithmResponse* response, Answer answer);
  void ServeSetPushConstants(grpc::ServerContext* context,
                             const v1::SetPushConstantsRequest* request,
                             v1::SetPushConstantsResponse* response, Answer answer);
  void ServeDestroyAlgorithm(grpc::ServerContext* context,
                             const v1::DestroyAlgorithmRequest* request,
                             v1::DestroyAlgorithmResponse* response, Answer answer);
  void ServeCompileGlsl(grpc::ServerContext* context, const v1::CompileGlslRequest* request,
                        v1::CompileGlslResponse* response, Answer answer);

 private:
  ServiceContext ctx_;
};

class SequencesService final : public v1::Sequences::AsyncService {
 public:
  explicit SequencesService(ServiceContext context) : ctx_(context) {}
  // Eval polls (CallQueue): a client's next eval tends to follow its last one closely.
  void AddTo(CallQueue& queue);
  void ServeCreateSequence(grpc::ServerContext* context, const v1::CreateSequenceRequest* request,
                           v1::CreateSequenceResponse* response, Answer answer);
  void ServeRecord(grpc::ServerContext* context, const v1::RecordRequest* request,
                   v1::RecordResponse* response, Answer answer);
  // Answers on this thread, or on the device's completion waiter or the build pool later.
  void ServeEval(grpc::ServerContext* context, const v1::EvalRequest* request,
                 v1::EvalResponse* response, Answer answer);
  void ServeDestroySequence(grpc::ServerContext* context, const v1::DestroySequenceRequest* request,
                            v1::DestroySequenceResponse* response, Answer answer);
  void ServeGetTimestamps(grpc::ServerContext* context, const v1::GetTimestampsRequest* request,
                          v1::GetTimestampsResponse* response, Answer answer);
  StreamReactor<v1::ExecuteRequest, v1::ExecuteEvent>* ServeExecute(
      grpc::ServerContext* context, StreamOps<v1::ExecuteRequest, v1::ExecuteEvent>* stream);

 private:
  ServiceContext ctx_;
};

}  // namespace komputed::server
