#include "remote/connection.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "komputed/core/malloc_tuning.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"
#include "komputed/v1/execute_wire.h"
#include "komputed/v1/shared_memory_wire.h"
#include "remote/credentials.h"
#include "remote/rpc.h"
#include "spdlog/spdlog.h"

namespace kp::internal::remote {
namespace {

namespace v1 = komputed::v1;
namespace core = komputed::core;

// Deferred commands beyond this many are sent by the next explicit call (FlushIfMany).
constexpr size_t kMaxDeferredCommands = 256;

// How long a session's opening waits for a failed connection to come back before it reports the
// failure: a little over gRPC's first reconnect backoff (1 s, jittered by 20%).
constexpr absl::Duration kOpenSessionRetryWindow = absl::Milliseconds(2500);

absl::Duration EnvSeconds(const char* name, absl::Duration fallback) {
  const char* value = std::getenv(name);
  double seconds = value != nullptr ? std::atof(value) : 0;
  return seconds > 0 ? absl::Seconds(seconds) : fallback;
}

}  // namespace

absl::Duration RpcTimeout() {
  static const absl::Duration t = EnvSeconds("KOMPUTED_RPC_TIMEOUT_S", absl::Seconds(60));
  return t;
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

VkPhysicalDeviceProperties PropertiesOf(const v1::DeviceInfo& d) {
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

absl::StatusOr<std::shared_ptr<Connection>> Connection::Open(const RemoteOptions& options) {
  komputed::core::TuneMallocForBulkTransfers();  // tensor data moves in multi-megabyte messages
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Each session on a connection of its own (not one shared through gRPC's global subchannel
  // pool): behind a balancer, the sessions of one process spread over the daemons as those of
  // separate processes do, and one session's connection failing leaves the others'.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  KD_ASSIGN_OR_RETURN(std::shared_ptr<const ClientCredentials> credentials,
                      ClientCredentials::Load(options.credentials));
  std::shared_ptr<Connection> c(new Connection());
  c->address_ = options.address;
  c->channel_ = credentials->CreateChannel(options.address, args, options.tls_name);
  c->sessions_ = v1::Sessions::NewStub(c->channel_);
  c->devices_ = v1::Devices::NewStub(c->channel_);
  c->tensors_ = v1::Tensors::NewStub(c->channel_);
  c->algorithms_ = v1::Algorithms::NewStub(c->channel_);
  c->sequences_ = v1::Sequences::NewStub(c->channel_);

  v1::OpenSessionRequest request;
  request.set_device_index(options.device_index.value_or(0));
  for (uint32_t f : options.queue_families) request.add_queue_families(f);
  request.set_client_name(options.client_name);
  v1::OpenSessionResponse response;
  grpc::Status opened;
  {
    grpc::ClientContext context;
    SetDeadline(context, RpcTimeout());
    opened = c->sessions_->OpenSession(&context, request, &response);
  }
  if (opened.error_code() == grpc::StatusCode::UNAVAILABLE &&
      c->channel_->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    // The connection itself failed, so the daemon never saw the call. A daemon busy accepting
    // many clients at once can fail one connect; one more attempt, waiting for the channel's
    // reconnect, is safe (no session was made) and bounded. A second failure reports the first.
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    SetDeadline(context, std::min(kOpenSessionRetryWindow, RpcTimeout()));
    response.Clear();
    if (c->sessions_->OpenSession(&context, request, &response).ok()) opened = grpc::Status::OK;
  }
  KD_RETURN_IF_ERROR(FromGrpcStatusWithHint(
      opened, absl::StrCat("opening a session on komputed at ", options.address),
      credentials.get()));
  c->session_id_ = response.session_id();
  c->properties_ = PropertiesOf(response.device());
  c->spin_ = WaitSpin(c->properties_.deviceType);
  c->eval_spin_ = std::make_unique<komputed::core::SpinWindow>(c->spin_, WaitSpinLimit(c->spin_));
  c->grpc_eval_spin_ =
      std::make_unique<komputed::core::SpinWindow>(c->spin_, WaitSpinLimit(c->spin_));
  if (response.idle_timeout_ms() > 0) {
    c->idle_timeout_ = absl::Milliseconds(response.idle_timeout_ms());
  }
  c->execute_batches_ = response.execute_batches();
  if (response.max_message_bytes() > 0) c->max_message_bytes_ = response.max_message_bytes();
  if (const char* env = std::getenv("KOMPUTED_EXECUTE_BATCHES");
      env != nullptr && absl::string_view(env) == "0") {
    c->execute_batches_ = false;
  }
  c->shared_memory_socket_ = response.shared_memory_socket();
  c->shared_memory_ticket_ = response.shared_memory_ticket();
  if (!c->shared_memory_socket_.empty()) {
    const char* env = std::getenv("KOMPUTED_SHARED_MEMORY");
    if (env != nullptr && absl::string_view(env) == "0") {
      spdlog::info("komputed: KOMPUTED_SHARED_MEMORY=0: tensor data goes over gRPC");
    } else {
      c->shared_memory_usable_ = true;
    }
  }
  c->bulk_ = std::make_unique<BulkTransfer>(c->address_, options.tls_name, std::move(credentials),
                                            c->channel_, c->session_id_, response.direct_address());
  c->StartKeepAlive();
  return c;
}

std::shared_ptr<core::SharedMemory> Connection::ShareMemory(uint64_t region, uint64_t bytes) {
  if (!shared_memory_usable_.load()) return nullptr;
  absl::StatusOr<std::shared_ptr<core::SharedMemory>> memory =
      core::SharedMemory::Create(bytes, "komputed-tensor");
  if (!memory.ok()) {
    spdlog::warn(
        "komputed: no shared memory for a tensor of {} bytes ({}); its data goes over "
        "gRPC",
        bytes, memory.status().ToString());
    return nullptr;
  }
  const absl::Status passed =
      v1::wire::PassSharedMemory(shared_memory_socket_, shared_memory_ticket_, region,
                                 (*memory)->fd(), (*memory)->size(), RpcTimeout());
  (*memory)->CloseDescriptor();
  if (absl::IsUnavailable(passed) || absl::IsNotFound(passed)) {
    // Another host, another network namespace, or another daemon behind the address.
    if (shared_memory_usable_.exchange(false)) {
      spdlog::info(
          "komputed: the daemon's shared memory cannot be used from here ({}); tensor "
          "data goes over gRPC",
          passed.ToString());
    }
    return nullptr;
  }
  if (absl::IsInvalidArgument(passed) || absl::IsUnimplemented(passed)) {
    // The device does not take this kind of memory: no later tensor would fare better.
    if (shared_memory_usable_.exchange(false)) {
      spdlog::warn(
          "komputed: the daemon's device does not take shared memory ({}); tensor data "
          "goes over gRPC",
          passed.ToString());
    }
    return nullptr;
  }
  if (!passed.ok()) {
    spdlog::warn(
        "komputed: the daemon refused shared memory for a tensor of {} bytes ({}); its "
        "data goes over gRPC",
        bytes, passed.ToString());
    return nullptr;
  }
  return *std::move(memory);
}

std::optional<absl::StatusOr<v1::EvalResponse>> Connection::EvalSameHost(
    const v1::EvalRequest& request, absl::Duration timeout) {
  if (!shared_memory_usable_.load() || !SameHostChannel::Takes(request)) return std::nullopt;
  std::unique_lock<std::mutex> lock(channel_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;  // another thread's eval is on it: gRPC
  if (same_host_ == nullptr) {
    if (channel_failed_) return std::nullopt;
    absl::StatusOr<std::unique_ptr<SameHostChannel>> opened =
        SameHostChannel::Open(shared_memory_socket_, shared_memory_ticket_, RpcTimeout(),
                              /*ring=*/SameHostChannel::RingWanted());
    if (!opened.ok()) {
      channel_failed_ = true;
      spdlog::info("komputed: no same-host eval channel ({}); evals go over gRPC",
                   opened.status().ToString());
      return std::nullopt;
    }
    same_host_ = *std::move(opened);
  }
  bool sent = false;
  absl::StatusOr<v1::EvalResponse> response =
      same_host_->Eval(request, timeout, *eval_spin_, &sent);
  if (same_host_->broken()) same_host_.reset();  // opened again for the next eval
  if (!sent) return std::nullopt;                // it never reached the daemon
  return response;
}

grpc::Status Connection::EvalOverGrpc(grpc::ClientContext* context, const v1::EvalRequest& request,
                                      v1::EvalResponse* response) {
  if (spin_ <= absl::ZeroDuration()) return sequences_->Eval(context, request, response);
  grpc::CompletionQueue cq;
  const absl::Time sent = absl::Now();
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::EvalResponse>> call =
      sequences_->AsyncEval(context, request, &cq);
  grpc::Status status;
  call->Finish(response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  // Each AsyncNext with a deadline already past looks at the connection once without sleeping.
  const absl::Time started = absl::Now();
  const absl::Time poll_until = started + grpc_eval_spin_->Window(sent, started);
  bool seen_running = false;
  bool answered = false;
  while (true) {
    if (cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) ==
        grpc::CompletionQueue::GOT_EVENT) {
      answered = true;
      break;
    }
    seen_running = true;
    if (absl::Now() >= poll_until) break;
  }
  if (!answered) answered = cq.Next(&tag, &ok);  // the call ends by its deadline at the latest
  grpc_eval_spin_->Observe(absl::Now() - sent, seen_running);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!answered) return grpc::Status(grpc::StatusCode::INTERNAL, "the eval's call never ended");
  return status;
}

Connection::~Connection() {
  StopKeepAlive();
  StopSubmitChannel();
  std::lock_guard<std::mutex> lock(stream_mu_);
  CloseStreamLocked();
}

absl::Status Connection::Close(absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    deferred_.clear();  // the daemon frees the session's objects with it
  }
  StopKeepAlive();
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::CloseSessionRequest request;
  request.set_session_id(session_id_);
  v1::CloseSessionResponse response;
  absl::Status s = FromGrpcStatusWithHint(sessions_->CloseSession(&context, request, &response),
                                          "closing the session");
  StopSubmitChannel();
  std::lock_guard<std::mutex> lock(stream_mu_);
  CloseStreamLocked();
  return s;
}

void Connection::Defer(v1::Command command) {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  if (!closed_) deferred_.push_back(std::move(command));
}

std::vector<v1::Command> Connection::TakeDeferred() {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  return std::exchange(deferred_, {});
}

absl::Status Connection::FlushIfMany() {
  {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    if (deferred_.size() < kMaxDeferredCommands) return absl::OkStatus();
  }
  v1::EvalRequest request;
  for (auto& c : TakeDeferred()) *request.add_commands() = std::move(c);
  if (request.commands_size() == 0) return absl::OkStatus();
  request.set_session_id(session_id_);
  v1::EvalResponse response;
  grpc::ClientContext context;
  SetDeadline(context, RpcTimeout());
  return FromGrpcStatusWithHint(sequences_->Eval(&context, request, &response),
                                "flushing commands");
}

std::shared_ptr<Connection::Pending> Connection::SubmitSameHost(const v1::EvalRequest& request) {
  if (!shared_memory_usable_.load() || !SameHostChannel::Takes(request)) return nullptr;
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (submit_failed_) return nullptr;
  if (submit_ == nullptr) {
    absl::StatusOr<std::unique_ptr<SameHostChannel>> opened =
        SameHostChannel::Open(shared_memory_socket_, shared_memory_ticket_, RpcTimeout());
    if (!opened.ok()) {
      submit_failed_ = true;
      spdlog::info(
          "komputed: no same-host channel for asynchronous evals ({}); they go over the "
          "Execute stream",
          opened.status().ToString());
      return nullptr;
    }
    submit_ = *std::move(opened);
    submit_reader_ = std::thread([this, channel = submit_.get()] {
      komputed::core::NameThisThread("kp-shm-answers");
      ReadSubmitAnswers(channel);
    });
  }
  const uint64_t id = next_request_.fetch_add(1);
  auto pending = std::make_shared<Pending>();
  {
    std::lock_guard<std::mutex> plock(submit_pending_mu_);
    // The daemon takes this many at once on a channel; more go over the stream.
    if (submit_closed_ || submit_pending_.size() >= v1::wire::kMaxChannelSubmits) return nullptr;
    submit_pending_[id] = pending;
  }
  if (absl::Status sent = submit_->Submit(id, request); !sent.ok()) {
    {
      std::lock_guard<std::mutex> plock(submit_pending_mu_);
      submit_pending_.erase(id);
    }
    submit_->Shutdown();  // its reader fails what was sent before and stops
    submit_failed_ = true;
    spdlog::info(
        "komputed: the same-host channel for asynchronous evals broke ({}); they go "
        "over the Execute stream",
        sent.ToString());
    return nullptr;  // this one never reached the daemon
  }
  return pending;
}

void Connection::ReadSubmitAnswers(SameHostChannel* channel) {
  for (;;) {
    uint64_t id = 0;
    absl::StatusOr<v1::EvalResponse> answer = channel->NextSubmitAnswer(&id, spin_);
    if (id == 0) break;  // closed, or an answer that cannot be read: nothing more is trusted
    std::shared_ptr<Pending> pending;
    {
      std::lock_guard<std::mutex> plock(submit_pending_mu_);
      auto it = submit_pending_.find(id);
      if (it == submit_pending_.end()) continue;
      pending = std::move(it->second);
      submit_pending_.erase(it);
    }
    if (answer.ok()) {
      Complete(*pending, absl::OkStatus(), *std::move(answer));
    } else {
      Complete(*pending, answer.status(), {});
    }
  }
  std::map<uint64_t, std::shared_ptr<Pending>> orphans;
  {
    std::lock_guard<std::mutex> plock(submit_pending_mu_);
    submit_closed_ = true;
    orphans.swap(submit_pending_);
  }
  for (auto& [id, pending] : orphans) {
    Complete(*pending,
             absl::UnavailableError("the same-host channel closed before the eval's answer came"),
             {});
  }
}

void Connection::StopSubmitChannel() {
  std::unique_ptr<SameHostChannel> channel;
  std::thread reader;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    submit_failed_ = true;
    if (submit_ != nullptr) submit_->Shutdown();
    channel = std::move(submit_);
    reader = std::move(submit_reader_);
  }
  if (reader.joinable()) reader.join();
}

absl::StatusOr<std::shared_ptr<Connection::Pending>> Connection::ExecuteAsync(
    v1::EvalRequest request) {
  if (std::shared_ptr<Pending> pending = SubmitSameHost(request); pending != nullptr) {
    return pending;
  }
  std::lock_guard<std::mutex> lock(stream_mu_);
  if (stream_ == nullptr) OpenStreamLocked();
  uint64_t id = next_request_.fetch_add(1);
  request.set_request_id(id);
  auto pending = std::make_shared<Pending>();
  bool ended;
  {
    std::lock_guard<std::mutex> plock(pending_mu_);
    ended = stream_ended_;
    if (!ended) pending_[id] = pending;
  }
  if (!ended && execute_batches_) {
    // The writer sends it, with whatever else gathers meanwhile; the reader completes it (or
    // fails it, should the stream end first).
    {
      std::lock_guard<std::mutex> olock(out_mu_);
      outgoing_.push_back(std::move(request));
    }
    out_cv_.notify_all();  // the writer (the reader waits on it only once the writer stops)
    return pending;
  }
  if (!ended) {
    v1::ExecuteRequest message;
    *message.mutable_eval() = std::move(request);
    if (stream_->Write(message)) return pending;
    std::lock_guard<std::mutex> plock(pending_mu_);
    pending_.erase(id);
  }
  // Why it broke (the daemon unreachable, or refusing the stream), where the stream says; the
  // next eval opens a new one.
  const grpc::Status why = CloseStreamLocked();
  if (!why.ok() && why.error_code() != grpc::StatusCode::CANCELLED) {
    return FromGrpcStatusWithHint(why, "the Execute stream to the daemon broke");
  }
  return absl::UnavailableError("the Execute stream to the daemon broke");
}

void Connection::WriteStream(Stream* stream) {
  // Within the daemon's message limit with room to spare (a request larger than the batch's bytes
  // goes alone).
  const uint64_t batch_bytes = v1::wire::ExecuteBatchBytes(max_message_bytes_);
  std::unique_lock<std::mutex> lock(out_mu_);
  for (;;) {
    out_cv_.wait(lock, [this] { return stop_writer_ || !outgoing_.empty(); });
    if (stop_writer_) break;
    v1::ExecuteRequest message;
    message.set_batched_events(true);
    *message.mutable_eval() = std::move(outgoing_.front());
    outgoing_.pop_front();
    uint64_t bytes = message.eval().ByteSizeLong();
    while (!outgoing_.empty() &&
           static_cast<size_t>(message.more_evals_size()) + 1 < v1::wire::kMaxExecuteBatch) {
      const uint64_t more = outgoing_.front().ByteSizeLong() + v1::wire::kExecuteBatchEntryBytes;
      if (bytes + more > batch_bytes) break;
      bytes += more;
      *message.add_more_evals() = std::move(outgoing_.front());
      outgoing_.pop_front();
    }
    lock.unlock();
    const bool written = stream->Write(message);
    lock.lock();
    // A broken stream ends its reads too: the reader fails what is pending, these included.
    if (!written) break;
  }
  outgoing_.clear();
  writer_running_ = false;
  out_cv_.notify_all();
}

void Connection::StartKeepAlive() {
  keepalive_ = std::thread([this] {
    komputed::core::NameThisThread("kp-keepalive");
    std::unique_lock<std::mutex> lock(keepalive_mu_);
    const auto period =
        absl::ToChronoNanoseconds(std::max(idle_timeout_ / 3, absl::Milliseconds(50)));
    while (!keepalive_cv_.wait_for(lock, period, [this] { return stop_keepalive_; })) {
      grpc::ClientContext context;
      SetDeadline(context, absl::Seconds(10));
      keepalive_call_ = &context;
      lock.unlock();
      v1::KeepAliveRequest request;
      request.set_session_id(session_id_);
      v1::KeepAliveResponse response;
      sessions_->KeepAlive(&context, request, &response);
      lock.lock();
      keepalive_call_ = nullptr;
    }
  });
}

// Cancels a keep-alive call in progress rather than waiting for its answer.
void Connection::StopKeepAlive() {
  {
    std::lock_guard<std::mutex> lock(keepalive_mu_);
    stop_keepalive_ = true;
    if (keepalive_call_ != nullptr) keepalive_call_->TryCancel();
  }
  keepalive_cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
}

void Connection::OpenStreamLocked() {
  stream_context_ = std::make_unique<grpc::ClientContext>();
  stream_ = sequences_->Execute(stream_context_.get());
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    stream_ended_ = false;
  }
  if (execute_batches_) {
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      stop_writer_ = false;
      writer_running_ = true;
    }
    writer_ = std::thread([this, stream = stream_.get()] {
      komputed::core::NameThisThread("kp-stream-write");
      WriteStream(stream);
    });
  }
  reader_ = std::thread([this, stream = stream_.get()] {
    komputed::core::NameThisThread("kp-stream-read");
    auto deliver = [this](v1::ExecuteEvent& event) {
      std::shared_ptr<Pending> p;
      {
        std::lock_guard<std::mutex> lock(pending_mu_);
        auto it = pending_.find(event.request_id());
        if (it == pending_.end()) return;
        p = it->second;
        pending_.erase(it);
      }
      Complete(*p,
               FromGrpcStatusWithHint(
                   grpc::Status(static_cast<grpc::StatusCode>(event.code()), event.message())),
               std::move(*event.mutable_result()));
    };
    v1::ExecuteEvent event;
    while (stream->Read(&event)) {
      deliver(event);
      for (v1::ExecuteEvent& more : *event.mutable_more_events()) deliver(more);
    }
    // The stream ended. With a writer thread, the reader finishes the stream once the writer has
    // stopped, so that what was pending fails with the reason (no daemon to connect to, say).
    absl::Status why = absl::UnavailableError("the Execute stream to the daemon ended");
    std::optional<grpc::Status> finished;
    if (execute_batches_) {
      {
        std::unique_lock<std::mutex> lock(out_mu_);
        stop_writer_ = true;
        out_cv_.notify_all();
        out_cv_.wait(lock, [this] { return !writer_running_; });
      }
      finished = stream->Finish();
      if (!finished->ok() && finished->error_code() != grpc::StatusCode::CANCELLED) {
        why = FromGrpcStatusWithHint(*finished, "the Execute stream to the daemon ended");
      }
    }
    // Whatever is still pending failed, and nothing more is taken on this stream.
    std::map<uint64_t, std::shared_ptr<Pending>> orphans;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      stream_ended_ = true;
      stream_status_ = std::move(finished);
      orphans.swap(pending_);
    }
    for (auto& [id, p] : orphans) Complete(*p, why, {});
  });
}

grpc::Status Connection::CloseStreamLocked() {
  if (stream_ == nullptr) return grpc::Status::OK;
  // A stream that has ended already (the daemon gone, or refusing it) keeps its status.
  stream_context_->TryCancel();
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    stop_writer_ = true;
  }
  out_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
  {
    // What was queued but never sent was registered before the reader failed what was pending
    // (it failed these too): none of it may go out on the next stream.
    std::lock_guard<std::mutex> lock(out_mu_);
    outgoing_.clear();
  }
  std::optional<grpc::Status> finished;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    finished = std::move(stream_status_);
    stream_status_.reset();
  }
  grpc::Status status = finished.has_value() ? *std::move(finished) : stream_->Finish();
  stream_.reset();
  stream_context_.reset();
  return status;
}

void Connection::Complete(Pending& p, absl::Status status, v1::EvalResponse result) {
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.done.store(true, std::memory_order_release);
    p.status = std::move(status);
    p.result = std::move(result);
  }
  p.cv.notify_all();
}

}  // namespace kp::internal::remote
