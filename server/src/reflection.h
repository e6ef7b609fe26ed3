#pragma once
// gRPC's server reflection (grpc.reflection.v1alpha), served on the daemon's CallQueue: grpcurl
// and grpc_cli list the services and fetch their descriptors without the proto files.

#include <string>
#include <vector>

#include "call_queue.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace komputed::server {

// Answers from protobuf's generated descriptor pool, which holds every message and service that
// the daemon links. A stream answers each request in turn; its file descriptor responses carry
// the file asked for and those it depends on that the stream has not sent yet. Thread-safe.
class ReflectionService final : public grpc::reflection::v1alpha::ServerReflection::AsyncService {
 public:
  using Request = grpc::reflection::v1alpha::ServerReflectionRequest;
  using Response = grpc::reflection::v1alpha::ServerReflectionResponse;

  // `services`: the full names that list_services reports (this one's is added).
  explicit ReflectionService(std::vector<std::string> services);
  void AddTo(CallQueue& queue);
  StreamReactor<Request, Response>* ServeInfo(grpc::ServerContext* context,
                                              StreamOps<Request, Response>* stream);

 private:
  class Stream;
  const std::vector<std::string> services_;
};

}  // namespace komputed::server
