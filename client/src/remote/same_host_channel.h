#pragma once
// The client's end of the same-host eval channel (komputed/v1/shared_memory_wire.h): one
// connection to the daemon's shared-memory socket, bound to the session, that carries evals without
// gRPC's framing and threads: one at a time (Eval), or pipelined (Submit and NextSubmitAnswer).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "komputed/core/spin.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/shared_memory_wire.h"

namespace kp::internal::remote {

class SameHostChannel {
 public:
  // Connects to the abstract socket `socket_name` and binds to the session of `ticket`, within
  // `timeout`. UNAVAILABLE when the socket cannot be reached; the daemon's refusal otherwise.
  // With `ring` (for a channel of Eval), it also passes a ring of shared memory
  // (v1::wire::ChannelRing) through which its evals go; where the daemon does not take one, the
  // channel goes on without (a log line says why).
  static absl::StatusOr<std::unique_ptr<SameHostChannel>> Open(const std::string& socket_name,
                                                               absl::string_view ticket,
                                                               absl::Duration timeout,
                                                               bool ring = false);
  // Whether the sync channel should pass a ring: unless KOMPUTED_SAME_HOST_RING=0.
  static bool RingWanted();
  ~SameHostChannel();
  SameHostChannel(const SameHostChannel&) = delete;
  SameHostChannel& operator=(const SameHostChannel&) = delete;

  // Whether `request` may go on the channel: it creates no object, brings no data back in its
  // answer and fits one record.
  static bool Takes(const komputed::v1::EvalRequest& request);
  // Sends `request` and waits up to `timeout` for its answer. UNAVAILABLE (`sent` false) when it
  // could not be sent: nothing reached the daemon, and the caller may send it another way. Once
  // sent, a missing answer is DEADLINE_EXCEEDED and the channel is unusable (broken() is true).
  // The answer is polled for without sleeping first, for as long as `spin` says (what the evals
  // before it took feeds it: pass the same one to the evals of one session).
  absl::StatusOr<komputed::v1::EvalResponse> Eval(const komputed::v1::EvalRequest& request,
                                                  absl::Duration timeout,
                                                  komputed::core::SpinWindow& spin, bool* sent);
  bool broken() const { return fd_ < 0; }
  // Whether the channel's evals go through a ring.
  bool has_ring() const { return ring_ != nullptr; }

  // Pipelined use (one thread sends, another receives): sends a kSubmit of `request` tagged
  // `id`, without waiting. UNAVAILABLE when it could not be sent (nothing reached the daemon).
  absl::Status Submit(uint64_t id, const komputed::v1::EvalRequest& request);
  // Waits for the next answer to a submit: its id, and the response or the daemon's error.
  // UNAVAILABLE with id 0 once the channel is closed or shut down; DATA_LOSS with id 0 for a
  // malformed answer (ids start at 1).
  // Polls without sleeping for up to `spin` first.
  absl::StatusOr<komputed::v1::EvalResponse> NextSubmitAnswer(uint64_t* id, absl::Duration spin);
  // Wakes a thread blocked in NextSubmitAnswer (it returns UNAVAILABLE); the descriptor stays
  // open until destruction.
  void Shutdown();

 private:
  explicit SameHostChannel(int fd) : fd_(fd) {}
  // Sends `record` whole; UNAVAILABLE (the channel left as it is) when it could not.
  absl::Status Send(const std::string& record);
  // Sends `record` and receives the answer's record within `timeout`.
  absl::StatusOr<std::string> RoundTrip(const std::string& record, absl::Duration timeout,
                                        komputed::core::SpinWindow& spin, bool* sent);
  // Receives the next record on the socket within `timeout`, polling for up to what `spin` says
  // first; on failure the channel is broken.
  absl::StatusOr<std::string> ReceiveAnswer(absl::Duration timeout,
                                            komputed::core::SpinWindow& spin);
  // RoundTrip through the ring: the socket carries doorbells only.
  absl::StatusOr<std::string> RingRoundTrip(const std::string& record, absl::Duration timeout,
                                            komputed::core::SpinWindow& spin, bool* sent);
  // Passes a new ring to the daemon and waits for its answer.
  absl::Status AttachRing(absl::Duration timeout);
  void Break();

  int fd_;
  std::unique_ptr<komputed::v1::wire::ChannelRing> ring_;
  uint32_t ring_seq_ = 0;  // the last request's number
};

}  // namespace kp::internal::remote
