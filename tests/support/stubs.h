#pragma once
// The stubs of every komputed.v1 service over one channel. Header-only: for test targets that
// link komputed::proto and gRPC.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "komputed/v1/komputed.grpc.pb.h"

namespace komputed::test_support {

// Owns its channel and the stubs over it; the stubs may be used from any thread.
struct Stubs {
  // Messages either way may be up to `max_message_bytes`; 0 keeps gRPC's limits.
  explicit Stubs(const std::string& address, int max_message_bytes = 0) {
    grpc::ChannelArguments args;
    if (max_message_bytes > 0) {
      args.SetMaxReceiveMessageSize(max_message_bytes);
      args.SetMaxSendMessageSize(max_message_bytes);
    }
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    MakeStubs();
  }
  // Over a channel made elsewhere (with credentials or interceptors).
  explicit Stubs(std::shared_ptr<grpc::Channel> over) : channel(std::move(over)) { MakeStubs(); }

  void MakeStubs() {
    devices = v1::Devices::NewStub(channel);
    sessions = v1::Sessions::NewStub(channel);
    tensors = v1::Tensors::NewStub(channel);
    algorithms = v1::Algorithms::NewStub(channel);
    sequences = v1::Sequences::NewStub(channel);
  }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Devices::Stub> devices;
  std::unique_ptr<v1::Sessions::Stub> sessions;
  std::unique_ptr<v1::Tensors::Stub> tensors;
  std::unique_ptr<v1::Algorithms::Stub> algorithms;
  std::unique_ptr<v1::Sequences::Stub> sequences;
};

}  // namespace komputed::test_support
