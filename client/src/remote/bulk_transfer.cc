#include "remote/bulk_transfer.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"
#include "remote/credentials.h"
#include "remote/rpc.h"

namespace kp::internal::remote {
namespace {

namespace v1 = komputed::v1;

constexpr uint64_t kChunkBytes = 4u << 20;
// A bulk transfer is split over parallel streams only where each gets at least this many chunks.
constexpr uint64_t kMinChunksPerLane = 4;

// Parallel streams for one bulk transfer: $KOMPUTED_TRANSFER_STREAMS (1 to 16), else a quarter
// of the cores, from 1 to 4 (each stream keeps about two cores busy: the client's and the
// daemon's side of the copies).
uint32_t TransferStreams() {
  const char* value = std::getenv("KOMPUTED_TRANSFER_STREAMS");
  const int n = value != nullptr ? std::atoi(value) : 0;
  if (n > 0) return static_cast<uint32_t>(std::min(n, 16));
  return std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u);
}

// One bulk transfer call (WriteTensor or ReadTensor) through gRPC's generic API, so that tensor
// data moves as byte buffers (komputed/v1/tensor_chunk_wire.h) and not through protobuf strings.
// Sends what next() returns until it returns nothing, then half-closes; hands every received
// message to on_read (a non-OK status cancels the call and is returned as it is). Run() drives
// the call on a completion queue of its own from the calling thread (gRPC's callback API would
// start threads of its own in the process, which then do the reading for every call of it), and
// returns once the call has ended (its context's deadline bounds it) and gRPC has released the
// data it was lent; gRPC's errors come back with `what` in front.
class BulkCall final {
 public:
  using Next = std::function<std::optional<grpc::ByteBuffer>(BulkCall&)>;
  using OnRead = std::function<absl::Status(grpc::ByteBuffer&)>;

  BulkCall(Next next, OnRead on_read) : next_(std::move(next)), on_read_(std::move(on_read)) {}

  absl::Status Run(grpc::GenericStub& stub, std::unique_ptr<grpc::ClientContext> context,
                   const std::string& method, absl::string_view what) {
    // The events on the queue: their tags.
    enum Event : uintptr_t { kStarted = 1, kWritten, kWritesDone, kRead, kFinished };
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(context.get(), method, &cq);
    call->StartCall(reinterpret_cast<void*>(kStarted));
    int outstanding = 1;
    bool finished = false;
    grpc::Status status;
    absl::Status local;
    auto send_next = [&] {
      std::optional<grpc::ByteBuffer> message = next_(*this);
      ++outstanding;
      if (!message.has_value()) {
        call->WritesDone(reinterpret_cast<void*>(kWritesDone));
        return;
      }
      out_ = *std::move(message);
      call->Write(out_, reinterpret_cast<void*>(kWritten));
    };
    // The context's deadline ends the call; should gRPC not report that in time, cancel it.
    const auto deadline = context->deadline();
    const auto grace = std::chrono::seconds(10);
    const bool bounded = deadline < std::chrono::system_clock::time_point::max() - grace;
    bool cancelled = false;
    while (outstanding > 0) {
      void* tag = nullptr;
      bool ok = false;
      if (bounded && !cancelled) {
        if (cq.AsyncNext(&tag, &ok, deadline + grace) == grpc::CompletionQueue::TIMEOUT) {
          context->TryCancel();
          cancelled = true;
          continue;
        }
      } else if (!cq.Next(&tag, &ok)) {
        break;
      }
      --outstanding;
      switch (static_cast<Event>(reinterpret_cast<uintptr_t>(tag))) {
        case kStarted:
          // On a failed start the read fails at once too, and the finish follows.
          outstanding += 1;
          call->Read(&in_, reinterpret_cast<void*>(kRead));
          if (ok) send_next();
          break;
        case kWritten:
          out_.Clear();         // gRPC holds what it still needs of the message
          if (ok) send_next();  // otherwise the stream is broken: the read fails too
          break;
        case kWritesDone:
          break;
        case kRead:
          if (ok) {
            absl::Status s = on_read_(in_);
            if (!s.ok()) {
              local = s;
              context->TryCancel();  // the read that follows fails
            }
            ++outstanding;
            call->Read(&in_, reinterpret_cast<void*>(kRead));
          } else {  // the daemon has ended the call (or it broke): its status
            ++outstanding;
            call->Finish(&status, reinterpret_cast<void*>(kFinished));
          }
          break;
        case kFinished:
          finished = true;
          break;
      }
    }
    out_.Clear();
    in_.Clear();
    // The call has ended: releasing it lets gRPC drop what it still holds of the messages (a
    // call that the daemon ended early keeps its unsent data until then).
    call.reset();
    context.reset();
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
    std::unique_lock<std::mutex> lock(mu_);
    // gRPC gives lent data back as the call goes; wait for that before the caller may free it.
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [this] { return lent_ == 0; })) {
      return absl::InternalError(
          absl::StrCat(what, ": the data was still held by gRPC 60 s after the call"));
    }
    if (!local.ok()) return local;
    if (!finished) return absl::InternalError(absl::StrCat(what, ": the call ended unfinished"));
    return FromGrpcStatusWithHint(status, what);
  }

  // A slice release callback's argument for data lent to this call: counts it until released.
  void* Lend() {
    std::lock_guard<std::mutex> lock(mu_);
    ++lent_;
    return this;
  }
  static void Release(void* call) {
    auto* self = static_cast<BulkCall*>(call);
    std::lock_guard<std::mutex> lock(self->mu_);
    --self->lent_;
    self->cv_.notify_all();
  }

 private:
  Next next_;
  OnRead on_read_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  std::mutex mu_;
  std::condition_variable cv_;
  int lent_ = 0;  // guarded by mu_
};

// The host of a gRPC target: "dns:///komputed.ns.svc:50051" → "komputed.ns.svc",
// "ipv4:10.0.0.1:5001,10.0.0.2:5001" → "10.0.0.1", "[::1]:50051" → "::1".
std::string HostOf(const std::string& target) {
  std::string rest = target;
  if (const size_t scheme = rest.find(":///"); scheme != std::string::npos) {
    rest = rest.substr(scheme + 4);
  } else if (absl::StartsWith(rest, "dns:") || absl::StartsWith(rest, "ipv4:") ||
             absl::StartsWith(rest, "ipv6:")) {
    rest = rest.substr(rest.find(':') + 1);
  }
  rest = rest.substr(0, rest.find(','));
  if (absl::StartsWith(rest, "[")) return rest.substr(1, rest.find(']') - 1);
  if (std::count(rest.begin(), rest.end(), ':') == 1) return rest.substr(0, rest.find(':'));
  return rest;
}

// A transfer's deadline: the object-call bound plus time for its bytes at 100 MB/s.
void SetTransferDeadline(grpc::ClientContext& context, uint64_t bytes) {
  SetDeadline(context, RpcTimeout() + absl::Seconds(static_cast<double>(bytes) / 1e8));
}

}  // namespace

BulkTransfer::BulkTransfer(std::string address, std::string tls_name,
                           std::shared_ptr<const ClientCredentials> credentials,
                           std::shared_ptr<grpc::Channel> channel, std::string session_id,
                           std::string direct_address)
    : lane_address_(direct_address.empty() ? address : direct_address),
      lane_tls_name_(!tls_name.empty()                                     ? std::move(tls_name)
                     : direct_address.empty() || direct_address == address ? std::string()
                                                                           : HostOf(address)),
      credentials_(std::move(credentials)),
      channel_(std::move(channel)),
      session_id_(std::move(session_id)),
      lanes_(TransferStreams()) {}

absl::Status BulkTransfer::Write(uint64_t handle, const uint8_t* data, uint64_t bytes) {
  return InLanes(bytes, [&](grpc::GenericStub& stub, uint64_t begin, uint64_t end) {
    return WriteRange(stub, handle, data, begin, end);
  });
}

absl::Status BulkTransfer::Read(uint64_t handle, uint8_t* data, uint64_t bytes) {
  return InLanes(bytes, [&](grpc::GenericStub& stub, uint64_t begin, uint64_t end) {
    return ReadRange(stub, handle, data, begin, end);
  });
}

// A transfer of many chunks is split into whole-chunk byte ranges moved at once, one per lane,
// each over its own channel (its own TCP connection), so that serialization, the socket and
// parsing of one range overlap with the others' (one stream moves one message at a time). The
// first failure is returned (the others still complete).
template <typename Move>
absl::Status BulkTransfer::InLanes(uint64_t bytes, Move move) {
  const uint64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const uint64_t n = std::min<uint64_t>(lanes_, chunks / kMinChunksPerLane);
  if (n <= 1 || single_lane_.load()) return move(LaneStub(0), 0, bytes);
  const uint64_t per_lane = (chunks + n - 1) / n * kChunkBytes;
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < n; ++i) {
    const uint64_t begin = std::min(bytes, i * per_lane);
    const uint64_t end = std::min(bytes, begin + per_lane);
    threads.emplace_back([&, i, begin, end] {
      komputed::core::NameThisThread("kp-bulk");
      statuses[i] = move(LaneStub(i), begin, end);
    });
  }
  statuses[0] = move(LaneStub(0), 0, std::min(bytes, per_lane));
  for (auto& t : threads) t.join();
  KD_RETURN_IF_ERROR(statuses[0]);
  // A further lane that did not reach the session's daemon (unreachable, or another daemon that
  // does not know the session: a balancer spread the connections) moves its range over the
  // session's own connection, and this session's transfers keep to it from now on.
  for (uint64_t i = 1; i < n; ++i) {
    if (!absl::IsUnavailable(statuses[i]) && !absl::IsNotFound(statuses[i])) continue;
    if (!single_lane_.exchange(true)) {
      spdlog::warn(
          "komputed: a parallel transfer connection to {} did not reach the daemon of session {} "
          "({}); this session's transfers keep to its own connection",
          lane_address_, session_id_, std::string(statuses[i].message()));
    }
    const uint64_t begin = std::min(bytes, i * per_lane);
    statuses[i] = move(LaneStub(0), begin, std::min(bytes, begin + per_lane));
  }
  for (const absl::Status& s : statuses) KD_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

grpc::GenericStub& BulkTransfer::LaneStub(uint64_t lane) {
  absl::MutexLock lock(&mu_);
  if (lane_stubs_.size() <= lane) lane_stubs_.resize(lane + 1);
  if (lane == 0 && lane_stubs_[0] == nullptr) {
    lane_stubs_[0] = std::make_unique<grpc::GenericStub>(channel_);
  }
  if (lane_stubs_[lane] == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A channel of its own: its own connection, not one shared through the subchannel pool.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("komputed.bulk_lane", static_cast<int>(lane));
    lane_stubs_[lane] = std::make_unique<grpc::GenericStub>(
        credentials_->CreateChannel(lane_address_, args, lane_tls_name_));
  }
  return *lane_stubs_[lane];
}

// Streams data[begin, end) into the tensor's bytes [begin, end), lending the data to gRPC.
absl::Status BulkTransfer::WriteRange(grpc::GenericStub& stub, uint64_t handle, const uint8_t* data,
                                      uint64_t begin, uint64_t end) {
  const uint64_t bytes = end - begin;
  auto context = std::make_unique<grpc::ClientContext>();
  SetTransferDeadline(*context, bytes);
  uint64_t offset = begin;
  BulkCall call(
      [&](BulkCall& self) -> std::optional<grpc::ByteBuffer> {
        if (offset >= end) return std::nullopt;
        const uint64_t n = std::min(kChunkBytes, end - offset);
        v1::TensorChunk fields;
        if (offset == begin) {  // the first chunk names the session, tensor and total
          fields.set_session_id(session_id_);
          fields.set_handle(handle);
          fields.set_total_bytes(bytes);
        }
        fields.set_offset(offset);
        grpc::ByteBuffer chunk =
            v1::wire::SerializeTensorChunk(fields, reinterpret_cast<const char*>(data) + offset, n,
                                           &BulkCall::Release, self.Lend());
        offset += n;
        return chunk;
      },
      [](grpc::ByteBuffer&) { return absl::OkStatus(); });  // WriteTensorResponse
  return call.Run(stub, std::move(context), "/komputed.v1.Tensors/WriteTensor",
                  absl::StrCat("writing tensor ", handle));
}

// Reads the tensor's bytes [begin, end) into data[begin, end), each chunk copied once.
absl::Status BulkTransfer::ReadRange(grpc::GenericStub& stub, uint64_t handle, uint8_t* data,
                                     uint64_t begin, uint64_t end) {
  const uint64_t bytes = end - begin;
  auto context = std::make_unique<grpc::ClientContext>();
  SetTransferDeadline(*context, bytes);
  v1::ReadTensorRequest request;
  request.set_session_id(session_id_);
  request.set_handle(handle);
  request.set_offset(begin);
  request.set_length(bytes);
  request.set_chunk_bytes(kChunkBytes);
  std::optional<grpc::ByteBuffer> first(std::in_place);
  bool own = false;
  if (!grpc::SerializationTraits<v1::ReadTensorRequest>::Serialize(request, &*first, &own).ok()) {
    return absl::InternalError(absl::StrCat("reading tensor ", handle, ": request not serialized"));
  }
  uint64_t received = 0;
  v1::wire::TensorChunkView chunk;
  BulkCall call(
      [&](BulkCall&) { return std::exchange(first, std::nullopt); },
      [&](grpc::ByteBuffer& raw) -> absl::Status {
        absl::Status parsed = v1::wire::ParseTensorChunk(raw, &chunk);
        if (!parsed.ok()) {
          return absl::DataLossError(
              absl::StrCat("reading tensor ", handle, ": ", parsed.message()));
        }
        const uint64_t at = chunk.fields.offset();
        if (at < begin || at > end || chunk.data_bytes > end - at) {
          return absl::DataLossError(absl::StrCat("reading tensor ", handle, ": chunk at offset ",
                                                  at, " outside [", begin, ", ", end, ")"));
        }
        v1::wire::CopyData(chunk, reinterpret_cast<char*>(data) + at);
        received += chunk.data_bytes;
        return absl::OkStatus();
      });
  KD_RETURN_IF_ERROR(call.Run(stub, std::move(context), "/komputed.v1.Tensors/ReadTensor",
                              absl::StrCat("reading tensor ", handle)));
  if (received != bytes) {
    return absl::DataLossError(
        absl::StrCat("reading tensor ", handle, ": got ", received, " of ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace kp::internal::remote
