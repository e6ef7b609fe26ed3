#pragma once
// The session on a komputed daemon that a remote backend and every object made through it share.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backend.h"
#include "komputed/core/shared_memory.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "remote/bulk_transfer.h"
#include "remote/remote_backend.h"
#include "remote/same_host_channel.h"

namespace kp::internal::remote {

// A device's properties as the daemon describes them.
VkPhysicalDeviceProperties PropertiesOf(const komputed::v1::DeviceInfo& device);

// One open session: its channel and stubs, a keep-alive thread, the commands deferred to the next
// call, and the Execute stream of asynchronous evaluations. Thread-safe. Shared (shared_ptr) by
// the backend and its objects; Close() ends the session; the destructor only releases (cancels
// the calls in progress, joins its threads) and never calls the daemon.
class Connection {
 public:
  // The outcome of one asynchronous evaluation, completed by the stream's reader thread.
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    // Set under `mu` (so that a waiter on `cv` cannot miss it); atomic so that a waiter may poll it
    // before it sleeps.
    std::atomic<bool> done{false};
    absl::Status status;
    komputed::v1::EvalResponse result;
  };

  // Opens a session (bounded by RpcTimeout()).
  static absl::StatusOr<std::shared_ptr<Connection>> Open(const RemoteOptions& options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Closes the session on the daemon within `timeout` (the daemon frees what it holds for it,
  // deferred destroys included), then stops the keep-alive and the Execute stream. Idempotent.
  absl::Status Close(absl::Duration timeout);

  const std::string& session_id() const { return session_id_; }
  const VkPhysicalDeviceProperties& properties() const { return properties_; }
  komputed::v1::Devices::Stub& devices() { return *devices_; }
  komputed::v1::Tensors::Stub& tensors() { return *tensors_; }
  komputed::v1::Algorithms::Stub& algorithms() { return *algorithms_; }
  komputed::v1::Sequences::Stub& sequences() { return *sequences_; }
  BulkTransfer& bulk() { return *bulk_; }

  // Shared memory of at least `bytes` for a tensor's host data, passed to the daemon as region
  // `region` (OpenSessionResponse.shared_memory_socket). Null where the session has none: the
  // daemon offers none, $KOMPUTED_SHARED_MEMORY is 0, or its socket cannot be reached from here
  // (logged once; the session keeps to the gRPC path from then on), or the daemon refused this
  // memory (logged).
  std::shared_ptr<komputed::core::SharedMemory> ShareMemory(uint64_t region, uint64_t bytes);
  // Runs `request` on the same-host channel (same_host_channel.h) when the session uses shared
  // memory, the request suits the channel and no other thread is using it: the daemon's answer.
  // Nothing (the caller sends it over gRPC) otherwise, or when it could not be sent.
  std::optional<absl::StatusOr<komputed::v1::EvalResponse>> EvalSameHost(
      const komputed::v1::EvalRequest& request, absl::Duration timeout);
  // A unary Eval over gRPC. On a device whose waits poll (spin() > 0), the calling thread polls
  // its own completion queue for the answer for a while (a SpinWindow learned from the evals
  // before) before it sleeps: a thread asleep in the kernel wakes tens of microseconds after the
  // answer arrives, more on a virtual machine. Otherwise, and after that window, gRPC's blocking
  // call. The context's deadline bounds it either way.
  grpc::Status EvalOverGrpc(grpc::ClientContext* context, const komputed::v1::EvalRequest& request,
                            komputed::v1::EvalResponse* response);
  // How long a wait for the daemon's answer on the same-host channel polls before it sleeps
  // (WaitSpin of the session's device).
  absl::Duration spin() const { return spin_; }
  // Whether the daemon offered shared memory and the session still uses it.
  bool shares_memory() const { return shared_memory_usable_.load(); }

  // A fresh object handle (the client chooses them).
  uint64_t NewHandle() { return next_handle_.fetch_add(1); }

  // Queues a command (a destroy) for the next eval; no I/O. Dropped once the session is closed.
  void Defer(komputed::v1::Command command);
  std::vector<komputed::v1::Command> TakeDeferred();
  // Sends the deferred commands now when many have gathered (bounded by RpcTimeout()).
  absl::Status FlushIfMany();

  // Sends `request` on the Execute stream (opened on first use); the reader thread completes the
  // returned Pending.
  absl::StatusOr<std::shared_ptr<Pending>> ExecuteAsync(komputed::v1::EvalRequest request);

 private:
  Connection() = default;
  void StartKeepAlive();
  void StopKeepAlive();
  void OpenStreamLocked();
  // Cancels the stream (no waiting for the daemon) and collects its reader: the status that the
  // stream ended with (CANCELLED when it was still open), or OK when there was none.
  grpc::Status CloseStreamLocked();
  static void Complete(Pending& p, absl::Status status, komputed::v1::EvalResponse result);

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<komputed::v1::Sessions::Stub> sessions_;
  std::unique_ptr<komputed::v1::Devices::Stub> devices_;
  std::unique_ptr<komputed::v1::Tensors::Stub> tensors_;
  std::unique_ptr<komputed::v1::Algorithms::Stub> algorithms_;
  std::unique_ptr<komputed::v1::Sequences::Stub> sequences_;
  std::string session_id_;
  std::string shared_memory_socket_;  // empty: none offered
  std::string shared_memory_ticket_;
  std::atomic<bool> shared_memory_usable_{false};
  // Asynchronous evals on a second same-host channel, pipelined: sent there when the session
  // shares memory and the request suits the channel; null otherwise (the caller uses the stream).
  std::shared_ptr<Pending> SubmitSameHost(const komputed::v1::EvalRequest& request);
  // The submit channel's reader thread: completes each Pending as its answer comes; once the
  // channel closes, fails those still waiting.
  void ReadSubmitAnswers(SameHostChannel* channel);
  // Shuts the submit channel and joins its reader.
  void StopSubmitChannel();

  std::mutex submit_mu_;                     // guards submit_, its reader, submit_failed_, sends
  std::unique_ptr<SameHostChannel> submit_;  // opened on first use
  std::thread submit_reader_;
  bool submit_failed_ = false;  // it could not be opened, or broke: the stream
  std::mutex submit_pending_mu_;
  std::map<uint64_t, std::shared_ptr<Pending>> submit_pending_;  // guarded by submit_pending_mu_
  bool submit_closed_ = false;  // guarded by submit_pending_mu_: its reader has stopped

  std::mutex channel_mu_;                       // one eval at a time on the channel
  std::unique_ptr<SameHostChannel> same_host_;  // guarded by channel_mu_; opened on first use
  bool channel_failed_ = false;                 // guarded by channel_mu_: it could not be opened
  VkPhysicalDeviceProperties properties_{};
  absl::Duration spin_ = absl::ZeroDuration();
  // How long an eval on the same-host channel polls for its answer (from spin_; channel_mu_).
  std::unique_ptr<komputed::core::SpinWindow> eval_spin_;
  // How long a unary Eval over gRPC polls for its answer (EvalOverGrpc; thread-safe).
  std::unique_ptr<komputed::core::SpinWindow> grpc_eval_spin_;
  absl::Duration idle_timeout_ = absl::Seconds(60);
  std::unique_ptr<BulkTransfer> bulk_;

  std::atomic<uint64_t> next_handle_{1};
  std::mutex deferred_mu_;
  std::vector<komputed::v1::Command> deferred_;  // guarded by deferred_mu_
  bool closed_ = false;                          // guarded by deferred_mu_

  using Stream = grpc::ClientReaderWriter<komputed::v1::ExecuteRequest, komputed::v1::ExecuteEvent>;
  // The stream's writer thread (a daemon that takes batches): sends what has gathered in
  // outgoing_ since its last write in one request, until told to stop or the stream breaks.
  void WriteStream(Stream* stream);

  std::mutex stream_mu_;  // guards stream_, its context, its threads and (without batches) writes
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  std::thread writer_;                    // with batches
  bool execute_batches_ = false;          // the daemon takes several evals in one Execute request
  uint64_t max_message_bytes_ = 4 << 20;  // the daemon's largest accepted message
  std::atomic<uint64_t> next_request_{1};
  std::mutex pending_mu_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // guarded by pending_mu_
  bool stream_ended_ = false;  // guarded by pending_mu_: the reader has failed what was pending
  // Guarded by pending_mu_: the status of a stream that its reader finished (with batches).
  std::optional<grpc::Status> stream_status_;
  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<komputed::v1::EvalRequest> outgoing_;  // guarded by out_mu_: not sent yet
  bool stop_writer_ = false;                        // guarded by out_mu_
  bool writer_running_ = false;                     // guarded by out_mu_

  std::mutex keepalive_mu_;
  std::condition_variable keepalive_cv_;
  bool stop_keepalive_ = false;                    // guarded by keepalive_mu_
  grpc::ClientContext* keepalive_call_ = nullptr;  // the call in progress; guarded by keepalive_mu_
  std::thread keepalive_;
};

}  // namespace kp::internal::remote
