#include "remote_backend.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/malloc_tuning.h"
#include "komputed/core/status.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"

namespace kp::internal {
namespace {

namespace core = komputed::core;
namespace v1 = komputed::v1;

// Data larger than this moves in streamed chunks instead of inside an Eval message.
constexpr uint64_t kInlineLimit = 4u << 20;
constexpr uint64_t kChunkBytes = 4u << 20;
// A bulk transfer is split over parallel streams only where each gets at least this many chunks.
constexpr uint64_t kMinChunksPerLane = 4;
// Destroys are sent with the next call; beyond this many they are flushed at once.
constexpr size_t kMaxPendingCommands = 256;

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::Duration EnvSeconds(const char* name, absl::Duration fallback) {
  const char* value = std::getenv(name);
  double seconds = value != nullptr ? std::atof(value) : 0;
  return seconds > 0 ? absl::Seconds(seconds) : fallback;
}

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
// message to on_read (a non-OK status cancels the call and is returned as it is). Run() blocks
// until the call has ended (its context's deadline bounds it) and gRPC has released the data it
// was lent; gRPC's errors come back with `what` in front.
class BulkCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  using Next = std::function<std::optional<grpc::ByteBuffer>(BulkCall&)>;
  using OnRead = std::function<absl::Status(grpc::ByteBuffer&)>;

  BulkCall(Next next, OnRead on_read) : next_(std::move(next)), on_read_(std::move(on_read)) {}

  absl::Status Run(grpc::GenericStub& stub, grpc::ClientContext* context,
                   const std::string& method, absl::string_view what) {
    context_ = context;
    stub.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), this);
    StartRead(&in_);
    SendNext();
    StartCall();
    std::unique_lock<std::mutex> lock(mu_);
    // The context's deadline ends the call; should gRPC not report that in time, cancel it (after
    // which gRPC always calls OnDone, which this object must outlive).
    const auto deadline = context->deadline();
    const auto grace = std::chrono::seconds(10);
    const bool bounded = deadline < std::chrono::system_clock::time_point::max() - grace;
    if (bounded && !cv_.wait_until(lock, deadline + grace, [this] { return done_; })) {
      context->TryCancel();
    }
    cv_.wait(lock, [this] { return done_; });
    // gRPC gives lent data back as the call ends; wait for that before the caller may free it.
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [this] { return lent_ == 0; })) {
      return absl::InternalError(
          absl::StrCat(what, ": the data was still held by gRPC 60 s after the call"));
    }
    if (!local_.ok()) return local_;
    return FromGrpc(status_, what);
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

  void OnWriteDone(bool ok) override {
    out_.Clear();  // gRPC holds what it still needs of the message
    if (ok) SendNext();  // otherwise the stream is broken: OnDone follows
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    absl::Status s = on_read_(in_);
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        local_ = s;
      }
      context_->TryCancel();
      return;
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& status) override {
    out_.Clear();
    in_.Clear();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }

 private:
  void SendNext() {
    std::optional<grpc::ByteBuffer> message = next_(*this);
    if (!message.has_value()) {
      StartWritesDone();
      return;
    }
    out_ = *std::move(message);
    StartWrite(&out_);
  }

  Next next_;
  OnRead on_read_;
  grpc::ClientContext* context_ = nullptr;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int lent_ = 0;
  grpc::Status status_;
  absl::Status local_;
};

// Bound on object calls (create, destroy, record).
absl::Duration RpcTimeout() {
  static const absl::Duration t = EnvSeconds("KOMPUTED_RPC_TIMEOUT_S", absl::Seconds(60));
  return t;
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// Session state shared by the backend and every object made through it.
class Remote : public std::enable_shared_from_this<Remote> {
 public:
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Sessions::Stub> sessions;
  std::unique_ptr<v1::Devices::Stub> devices;
  std::unique_ptr<v1::Tensors::Stub> tensors;
  std::unique_ptr<v1::Algorithms::Stub> algorithms;
  std::unique_ptr<v1::Sequences::Stub> sequences;
  std::string session_id;
  VkPhysicalDeviceProperties properties{};
  absl::Duration idle_timeout = absl::Seconds(60);

  ~Remote() {
    StopKeepAlive();
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(5));
    v1::CloseSessionRequest request;
    request.set_session_id(session_id);
    v1::CloseSessionResponse response;
    sessions->CloseSession(&context, request, &response);  // best effort: the daemon reaps too
    std::lock_guard<std::mutex> lock(stream_mu_);
    CloseStreamLocked();
  }

  uint64_t NewHandle() { return next_handle_.fetch_add(1); }

  // Commands (destroys) to run before the next eval.
  void Defer(v1::Command command) {
    bool flush;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      pending_.push_back(std::move(command));
      flush = pending_.size() >= kMaxPendingCommands;
    }
    if (flush) Flush().IgnoreError();
  }
  std::vector<v1::Command> TakePending() {
    std::lock_guard<std::mutex> lock(pending_mu_);
    return std::exchange(pending_, {});
  }
  absl::Status Flush() {
    v1::EvalRequest request;
    for (auto& c : TakePending()) *request.add_commands() = std::move(c);
    if (request.commands_size() == 0) return absl::OkStatus();
    request.set_session_id(session_id);
    v1::EvalResponse response;
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    return FromGrpc(sequences->Eval(&context, request, &response), "flushing commands");
  }

  // ---- Bulk data: WriteTensor / ReadTensor streams.
  //
  // A transfer of many chunks is split into `lanes` byte ranges moved at once, each over its own
  // channel (its own TCP connection), so that serialization, the socket and parsing of one range
  // overlap with the others' (one stream moves one message at a time).
  uint32_t lanes = 1;
  std::vector<std::unique_ptr<grpc::GenericStub>> lane_stubs;  // [0] on `channel`

  // Streams `bytes` of host data into a tensor.
  absl::Status Write(uint64_t handle, const uint8_t* data, uint64_t bytes) {
    return InLanes(bytes, [&](grpc::GenericStub& stub, uint64_t begin, uint64_t end) {
      return WriteRange(stub, handle, data, begin, end);
    });
  }

  // Reads a tensor's whole host data into `data`.
  absl::Status Read(uint64_t handle, uint8_t* data, uint64_t bytes) {
    return InLanes(bytes, [&](grpc::GenericStub& stub, uint64_t begin, uint64_t end) {
      return ReadRange(stub, handle, data, begin, end);
    });
  }

  // Runs move(stub, begin, end) over [0, bytes): at once, or split into whole-chunk ranges,
  // one per lane, in parallel. The first failure is returned (the others still complete).
  template <typename Move>
  absl::Status InLanes(uint64_t bytes, Move move) {
    const uint64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
    const uint64_t n = std::min<uint64_t>(lanes, chunks / kMinChunksPerLane);
    if (n <= 1) return move(LaneStub(0), 0, bytes);
    const uint64_t per_lane = (chunks + n - 1) / n * kChunkBytes;
    std::vector<absl::Status> statuses(n);
    std::vector<std::thread> threads;
    for (uint64_t i = 1; i < n; ++i) {
      const uint64_t begin = std::min(bytes, i * per_lane);
      const uint64_t end = std::min(bytes, begin + per_lane);
      threads.emplace_back([&, i, begin, end] { statuses[i] = move(LaneStub(i), begin, end); });
    }
    statuses[0] = move(LaneStub(0), 0, std::min(bytes, per_lane));
    for (auto& t : threads) t.join();
    for (const absl::Status& s : statuses) KD_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  }

  grpc::GenericStub& LaneStub(uint64_t lane) {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    if (lane_stubs.size() <= lane) lane_stubs.resize(lane + 1);
    if (lane == 0 && lane_stubs[0] == nullptr) {
      lane_stubs[0] = std::make_unique<grpc::GenericStub>(channel);
    }
    if (lane_stubs[lane] == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      // A channel of its own: its own connection, not one shared through the subchannel pool.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("komputed.bulk_lane", static_cast<int>(lane));
      lane_stubs[lane] = std::make_unique<grpc::GenericStub>(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    }
    return *lane_stubs[lane];
  }

  // Streams data[begin, end) into the tensor's bytes [begin, end), lending the data to gRPC.
  absl::Status WriteRange(grpc::GenericStub& stub, uint64_t handle, const uint8_t* data,
                          uint64_t begin, uint64_t end) {
    const uint64_t bytes = end - begin;
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout() + absl::Seconds(static_cast<double>(bytes) / 1e8));
    uint64_t offset = begin;
    BulkCall call(
        [&](BulkCall& self) -> std::optional<grpc::ByteBuffer> {
          if (offset >= end) return std::nullopt;
          const uint64_t n = std::min(kChunkBytes, end - offset);
          v1::TensorChunk fields;
          if (offset == begin) {  // the first chunk names the session, tensor and total
            fields.set_session_id(session_id);
            fields.set_handle(handle);
            fields.set_total_bytes(bytes);
          }
          fields.set_offset(offset);
          grpc::ByteBuffer chunk = komputed::v1::wire::SerializeTensorChunk(
              fields, reinterpret_cast<const char*>(data) + offset, n, &BulkCall::Release,
              self.Lend());
          offset += n;
          return chunk;
        },
        [](grpc::ByteBuffer&) { return absl::OkStatus(); });  // WriteTensorResponse
    return call.Run(stub, &context, "/komputed.v1.Tensors/WriteTensor",
                    absl::StrCat("writing tensor ", handle));
  }

  // Reads the tensor's bytes [begin, end) into data[begin, end), each chunk copied once.
  absl::Status ReadRange(grpc::GenericStub& stub, uint64_t handle, uint8_t* data, uint64_t begin,
                         uint64_t end) {
    const uint64_t bytes = end - begin;
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout() + absl::Seconds(static_cast<double>(bytes) / 1e8));
    v1::ReadTensorRequest request;
    request.set_session_id(session_id);
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
    komputed::v1::wire::TensorChunkView chunk;
    BulkCall call(
        [&](BulkCall&) { return std::exchange(first, std::nullopt); },
        [&](grpc::ByteBuffer& raw) -> absl::Status {
          absl::Status parsed = komputed::v1::wire::ParseTensorChunk(raw, &chunk);
          if (!parsed.ok()) {
            return absl::DataLossError(
                absl::StrCat("reading tensor ", handle, ": ", parsed.message()));
          }
          const uint64_t at = chunk.fields.offset();
          if (at < begin || at > end || chunk.data_bytes > end - at) {
            return absl::DataLossError(absl::StrCat("reading tensor ", handle,
                                                    ": chunk at offset ", at, " outside [", begin,
                                                    ", ", end, ")"));
          }
          komputed::v1::wire::CopyData(chunk, reinterpret_cast<char*>(data) + at);
          received += chunk.data_bytes;
          return absl::OkStatus();
        });
    KD_RETURN_IF_ERROR(call.Run(stub, &context, "/komputed.v1.Tensors/ReadTensor",
                                absl::StrCat("reading tensor ", handle)));
    if (received != bytes) {
      return absl::DataLossError(
          absl::StrCat("reading tensor ", handle, ": got ", received, " of ", bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  // ---- Execute stream: asynchronous evaluation.
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
    v1::EvalResponse result;
  };

  absl::StatusOr<std::shared_ptr<Pending>> ExecuteAsync(v1::EvalRequest request) {
    std::lock_guard<std::mutex> lock(stream_mu_);
    if (stream_ == nullptr) OpenStreamLocked();
    uint64_t id = next_request_.fetch_add(1);
    request.set_request_id(id);
    auto pending = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> plock(pending_requests_mu_);
      pending_requests_[id] = pending;
    }
    v1::ExecuteRequest message;
    *message.mutable_eval() = std::move(request);
    if (!stream_->Write(message)) {
      {
        std::lock_guard<std::mutex> plock(pending_requests_mu_);
        pending_requests_.erase(id);
      }
      CloseStreamLocked();
      return absl::UnavailableError("the Execute stream to the daemon broke");
    }
    return pending;
  }

  void StartKeepAlive() {
    keepalive_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(keepalive_mu_);
      const auto period =
          absl::ToChronoNanoseconds(std::max(idle_timeout / 3, absl::Milliseconds(50)));
      while (!keepalive_cv_.wait_for(lock, period, [this] { return stop_keepalive_; })) {
        lock.unlock();
        grpc::ClientContext context;
        SetDeadline(context, absl::Seconds(10));
        v1::KeepAliveRequest request;
        request.set_session_id(session_id);
        v1::KeepAliveResponse response;
        sessions->KeepAlive(&context, request, &response);
        lock.lock();
      }
    });
  }

 private:
  void StopKeepAlive() {
    {
      std::lock_guard<std::mutex> lock(keepalive_mu_);
      stop_keepalive_ = true;
    }
    keepalive_cv_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
  }

  void OpenStreamLocked() {
    stream_context_ = std::make_unique<grpc::ClientContext>();
    stream_ = sequences->Execute(stream_context_.get());
    reader_ = std::thread([this, stream = stream_.get()] {
      v1::ExecuteEvent event;
      while (stream->Read(&event)) {
        std::shared_ptr<Pending> p;
        {
          std::lock_guard<std::mutex> lock(pending_requests_mu_);
          auto it = pending_requests_.find(event.request_id());
          if (it == pending_requests_.end()) continue;
          p = it->second;
          pending_requests_.erase(it);
        }
        Complete(*p, absl::Status(static_cast<absl::StatusCode>(event.code()), event.message()),
                 std::move(*event.mutable_result()));
      }
      // The stream ended: whatever is still pending failed.
      std::map<uint64_t, std::shared_ptr<Pending>> orphans;
      {
        std::lock_guard<std::mutex> lock(pending_requests_mu_);
        orphans.swap(pending_requests_);
      }
      for (auto& [id, p] : orphans) {
        Complete(*p, absl::UnavailableError("the Execute stream to the daemon ended"), {});
      }
    });
  }

  void CloseStreamLocked() {
    if (stream_ == nullptr) return;
    stream_->WritesDone();
    stream_context_->TryCancel();
    if (reader_.joinable()) reader_.join();
    stream_->Finish().IgnoreError();
    stream_.reset();
    stream_context_.reset();
  }

  static void Complete(Pending& p, absl::Status status, v1::EvalResponse result) {
    {
      std::lock_guard<std::mutex> lock(p.mu);
      p.done = true;
      p.status = std::move(status);
      p.result = std::move(result);
    }
    p.cv.notify_all();
  }

  std::atomic<uint64_t> next_handle_{1};
  std::mutex pending_mu_;
  std::vector<v1::Command> pending_;

  std::mutex lanes_mu_;   // guards lane_stubs
  std::mutex stream_mu_;  // guards stream_, its context and writes
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteEvent>> stream_;
  std::thread reader_;
  std::atomic<uint64_t> next_request_{1};
  std::mutex pending_requests_mu_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_requests_;

  std::mutex keepalive_mu_;
  std::condition_variable keepalive_cv_;
  bool stop_keepalive_ = false;
  std::thread keepalive_;
};

v1::ElementType ToWire(core::ElementType t) { return static_cast<v1::ElementType>(t); }
v1::MemoryType ToWire(core::MemoryType t) { return static_cast<v1::MemoryType>(t); }

bool Coherent(core::MemoryType t) {
  return t == core::MemoryType::kHost || t == core::MemoryType::kDeviceAndHost;
}

class RemoteTensor final : public BackendTensor {
 public:
  RemoteTensor(const void* owner, std::shared_ptr<Remote> remote, uint64_t handle,
               const TensorSpec& spec)
      : BackendTensor(owner), remote_(std::move(remote)), handle_(handle), spec_(spec) {
    if (spec.memory != core::MemoryType::kStorage) {
      host_.reset(new uint8_t[bytes()]);
    }
  }
  ~RemoteTensor() override {
    v1::Command c;
    c.mutable_destroy_tensor()->set_handle(handle_);
    remote_->Defer(std::move(c));
  }
  void* host_data() override { return host_.get(); }
  uint8_t* host() const { return host_.get(); }
  uint64_t handle() const { return handle_; }
  uint64_t bytes() const { return spec_.count * spec_.element_size; }
  const TensorSpec& spec() const { return spec_; }

 private:
  std::shared_ptr<Remote> remote_;
  uint64_t handle_;
  TensorSpec spec_;
  std::unique_ptr<uint8_t[]> host_;
};

class RemoteAlgorithm final : public BackendAlgorithm {
 public:
  RemoteAlgorithm(const void* owner, std::shared_ptr<Remote> remote, uint64_t handle)
      : BackendAlgorithm(owner), remote_(std::move(remote)), handle_(handle) {}
  ~RemoteAlgorithm() override {
    if (!created_) return;  // its creation failed: the daemon never had it
    v1::Command c;
    c.mutable_destroy_algorithm()->set_handle(handle_);
    remote_->Defer(std::move(c));
  }
  uint64_t handle() const { return handle_; }
  std::vector<std::shared_ptr<RemoteTensor>> tensors() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tensors_;
  }
  void set_tensors(std::vector<std::shared_ptr<RemoteTensor>> t, std::vector<uint8_t> push) {
    std::lock_guard<std::mutex> lock(mu_);
    created_ = true;
    tensors_ = std::move(t);
    push_ = std::move(push);
  }
  // The push constants that a dispatch recorded now would use.
  std::vector<uint8_t> push() const {
    std::lock_guard<std::mutex> lock(mu_);
    return push_;
  }
  void set_push(std::vector<uint8_t> push) {
    std::lock_guard<std::mutex> lock(mu_);
    push_ = std::move(push);
  }

 private:
  std::shared_ptr<Remote> remote_;
  uint64_t handle_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RemoteTensor>> tensors_;
  std::vector<uint8_t> push_;
  bool created_ = false;
};

absl::StatusOr<std::vector<std::shared_ptr<RemoteTensor>>> Unwrap(
    const void* owner, const std::vector<std::shared_ptr<BackendTensor>>& tensors) {
  std::vector<std::shared_ptr<RemoteTensor>> out;
  for (const auto& t : tensors) {
    if (t == nullptr) return absl::InvalidArgumentError("a tensor is null or destroyed");
    if (t->owner() != owner) {
      return absl::FailedPreconditionError("the tensor belongs to another Manager");
    }
    out.push_back(std::static_pointer_cast<RemoteTensor>(t));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<RemoteAlgorithm>> Unwrap(
    const void* owner, const std::shared_ptr<BackendAlgorithm>& algorithm) {
  if (algorithm == nullptr) return absl::InvalidArgumentError("the algorithm is not initialised");
  if (algorithm->owner() != owner) {
    return absl::FailedPreconditionError("the algorithm belongs to another Manager");
  }
  return std::static_pointer_cast<RemoteAlgorithm>(algorithm);
}

// An operation as the client remembers it: enough to know which host data moves.
struct LocalOp {
  Op::Kind kind;
  std::vector<std::shared_ptr<RemoteTensor>> tensors;
  std::shared_ptr<RemoteAlgorithm> algorithm;
  v1::Operation wire;                                 // as sent
  std::optional<std::vector<uint8_t>> push_override;  // a dispatch's override
};

class RemoteSequence final : public BackendSequence {
 public:
  RemoteSequence(const void* owner, std::shared_ptr<Remote> remote, uint64_t handle)
      : BackendSequence(owner), remote_(std::move(remote)), handle_(handle) {}

  ~RemoteSequence() override {
    std::shared_ptr<Remote::Pending> in_flight;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight = in_flight_;
    }
    if (in_flight != nullptr) {
      // As in-process: destroying a running sequence waits for it, and its results arrive.
      bool done;
      {
        std::unique_lock<std::mutex> lock(in_flight->mu);
        done =
            in_flight->cv.wait_for(lock, std::chrono::seconds(30), [&] { return in_flight->done; });
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (done && in_flight->status.ok()) FinishLocked(in_flight->result).IgnoreError();
    }
    v1::Command c;
    c.mutable_destroy_sequence()->set_handle(handle_);
    remote_->Defer(std::move(c));
  }

  absl::Status Record(const Op& op) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ != nullptr) {
      return absl::FailedPreconditionError(
          "cannot record: the sequence is running; await it first");
    }
    LocalOp local{op.kind, {}, nullptr, {}, op.push_constants};
    KD_ASSIGN_OR_RETURN(local.tensors, Unwrap(owner(), op.tensors));
    v1::Operation wire;
    auto list = [&](v1::TensorList* l) {
      for (const auto& t : local.tensors) l->add_tensors(t->handle());
    };
    switch (op.kind) {
      case Op::Kind::kSyncDevice:
      case Op::Kind::kSyncLocal:
        if (local.tensors.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              op.kind == Op::Kind::kSyncDevice ? "OpTensorSyncDevice" : "OpTensorSyncLocal",
              " needs at least 1 tensor(s), got 0"));
        }
        list(op.kind == Op::Kind::kSyncDevice ? wire.mutable_sync_device()
                                              : wire.mutable_sync_local());
        break;
      case Op::Kind::kCopy: {
        KD_RETURN_IF_ERROR(CheckCopy(local.tensors));
        list(wire.mutable_copy());
        break;
      }
      case Op::Kind::kDispatch: {
        KD_ASSIGN_OR_RETURN(local.algorithm, Unwrap(owner(), op.algorithm));
        auto* d = wire.mutable_dispatch();
        d->set_algorithm(local.algorithm->handle());
        // A record captures the push constants of its moment: an override, or the algorithm's
        // values now. Sending them explicitly keeps that true although records travel later than
        // SetPushConstants calls.
        std::vector<uint8_t> push = local.algorithm->push();
        if (op.push_constants.has_value()) {
          if (op.push_constants->size() != push.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("push constants of ", op.push_constants->size(),
                             " bytes given; the algorithm was built with ", push.size(), " bytes"));
          }
          push = *op.push_constants;
          local.algorithm->set_push(push);  // an override stays with the algorithm
        }
        if (!push.empty()) {
          d->set_has_push_constants(true);
          d->set_push_constants(push.data(), push.size());
        }
        break;
      }
      case Op::Kind::kBarrier: {
        auto* b = wire.mutable_barrier();
        for (const auto& t : local.tensors) b->add_tensors(t->handle());
        b->set_src_access(op.src_access);
        b->set_dst_access(op.dst_access);
        b->set_src_stage(op.src_stage);
        b->set_dst_stage(op.dst_stage);
        b->set_primary(op.primary);
        break;
      }
    }
    local.wire = wire;
    *actions_.add_actions()->mutable_record() = std::move(wire);
    if (!recording_) {
      cb_ops_.clear();
      recording_ = true;
    }
    cb_ops_.push_back(local);
    all_ops_.push_back(std::move(local));
    return absl::OkStatus();
  }

  absl::Status Submit() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ != nullptr) {
      return absl::FailedPreconditionError("the sequence is already running; await it first");
    }
    KD_ASSIGN_OR_RETURN(v1::EvalRequest request, PrepareLocked());
    KD_ASSIGN_OR_RETURN(in_flight_, remote_->ExecuteAsync(std::move(request)));
    return absl::OkStatus();
  }

  absl::Status Wait(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ == nullptr) return absl::OkStatus();
    auto p = in_flight_;
    {
      std::unique_lock<std::mutex> plock(p->mu);
      bool done =
          p->cv.wait_for(plock, absl::ToChronoNanoseconds(timeout), [&] { return p->done; });
      if (!done) {
        return absl::DeadlineExceededError(
            absl::StrCat("the submission did not complete within ", absl::FormatDuration(timeout)));
      }
    }
    in_flight_.reset();
    KD_RETURN_IF_ERROR(p->status);
    return FinishLocked(p->result);
  }

  // A synchronous eval: one unary round trip (plus streams for large data).
  absl::Status Eval(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ != nullptr) {
      return absl::FailedPreconditionError("the sequence is already running; await it first");
    }
    KD_ASSIGN_OR_RETURN(v1::EvalRequest request, PrepareLocked());
    request.set_timeout_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(timeout)));
    grpc::ClientContext context;
    SetDeadline(context, timeout + RpcTimeout());
    v1::EvalResponse response;
    KD_RETURN_IF_ERROR(FromGrpc(remote_->sequences->Eval(&context, request, &response), "eval"));
    return FinishLocked(response);
  }

  absl::Status Clear() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ != nullptr) {
      return absl::FailedPreconditionError("cannot clear: the sequence is running");
    }
    actions_.add_actions()->set_clear(true);
    all_ops_.clear();
    cb_ops_.clear();
    recording_ = false;
    return absl::OkStatus();
  }

  absl::Status Rerecord() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ != nullptr) {
      return absl::FailedPreconditionError("cannot rerecord: the sequence is running");
    }
    // Recorded again from scratch, each dispatch with the push constants of this moment: its
    // override, or its algorithm's current values (what a rerecord does in-process).
    actions_.add_actions()->set_clear(true);
    for (LocalOp& op : all_ops_) {
      if (op.kind == Op::Kind::kDispatch) {
        std::vector<uint8_t> push = op.push_override.value_or(op.algorithm->push());
        if (op.push_override.has_value()) op.algorithm->set_push(push);
        op.wire.mutable_dispatch()->set_has_push_constants(!push.empty());
        op.wire.mutable_dispatch()->set_push_constants(push.data(), push.size());
      }
      *actions_.add_actions()->mutable_record() = op.wire;
    }
    cb_ops_ = all_ops_;
    recording_ = !cb_ops_.empty();
    return absl::OkStatus();
  }

  bool IsRunning() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_ != nullptr;
  }
  bool IsRecording() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return recording_;
  }
  std::vector<uint64_t> Timestamps() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return timestamps_;
  }

 private:
  static absl::Status CheckCopy(const std::vector<std::shared_ptr<RemoteTensor>>& t) {
    if (t.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("OpTensorCopy needs at least 2 tensor(s), got ", t.size()));
    }
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i]->spec().type != t[0]->spec().type ||
          t[i]->spec().element_size != t[0]->spec().element_size) {
        return absl::InvalidArgumentError(absl::StrCat("OpTensorCopy: tensor ", i, " holds ",
                                                       core::ElementTypeName(t[i]->spec().type),
                                                       " elements but the source (tensor 0) holds ",
                                                       core::ElementTypeName(t[0]->spec().type)));
      }
      if (t[i]->spec().count != t[0]->spec().count) {
        return absl::InvalidArgumentError(
            absl::StrCat("OpTensorCopy: tensor ", i, " has ", t[i]->spec().count,
                         " elements but the source (tensor 0) has ", t[0]->spec().count));
      }
    }
    return absl::OkStatus();
  }

  // Builds the request for the batch about to run: pending commands, this sequence's actions,
  // the host data to upload, the data to bring back. Large data is streamed here, before.
  absl::StatusOr<v1::EvalRequest> PrepareLocked() {
    v1::EvalRequest request;
    request.set_session_id(remote_->session_id);
    for (auto& c : remote_->TakePending()) *request.add_commands() = std::move(c);
    if (actions_.actions_size() > 0) {
      actions_.set_sequence(handle_);
      *request.add_commands()->mutable_record() = std::move(actions_);
      actions_.Clear();
    }
    request.set_sequence(handle_);
    recording_ = false;  // a submission ends the recording

    // Which host data moves: device tensors synced up or down by the batch, and every
    // host-coherent tensor that it touches (up before, down after).
    std::vector<std::shared_ptr<RemoteTensor>> up, down;
    absl::flat_hash_set<uint64_t> up_seen, down_seen;
    auto add = [](std::vector<std::shared_ptr<RemoteTensor>>& v, absl::flat_hash_set<uint64_t>& s,
                  const std::shared_ptr<RemoteTensor>& t) {
      if (s.insert(t->handle()).second) v.push_back(t);
    };
    for (const LocalOp& op : cb_ops_) {
      std::vector<std::shared_ptr<RemoteTensor>> touched = op.tensors;
      if (op.algorithm != nullptr) {
        for (auto& t : op.algorithm->tensors()) touched.push_back(t);
      }
      for (const auto& t : touched) {
        if (Coherent(t->spec().memory)) {
          add(up, up_seen, t);
          add(down, down_seen, t);
        } else if (t->spec().memory == core::MemoryType::kDevice) {
          if (op.kind == Op::Kind::kSyncDevice) add(up, up_seen, t);
          if (op.kind == Op::Kind::kSyncLocal) add(down, down_seen, t);
        }
      }
    }
    uint64_t inline_bytes = 0;
    for (const auto& t : up) {
      if (inline_bytes + t->bytes() <= kInlineLimit) {
        inline_bytes += t->bytes();
        auto* u = request.add_uploads();
        u->set_handle(t->handle());
        u->mutable_data()->assign(reinterpret_cast<const char*>(t->host()), t->bytes());
      } else {
        // Commands first, so that the tensors exist in their final state, then the data.
        if (request.commands_size() > 0) {
          v1::EvalRequest flush;
          flush.set_session_id(remote_->session_id);
          flush.mutable_commands()->Swap(request.mutable_commands());
          grpc::ClientContext context;
          SetDeadline(context, RpcTimeout());
          v1::EvalResponse ignored;
          KD_RETURN_IF_ERROR(FromGrpc(remote_->sequences->Eval(&context, flush, &ignored), "eval"));
        }
        KD_RETURN_IF_ERROR(remote_->Write(t->handle(), t->host(), t->bytes()));
      }
    }
    streamed_downloads_.clear();
    inline_bytes = 0;
    for (const auto& t : down) {
      if (inline_bytes + t->bytes() <= kInlineLimit) {
        inline_bytes += t->bytes();
        request.add_downloads(t->handle());
      } else {
        streamed_downloads_.push_back(t);
      }
    }
    inline_downloads_.clear();
    for (const auto& t : down) inline_downloads_[t->handle()] = t;
    return request;
  }

  // Applies what came back: downloads, then the copies' host steps, then timestamps.
  absl::Status FinishLocked(const v1::EvalResponse& response) {
    for (const auto& d : response.downloads()) {
      auto it = inline_downloads_.find(d.handle());
      if (it == inline_downloads_.end()) continue;
      const auto& t = it->second;
      if (d.offset() > t->bytes() || d.data().size() > t->bytes() - d.offset()) {
        return absl::DataLossError(absl::StrCat("download of tensor ", d.handle(),
                                                " does not fit its ", t->bytes(), " bytes"));
      }
      std::memcpy(t->host() + d.offset(), d.data().data(), d.data().size());
    }
    for (const auto& t : streamed_downloads_) {
      KD_RETURN_IF_ERROR(remote_->Read(t->handle(), t->host(), t->bytes()));
    }
    for (const LocalOp& op : cb_ops_) {
      if (op.kind != Op::Kind::kCopy || op.tensors[0]->host() == nullptr) continue;
      for (size_t i = 1; i < op.tensors.size(); ++i) {
        if (op.tensors[i]->spec().memory == core::MemoryType::kDevice) {
          std::memcpy(op.tensors[i]->host(), op.tensors[0]->host(), op.tensors[0]->bytes());
        }
      }
    }
    timestamps_.assign(response.timestamps_ns().begin(), response.timestamps_ns().end());
    return absl::OkStatus();
  }

  std::shared_ptr<Remote> remote_;
  const uint64_t handle_;
  mutable std::mutex mu_;
  v1::RecordRequest actions_;     // not yet sent: they go with this sequence's next eval
  std::vector<LocalOp> all_ops_;  // since the last clear
  std::vector<LocalOp> cb_ops_;   // in the current batch
  bool recording_ = false;
  std::shared_ptr<Remote::Pending> in_flight_;
  std::map<uint64_t, std::shared_ptr<RemoteTensor>> inline_downloads_;
  std::vector<std::shared_ptr<RemoteTensor>> streamed_downloads_;
  std::vector<uint64_t> timestamps_;
};

class RemoteBackend final : public Backend {
 public:
  explicit RemoteBackend(std::shared_ptr<Remote> remote) : remote_(std::move(remote)) {}

  absl::StatusOr<std::shared_ptr<BackendTensor>> CreateTensor(const TensorSpec& spec,
                                                              const void* data) override {
    const uint64_t handle = remote_->NewHandle();
    uint32_t element_size = spec.element_size;
    if (element_size == 0) element_size = core::ElementTypeSize(spec.type);
    if (spec.count == 0) {
      return absl::InvalidArgumentError("cannot create a zero-sized tensor (0 elements)");
    }
    TensorSpec resolved = spec;
    resolved.element_size = element_size;
    const uint64_t bytes = spec.count * element_size;
    v1::CreateTensorRequest request;
    request.set_session_id(remote_->session_id);
    request.set_handle(handle);
    request.set_element_type(ToWire(spec.type));
    request.set_count(spec.count);
    request.set_element_size(spec.element_size);
    request.set_memory_type(ToWire(spec.memory));
    const bool inline_data = data != nullptr && bytes <= kInlineLimit;
    if (inline_data) request.mutable_data()->assign(reinterpret_cast<const char*>(data), bytes);
    {
      grpc::ClientContext context;
      SetDeadline(context, RpcTimeout());
      v1::CreateTensorResponse response;
      KD_RETURN_IF_ERROR(FromGrpc(remote_->tensors->CreateTensor(&context, request, &response),
                                  "creating a tensor"));
    }
    auto tensor = std::make_shared<RemoteTensor>(this, remote_, handle, resolved);
    if (tensor->host() != nullptr) {
      if (data != nullptr) {
        std::memcpy(tensor->host(), data, bytes);
      } else {
        std::memset(tensor->host(), 0, bytes);
      }
    }
    if (data != nullptr && !inline_data) {
      KD_RETURN_IF_ERROR(remote_->Write(handle, static_cast<const uint8_t*>(data), bytes));
      if (spec.memory == core::MemoryType::kDevice) {
        // The daemon's device buffer gets the data too, as in-process.
        v1::EvalRequest request;
        request.set_session_id(remote_->session_id);
        uint64_t seq = remote_->NewHandle();
        auto* create = request.add_commands()->mutable_create_sequence();
        create->set_handle(seq);
        auto* record = request.add_commands()->mutable_record();
        record->set_sequence(seq);
        record->add_actions()->mutable_record()->mutable_sync_device()->add_tensors(handle);
        request.set_sequence(seq);
        grpc::ClientContext context;
        SetDeadline(context, RpcTimeout());
        v1::EvalResponse response;
        KD_RETURN_IF_ERROR(FromGrpc(remote_->sequences->Eval(&context, request, &response),
                                    "uploading a tensor's initial data"));
        v1::Command destroy;
        destroy.mutable_destroy_sequence()->set_handle(seq);
        remote_->Defer(std::move(destroy));
      }
    }
    return tensor;
  }

  absl::StatusOr<std::shared_ptr<BackendAlgorithm>> CreateAlgorithm(
      const AlgorithmSpec& spec) override {
    auto algorithm = std::make_shared<RemoteAlgorithm>(this, remote_, remote_->NewHandle());
    KD_RETURN_IF_ERROR(Build(*algorithm, spec, /*rebuild=*/false));
    return algorithm;
  }

  absl::Status RebuildAlgorithm(BackendAlgorithm& algorithm, const AlgorithmSpec& spec) override {
    if (algorithm.owner() != this) {
      return absl::FailedPreconditionError("the algorithm belongs to another Manager");
    }
    return Build(static_cast<RemoteAlgorithm&>(algorithm), spec, /*rebuild=*/true);
  }

  absl::Status SetPushConstants(BackendAlgorithm& algorithm, std::vector<uint8_t> values) override {
    if (algorithm.owner() != this) {
      return absl::FailedPreconditionError("the algorithm belongs to another Manager");
    }
    v1::SetPushConstantsRequest request;
    request.set_session_id(remote_->session_id);
    request.set_handle(static_cast<RemoteAlgorithm&>(algorithm).handle());
    request.set_push_constants(values.data(), values.size());
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::SetPushConstantsResponse response;
    KD_RETURN_IF_ERROR(FromGrpc(remote_->algorithms->SetPushConstants(&context, request, &response),
                                "setting push constants"));
    static_cast<RemoteAlgorithm&>(algorithm).set_push(std::move(values));
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<BackendSequence>> CreateSequence(
      uint32_t queue, uint32_t total_timestamps) override {
    const uint64_t handle = remote_->NewHandle();
    v1::CreateSequenceRequest request;
    request.set_session_id(remote_->session_id);
    request.set_handle(handle);
    request.set_queue(queue);
    request.set_total_timestamps(total_timestamps);
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::CreateSequenceResponse response;
    KD_RETURN_IF_ERROR(FromGrpc(remote_->sequences->CreateSequence(&context, request, &response),
                                "creating a sequence"));
    return std::make_shared<RemoteSequence>(this, remote_, handle);
  }

  VkPhysicalDeviceProperties Properties() const override { return remote_->properties; }

  absl::StatusOr<std::vector<VkPhysicalDeviceProperties>> ListDevices() const override {
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    v1::ListDevicesResponse response;
    KD_RETURN_IF_ERROR(
        FromGrpc(remote_->devices->ListDevices(&context, v1::ListDevicesRequest(), &response),
                 "listing devices"));
    std::vector<VkPhysicalDeviceProperties> out;
    for (const auto& d : response.devices()) out.push_back(PropertiesOf(d));
    return out;
  }

  static VkPhysicalDeviceProperties PropertiesOf(const v1::DeviceInfo& d) {
    VkPhysicalDeviceProperties p{};
    if (d.properties_raw().size() == sizeof(p)) {
      std::memcpy(&p, d.properties_raw().data(), sizeof(p));
    } else {
      p.apiVersion = d.api_version();
      p.driverVersion = d.driver_version();
      p.vendorID = d.vendor_id();
      p.deviceID = d.device_id();
      p.deviceType = static_cast<VkPhysicalDeviceType>(d.device_type());
      std::strncpy(p.deviceName, d.name().c_str(), sizeof(p.deviceName) - 1);
    }
    return p;
  }

 private:
  absl::Status Build(RemoteAlgorithm& algorithm, const AlgorithmSpec& spec, bool rebuild) {
    KD_ASSIGN_OR_RETURN(auto tensors, Unwrap(this, spec.tensors));
    v1::CreateAlgorithmRequest request;
    request.set_session_id(remote_->session_id);
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
    grpc::Status s = rebuild ? remote_->algorithms->RebuildAlgorithm(&context, request, &response)
                             : remote_->algorithms->CreateAlgorithm(&context, request, &response);
    KD_RETURN_IF_ERROR(FromGrpc(s, rebuild ? "rebuilding an algorithm" : "creating an algorithm"));
    algorithm.set_tensors(std::move(tensors), spec.push_constants);
    return absl::OkStatus();
  }

  std::shared_ptr<Remote> remote_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> CreateRemoteBackend(const RemoteOptions& options) {
  core::TuneMallocForBulkTransfers();  // tensor data moves in multi-megabyte messages
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto remote = std::make_shared<Remote>();
  remote->address = options.address;
  remote->lanes = TransferStreams();
  remote->channel =
      grpc::CreateCustomChannel(options.address, grpc::InsecureChannelCredentials(), args);
  remote->sessions = v1::Sessions::NewStub(remote->channel);
  remote->devices = v1::Devices::NewStub(remote->channel);
  remote->tensors = v1::Tensors::NewStub(remote->channel);
  remote->algorithms = v1::Algorithms::NewStub(remote->channel);
  remote->sequences = v1::Sequences::NewStub(remote->channel);

  v1::OpenSessionRequest request;
  request.set_device_index(options.device_index);
  for (uint32_t f : options.queue_families) request.add_queue_families(f);
  request.set_client_name(options.client_name);
  v1::OpenSessionResponse response;
  grpc::ClientContext context;
  SetDeadline(context, RpcTimeout());
  grpc::Status s = remote->sessions->OpenSession(&context, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("opening a session on komputed at ", options.address, ": ",
                                     s.error_message()));
  }
  remote->session_id = response.session_id();
  remote->properties = RemoteBackend::PropertiesOf(response.device());
  if (response.idle_timeout_ms() > 0) {
    remote->idle_timeout = absl::Milliseconds(response.idle_timeout_ms());
  }
  remote->StartKeepAlive();
  return std::make_shared<RemoteBackend>(std::move(remote));
}

}  // namespace kp::internal
