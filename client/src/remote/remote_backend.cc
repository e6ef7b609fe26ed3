#include "remote/remote_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "komputed/core/types.h"
#include "komputed/v1/semantics_wire.h"
#include "remote/connection.h"
#include "remote/credentials.h"
#include "remote/objects.h"
#include "remote/placement.h"
#include "remote/rpc.h"
#include "remote/sequence.h"

namespace kp::internal {
namespace {

namespace core = komputed::core;
namespace v1 = komputed::v1;
using remote::Connection;
using remote::RemoteAlgorithm;
using remote::RemoteSequence;
using remote::RemoteTensor;
using remote::RpcTimeout;
using remote::SetDeadline;

absl::Status NotMine() {
  return absl::FailedPreconditionError("the algorithm belongs to another Manager");
}

class RemoteBackend final : public Backend {
 public:
  explicit RemoteBackend(std::shared_ptr<Connection> connection)
      : connection_(std::move(connection)) {}

  absl::Status Close(absl::Duration timeout) override { return connection_->Close(timeout); }

  absl::StatusOr<std::shared_ptr<BackendTensor>> CreateTensor(const TensorSpec& spec,
                                                              const void* data) override {
    if (spec.image.is_image()) {
      KD_RETURN_IF_ERROR(core::CheckImageShape(spec.type, spec.memory, spec.image));
    }
    KD_ASSIGN_OR_RETURN(
        const uint32_t element_size,
        core::CheckTensorShape(spec.type, spec.memory, spec.count, spec.element_size));
    KD_RETURN_IF_ERROR(connection_->FlushIfMany());
    const uint64_t handle = connection_->NewHandle();
    TensorSpec resolved = spec;
    resolved.element_size = element_size;
    const uint64_t bytes = spec.count * element_size;
    v1::CreateTensorRequest request;
    request.set_session_id(connection_->session_id());
    request.set_handle(handle);
    request.set_element_type(v1::wire::ToWire(spec.type));
    request.set_count(spec.count);
    request.set_element_size(spec.element_size);
    request.set_memory_type(v1::wire::ToWire(spec.memory));
    if (spec.image.is_image()) {
      request.mutable_image()->set_width(spec.image.width);
      request.mutable_image()->set_height(spec.image.height);
      request.mutable_image()->set_channels(spec.image.channels);
    }
    // Host data in memory shared with the daemon where it can be (same host), named by the
    // tensor's handle; else it goes over gRPC, inline when small.
    std::shared_ptr<core::SharedMemory> shared;
    if (spec.memory == core::MemoryType::kDevice ||
        (spec.memory == core::MemoryType::kHost && !spec.image.is_image())) {
      shared = connection_->ShareMemory(handle, (bytes + 3) & ~uint64_t{3});
    }
    if (shared != nullptr) {
      if (data != nullptr) std::memcpy(shared->data(), data, bytes);
      request.set_shared_memory(handle);
      data = nullptr;  // in place already
    }
    const bool inline_data = data != nullptr && bytes <= remote::kInlineLimit;
    if (inline_data) request.mutable_data()->assign(reinterpret_cast<const char*>(data), bytes);
    {
      grpc::ClientContext context;
      SetDeadline(context, RpcTimeout());
      v1::CreateTensorResponse response;
      KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
          connection_->tensors().CreateTensor(&context, request, &response), "creating a tensor"));
    }
    auto tensor = std::make_shared<RemoteTensor>(this, connection_, handle, resolved, shared);
    if (tensor->host() != nullptr && shared == nullptr) {
      if (data != nullptr) {
        std::memcpy(tensor->host(), data, bytes);
      } else {
        std::memset(tensor->host(), 0, bytes);
      }
    }
    // On an error below, dropping `tensor` queues its destroy.
    if (data != nullptr && !inline_data) {
      const auto* bytes_in = static_cast<const uint8_t*>(data);
      if (core::HasHostData(spec.memory)) {
        KD_RETURN_IF_ERROR(connection_->bulk().Write(handle, bytes_in, bytes));
        if (core::HasStaging(spec.memory)) {
          KD_RETURN_IF_ERROR(RunOnce(core::OpKind::kSyncDevice, {handle}));
        }
      } else {
        KD_RETURN_IF_ERROR(UploadToStorage(handle, spec, bytes_in, bytes));
      }
    }
    return tensor;
  }

  absl::StatusOr<std::shared_ptr<BackendAlgorithm>> CreateAlgorithm(
      const AlgorithmSpec& spec) override {
    KD_RETURN_IF_ERROR(connection_->FlushIfMany());
    auto algorithm = std::make_shared<RemoteAlgorithm>(this, connection_, connection_->NewHandle());
    KD_RETURN_IF_ERROR(Build(*algorithm, spec, /*rebuild=*/false));
    return algorithm;
  }

  absl::Status RebuildAlgorithm(BackendAlgorithm& algorithm, const AlgorithmSpec& spec) override {
    if (algorithm.owner() != this) return NotMine();
    return Build(static_cast<RemoteAlgorithm&>(algorithm), spec, /*rebuild=*/true);
  }

  absl::Status SetPushConstants(BackendAlgorithm& algorithm, std::vector<uint8_t> values) override {
    if (algorithm.owner() != this) return NotMine();
    auto& remote = static_cast<RemoteAlgorithm&>(algorithm);
    KD_RETURN_IF_ERROR(core::CheckPushConstantSize(values.size(), remote.PushConstants().size()));
    v1::SetPushConstantsRequest request;
    request.set_session_id(connection_->session_id());
    request.set_handle(remote.handle());
    request.set_push_constants(values.data(), values.size());
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::SetPushConstantsResponse response;
    KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
        connection_->algorithms().SetPushConstants(&context, request, &response),
        "setting push constants"));
    remote.SetPushConstants(std::move(values));
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<BackendSequence>> CreateSequence(
      uint32_t queue, uint32_t total_timestamps) override {
    KD_RETURN_IF_ERROR(connection_->FlushIfMany());
    const uint64_t handle = connection_->NewHandle();
    v1::CreateSequenceRequest request;
    request.set_session_id(connection_->session_id());
    request.set_handle(handle);
    request.set_queue(queue);
    request.set_total_timestamps(total_timestamps);
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::CreateSequenceResponse response;
    KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
        connection_->sequences().CreateSequence(&context, request, &response),
        "creating a sequence"));
    return std::make_shared<RemoteSequence>(this, connection_, handle);
  }

  VkPhysicalDeviceProperties Properties() const override { return connection_->properties(); }

  absl::StatusOr<std::vector<DeviceEntry>> ListDevices() const override {
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::ListDevicesResponse response;
    KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
        connection_->devices().ListDevices(&context, v1::ListDevicesRequest(), &response),
        "listing devices"));
    std::vector<DeviceEntry> out;
    for (const auto& d : response.devices()) out.push_back({remote::PropertiesOf(d)});
    return out;
  }

 private:
  // Runs one operation over tensor handles in a sequence made for it (the daemon's device buffer
  // of a tensor with staging gets its initial data so, as in-process).
  absl::Status RunOnce(core::OpKind kind, std::vector<uint64_t> tensors) {
    v1::EvalRequest request;
    request.set_session_id(connection_->session_id());
    const uint64_t seq = connection_->NewHandle();
    request.add_commands()->mutable_create_sequence()->set_handle(seq);
    auto* record = request.add_commands()->mutable_record();
    record->set_sequence(seq);
    *record->add_actions()->mutable_record() =
        v1::wire::ToWire(v1::wire::HandleOp{kind, std::move(tensors)});
    request.set_sequence(seq);
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::EvalResponse response;
    KD_RETURN_IF_ERROR(
        remote::FromGrpcStatusWithHint(connection_->sequences().Eval(&context, request, &response),
                                       "uploading a tensor's initial data"));
    v1::Command destroy;
    destroy.mutable_destroy_sequence()->set_handle(seq);
    connection_->Defer(std::move(destroy));
    return absl::OkStatus();
  }

  // A storage tensor has no host data to stream into: data too large for its creation message
  // goes into a host tensor made for it (counted against the host_memory_bytes quota while this
  // lasts) and is copied on the device, as in-process through an upload buffer.
  absl::Status UploadToStorage(uint64_t tensor, const TensorSpec& spec, const uint8_t* data,
                               uint64_t bytes) {
    const uint64_t staging = connection_->NewHandle();
    v1::CreateTensorRequest request;
    request.set_session_id(connection_->session_id());
    request.set_handle(staging);
    request.set_element_type(v1::wire::ToWire(spec.type));
    request.set_count(spec.count);
    request.set_element_size(spec.element_size);
    request.set_memory_type(v1::wire::ToWire(core::MemoryType::kHost));
    {
      grpc::ClientContext context;
      SetDeadline(context, RpcTimeout());
      v1::CreateTensorResponse response;
      KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
          connection_->tensors().CreateTensor(&context, request, &response),
          "staging a storage tensor's initial data"));
    }
    absl::Status status = connection_->bulk().Write(staging, data, bytes);
    if (status.ok()) status = RunOnce(core::OpKind::kCopy, {staging, tensor});
    v1::Command destroy;
    destroy.mutable_destroy_tensor()->set_handle(staging);
    connection_->Defer(std::move(destroy));
    return status;
  }

  absl::Status Build(RemoteAlgorithm& algorithm, const AlgorithmSpec& spec, bool rebuild) {
    KD_ASSIGN_OR_RETURN(auto tensors, remote::Unwrap(this, spec.tensors));
    v1::CreateAlgorithmRequest request;
    request.set_session_id(connection_->session_id());
    request.set_handle(algorithm.handle());
    for (const auto& t : tensors) request.add_tensors(t->handle());
    request.set_spirv(spec.spirv.data(), spec.spirv.size() * sizeof(uint32_t));
    request.mutable_workgroup()->set_x(spec.workgroup.x);
    request.mutable_workgroup()->set_y(spec.workgroup.y);
    request.mutable_workgroup()->set_z(spec.workgroup.z);
    request.set_spec_constants(spec.spec_constants.data(), spec.spec_constants.size());
    request.set_spec_constant_size(spec.spec_constant_size);
    request.set_push_constants(spec.push_constants.data(), spec.push_constants.size());
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::CreateAlgorithmResponse response;
    v1::Algorithms::Stub& stub = connection_->algorithms();
    grpc::Status s = rebuild ? stub.RebuildAlgorithm(&context, request, &response)
                             : stub.CreateAlgorithm(&context, request, &response);
    KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(
        s, rebuild ? "rebuilding an algorithm" : "creating an algorithm"));
    algorithm.Built(std::move(tensors), spec.push_constants);
    return absl::OkStatus();
  }

  const std::shared_ptr<Connection> connection_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> CreateRemoteBackend(const RemoteOptions& options) {
  remote::PlacementRequest request;
  request.address = options.address;
  request.address_origin = options.address_origin;
  request.device_index = options.device_index;
  KD_ASSIGN_OR_RETURN(request.selector,
                      remote::ParseSelector(options.select, options.select_origin));
  if (!options.device_daemon.empty()) {
    remote::SelectorTerm daemon;
    daemon.field = remote::SelectorTerm::Field::kAddress;
    daemon.value = options.device_daemon;
    daemon.origin = "KOMPUTED_DEVICE";
    request.selector.terms.push_back(std::move(daemon));
  }
  request.timeout = remote::PlacementTimeout();
  KD_ASSIGN_OR_RETURN(std::shared_ptr<const remote::ClientCredentials> credentials,
                      remote::ClientCredentials::Load(options.credentials));
  KD_ASSIGN_OR_RETURN(remote::Placement placement, remote::Place(request, *credentials));
  RemoteOptions placed = options;
  placed.address = placement.daemon.target;
  placed.device_index = placement.device_index;
  placed.tls_name = placement.daemon.tls_name;
  KD_ASSIGN_OR_RETURN(std::shared_ptr<Connection> connection, Connection::Open(placed));
  return std::make_shared<RemoteBackend>(std::move(connection));
}

absl::StatusOr<std::vector<uint32_t>> CompileGlslRemotely(
    const std::string& address, const remote::CredentialSettings& credentials,
    const std::string& source) {
  KD_ASSIGN_OR_RETURN(std::shared_ptr<const remote::ClientCredentials> loaded,
                      remote::ClientCredentials::Load(credentials));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::Algorithms::NewStub(loaded->CreateChannel(address, args));
  v1::CompileGlslRequest request;
  request.set_glsl(source);
  v1::CompileGlslResponse response;
  grpc::ClientContext context;
  SetDeadline(context, RpcTimeout());
  KD_RETURN_IF_ERROR(remote::FromGrpcStatusWithHint(stub->CompileGlsl(&context, request, &response),
                                                    "", loaded.get()));
  const std::string& bytes = response.spirv();
  if (bytes.empty() || bytes.size() % sizeof(uint32_t) != 0) {
    return absl::InternalError(absl::StrCat("komputed at ", address, " returned ", bytes.size(),
                                            " bytes of SPIR-V, not a whole number of words"));
  }
  std::vector<uint32_t> spirv(bytes.size() / sizeof(uint32_t));
  std::memcpy(spirv.data(), bytes.data(), bytes.size());
  return spirv;
}

}  // namespace kp::internal
