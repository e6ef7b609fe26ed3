#include "session_manager.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "komputed/core/malloc_tuning.h"
#include "komputed/core/shared_memory.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"
#include "session_wire.h"
#include "status.h"

namespace komputed::server {
namespace {

// How often the reaper looks at least (when no session is about to expire).
constexpr absl::Duration kMaxReapInterval = absl::Seconds(10);
// How soon it looks again at most (so that many sessions expiring together cost little).
constexpr absl::Duration kMinReapInterval = absl::Milliseconds(5);

// 128 random bits as 32 hex digits.
std::string NewSessionId() { return RandomHex(16); }

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d)); }

absl::Status NotFound(absl::string_view id, absl::Duration idle_timeout, absl::string_view daemon) {
  return absl::NotFoundError(absl::StrCat(
      "session ", id, " not found on ", daemon, " (it was closed, or idle for longer than ",
      Seconds(idle_timeout),
      ", or the daemon restarted, or the call reached another daemon than the one that opened "
      "the session)"));
}

// "komputed on HOST", with the advertised address when there is one.
std::string DaemonName(const ServerOptions& options) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string name = absl::StrCat("komputed on ", host[0] != '\0' ? host : "an unnamed host");
  if (!options.advertise_address.empty())
    absl::StrAppend(&name, " (", options.advertise_address, ")");
  return name;
}

bool Owns(const Caller& caller, const Session& session) {
  return session.tenant() == caller.tenant();
}

}  // namespace

SessionManager::SessionManager(DevicePool* pool, const ServerOptions& options, Metrics* metrics,
                               WorkGate* gate)
    : pool_(pool), options_(options), daemon_(DaemonName(options)), metrics_(metrics), gate_(gate) {
  if (options_.max_kernel_time > absl::ZeroDuration()) {
    watchdog_ = Watchdog::Create(
        options_.watchdog_interval,
        [this](const std::string& id, absl::Duration limit) { Overrun(id, limit); },
        options_.kernel_stop_grace,
        [this](const void* instance, const std::string& id, absl::Duration waited) {
          Unresponsive(instance, id, waited);
        });
  }
  reaper_ = std::thread([this] {
    core::NameThisThread("kd-reaper");
    Reap();
  });
  if (options_.shared_memory) {
    SharedMemoryListener::Handlers handlers;
    handlers.take = [this](v1::wire::SharedMemoryAttach request) {
      return TakeSharedMemory(std::move(request));
    };
    handlers.bind = [this](absl::string_view ticket) { return UseByTicket(ticket).status(); };
    handlers.eval = [this](const std::string& ticket, std::string request, bool may_wait_inline,
                           std::function<void(absl::StatusOr<std::string>)> done) {
      SameHostEval(ticket, std::move(request), may_wait_inline, std::move(done));
    };
    handlers.ring_taken = [this] { metrics_->same_host_rings_total().Increment(); };
    handlers.ring_eval = [this] { metrics_->same_host_ring_evals_total().Increment(); };
    handlers.ring_wake = [&word = metrics_->same_host_ring_wakes_total("answer_word"),
                          &socket = metrics_->same_host_ring_wakes_total("socket")](
                             SharedMemoryListener::RingWake way) {
      (way == SharedMemoryListener::RingWake::kAnswerWord ? word : socket).Increment();
    };
    // The reactors poll briefly for a channel's next record, as an inline wait polls its fence,
    // but not while a CPU device works: its work needs the cores. Between two evals it does not,
    // and a client's next eval follows its answer closely.
    handlers.may_poll = [this] { return !pool_->cpu_device_busy(); };
    absl::StatusOr<std::unique_ptr<SharedMemoryListener>> listener = SharedMemoryListener::Start(
        std::move(handlers), static_cast<size_t>(std::max(options_.eval_inline_waiters, 0)) + 1,
        options_.eval_spin);
    if (listener.ok()) {
      shared_memory_ = *std::move(listener);
      spdlog::info("same-host clients pass shared memory on the abstract socket @{}",
                   shared_memory_->name());
    } else {
      spdlog::warn("no shared memory for same-host clients (they use the socket path): {}",
                   listener.status().ToString());
    }
  }
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::UseByTicket(absl::string_view ticket) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(ticket);
    if (it != tickets_.end()) session = it->second.lock();
    if (session == nullptr) {
      return absl::NotFoundError(
          "no session of this daemon has that ticket (closed, or another daemon's)");
    }
    session->BeginUse();  // under mu_, as Get: the reaper cannot take it from here on
  }
  session->Touch();
  Session* raw = session.get();
  return std::shared_ptr<Session>(raw, [keep = std::move(session)](Session* s) { s->EndUse(); });
}

void SessionManager::SameHostEval(const std::string& ticket, std::string bytes,
                                  bool may_wait_inline,
                                  std::function<void(absl::StatusOr<std::string>)> done) {
  absl::StatusOr<std::shared_ptr<Session>> session = UseByTicket(ticket);
  if (!session.ok()) return done(session.status());
  auto request = std::make_shared<v1::EvalRequest>();
  if (!request->ParseFromString(bytes)) {
    return done(absl::InvalidArgumentError("a channel eval that is not an EvalRequest"));
  }
  // What the channel's thread can do at once: no object to build, no answer to outgrow a record.
  if (absl::Status takes = v1::wire::ChannelTakes(*request); !takes.ok()) return done(takes);
  metrics_->same_host_evals_total().Increment();
  std::shared_ptr<Session> s = *std::move(session);
  const std::string id = s->id();
  s->Eval(wire::FromWire(*request, id), absl::InfiniteFuture(), may_wait_inline,
          [request, s, done = std::move(done)](absl::StatusOr<EvalResult> result) mutable {
            if (!result.ok()) {
              done(result.status());
            } else {
              v1::EvalResponse response;
              wire::ToWire(*std::move(result), &response);
              std::string out;
              response.SerializeToString(&out);
              if (out.size() + 64 > v1::wire::kMaxChannelRecord) {
                done(absl::ResourceExhaustedError(absl::StrCat(
                    "the eval's answer of ", out.size(),
                    " bytes does not fit a channel record; its results are on the daemon")));
              } else {
                done(std::move(out));
              }
            }
            s.reset();
          });
}

absl::Status SessionManager::TakeSharedMemory(v1::wire::SharedMemoryAttach request) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(request.ticket);
    if (it != tickets_.end()) session = it->second.lock();
  }
  if (session == nullptr) {
    return absl::NotFoundError(
        "no session of this daemon has that shared-memory ticket (closed, or another daemon's)");
  }
  const core::Device& device = *session->instance()->device;
  // Regions as large as the device's largest buffer, in whole pages.
  const uint64_t page = core::SharedMemory::PageSize();
  const uint64_t max_buffer =
      device.info().max_buffer_size != 0 ? device.info().max_buffer_size : uint64_t{1} << 40;
  absl::StatusOr<std::shared_ptr<core::SharedMemory>> memory = core::SharedMemory::Adopt(
      request.fd.get(), request.size, (max_buffer + page - 1) / page * page);
  if (!memory.ok()) return memory.status();
  return session->AttachSharedMemory(request.region, *std::move(memory));
}

void SessionManager::Unresponsive(const void* instance, const std::string& id,
                                  absl::Duration waited) {
  for (size_t i = 0; i < pool_->size(); ++i) {
    PooledDevice& device = pool_->at(i);
    std::shared_ptr<DeviceInstance> current = device.instance();
    if (current.get() != instance) continue;
    current->device->MarkLost(absl::StrCat(
        "a submission of session ", id, " stopped by the kernel watchdog had not left it ",
        absl::FormatDuration(waited), " after the stop (--kernel_stop_grace)"));
    device.CheckLost(*current);
    return;
  }
}

void SessionManager::Overrun(const std::string& id, absl::Duration limit) {
  constexpr size_t kMaxClosedKept = 4096;
  const std::string reason =
      absl::StrCat("a submission ran longer than its limit of ", absl::FormatDuration(limit),
                   " (--max_kernel_time, or the tenant's kernel_time_ms quota) and was stopped");
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;  // closed already
    session = std::move(it->second);
    sessions_.erase(it);
    if (closed_.try_emplace(id, Closed{session->tenant(), reason}).second) {
      closed_order_.push_back(id);
    }
    while (closed_order_.size() > kMaxClosedKept) {
      closed_.erase(closed_order_.front());
      closed_order_.pop_front();
    }
  }
  const uint64_t held = session->memory_bytes();
  Free(*session, "kernel_time");
  spdlog::warn("session {} of tenant {} closed by the kernel watchdog: {} (it held {} bytes)",
               SessionLogName(id), session->tenant(), reason, held);
}

absl::Status SessionManager::Missing(absl::string_view id, const Caller& caller) const {
  auto it = closed_.find(id);
  if (it != closed_.end() && it->second.tenant == caller.tenant()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", id, " was closed by the daemon: ", it->second.reason, "; open a new session"));
  }
  return NotFound(id, options_.session_idle_timeout, daemon_);
}

void SessionManager::Free(Session& session, const char* reason) {
  if (!session.shared_memory_ticket().empty()) {
    absl::MutexLock lock(&mu_);
    tickets_.erase(session.shared_memory_ticket());
  }
  session.Close();
  session.device().AddSessions(-1);
  session.device().ReleaseQueues(session.queues());
  metrics_->sessions_open().Decrement();
  if (reason != nullptr) metrics_->sessions_reaped_total(reason).Increment();
}

SessionManager::~SessionManager() { Shutdown(); }

void SessionManager::Shutdown() {
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    sessions.swap(sessions_);
  }
  if (reaper_.joinable()) reaper_.join();
  if (watchdog_ != nullptr) watchdog_->Stop();
  for (auto& [id, session] : sessions) {
    const uint64_t held = session->memory_bytes();
    Free(*session, "drain");
    spdlog::info(
        "session {} of tenant {} reaped: the daemon is stopping (it held {} bytes, age {})",
        SessionLogName(id), session->tenant(), held, Seconds(absl::Now() - session->created()));
  }
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Open(OpenRequest request) {
  if (gate_ != nullptr && gate_->closed()) return WorkGate::Refusal("sessions");
  TenantAccount& account = *request.caller.account;
  KD_RETURN_IF_ERROR(
      account.CheckSize(&Quota::client_name_bytes, request.client_name.size(),
                        absl::StrCat("a client_name of ", request.client_name.size(), " bytes")));
  KD_ASSIGN_OR_RETURN(PooledDevice * device, pool_->Get(request.device_index));
  std::shared_ptr<DeviceInstance> instance = device->instance();
  if (instance->device->lost()) {
    return absl::UnavailableError(
        absl::StrCat("device ", request.device_index,
                     " was lost (VK_ERROR_DEVICE_LOST) and is not open again yet; try again "
                     "later or use another device"));
  }
  KD_ASSIGN_OR_RETURN(Charge charge, account.Take(Counted::kSessions, 1));
  KD_ASSIGN_OR_RETURN(std::vector<uint32_t> queues, device->AcquireQueues(request.queue_families));
  SessionFacts facts;
  facts.id = NewSessionId();
  facts.device = device;
  facts.instance = std::move(instance);
  facts.queues = std::move(queues);
  facts.client_name = request.client_name;
  facts.peer = request.peer;
  facts.account = request.caller.account;
  facts.watchdog = watchdog_;
  // Shared memory where the daemon takes it and the device can make buffers over whole pages.
  const uint64_t alignment = facts.instance->device->host_import_alignment();
  if (shared_memory_ != nullptr && alignment != 0 &&
      core::SharedMemory::PageSize() % alignment == 0) {
    facts.shared_memory_ticket = NewSharedMemoryTicket();
  }
  auto session =
      std::make_shared<Session>(std::move(facts), options_, metrics_, gate_, std::move(charge));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      device->ReleaseQueues(session->queues());
      return absl::UnavailableError("the daemon is shutting down");
    }
    sessions_.emplace(session->id(), session);
    if (!session->shared_memory_ticket().empty()) {
      tickets_.emplace(session->shared_memory_ticket(), session);
    }
  }
  device->AddSessions(1);
  metrics_->sessions_open().Increment();
  metrics_->sessions_opened_total().Increment();
  spdlog::info(
      "session {} opened on device {} with {} queue(s) for tenant {} by {} ({})",
      SessionLogName(session->id()), device->index(), session->queue_count(), session->tenant(),
      request.client_name.empty() ? "an unnamed client" : request.client_name, request.peer);
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Get(absl::string_view id,
                                                             const Caller& caller) {
  if (id.empty()) return absl::InvalidArgumentError("no session_id given");
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    // Another tenant's session does not exist for the caller: the same answer as an unknown id.
    if (it == sessions_.end() || !Owns(caller, *it->second)) return Missing(id, caller);
    session = it->second;
    session->BeginUse();  // under mu_: the reaper cannot take it from here on
  }
  session->Touch();
  Session* raw = session.get();
  return std::shared_ptr<Session>(raw, [keep = std::move(session)](Session* s) { s->EndUse(); });
}

absl::Status SessionManager::Close(absl::string_view id, const Caller& caller) {
  if (id.empty()) return absl::InvalidArgumentError("no session_id given");
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || (!caller.admin && !Owns(caller, *it->second))) {
      return Missing(id, caller);
    }
    session = std::move(it->second);
    sessions_.erase(it);
  }
  const uint64_t held = session->memory_bytes();
  Free(*session, /*reason=*/nullptr);
  const bool own = Owns(caller, *session);
  spdlog::info("session {} of tenant {} closed by {} after {} (it held {} bytes)",
               SessionLogName(session->id()), session->tenant(),
               own ? std::string("its client") : absl::StrCat("admin ", caller.tenant()),
               Seconds(absl::Now() - session->created()), held);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Session>> SessionManager::List(const Caller& caller) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> all;
  all.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) {
    if (caller.admin || Owns(caller, *session)) all.push_back(session);
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->created() < b->created(); });
  return all;
}

absl::Time SessionManager::ReapOnce() {
  const absl::Time now = absl::Now();
  absl::Time next = now + std::min(options_.session_idle_timeout, kMaxReapInterval);
  const absl::Duration release_after = options_.sequence_release_after;
  // Sequences are looked at twice per release_after: each goes within 1.5 times it of its last use.
  if (release_after > absl::ZeroDuration()) next = std::min(next, now + release_after / 2);
  std::vector<std::shared_ptr<Session>> idle, open;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      Session& s = *it->second;
      if (s.users() > 0) {  // a call, stream or eval in progress; Get cannot start one now
        ++it;
        continue;
      }
      const absl::Time expires = s.last_activity() + options_.session_idle_timeout;
      if (expires <= now) {
        idle.push_back(std::move(it->second));
        sessions_.erase(it++);
        continue;
      }
      next = std::min(next, expires);
      ++it;
    }
    // The sessions that stay (those reaped above free everything anyway).
    if (release_after > absl::ZeroDuration()) {
      open.reserve(sessions_.size());
      for (const auto& [id, session] : sessions_) open.push_back(session);
    }
  }
  size_t released = 0;
  for (const auto& session : open) released += session->ReleaseIdleSequences(now - release_after);
  if (released > 0) metrics_->sequences_released_total().Increment(static_cast<double>(released));
  for (const auto& session : idle) {
    const absl::Duration idle_for = now - session->last_activity();
    Free(*session, "idle");
    spdlog::info("session {} of tenant {} reaped: no call for {} (idle timeout {})",
                 SessionLogName(session->id()), session->tenant(), Seconds(idle_for),
                 Seconds(options_.session_idle_timeout));
  }
  // What the released command buffers and reaped sessions held is free in malloc's heaps, which
  // the bulk-transfer tuning keeps resident: an idle daemon gives it back to the kernel.
  if (released > 0 || !idle.empty()) core::GiveFreePagesBack();
  return std::max(next, absl::Now() + kMinReapInterval);
}

void SessionManager::Reap() {
  while (true) {
    const absl::Time next = ReapOnce();
    absl::MutexLock lock(&mu_);
    // Wakes at the nearest expiry, or at once when stopping; an activity that moves an expiry
    // later only costs one early look.
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
    if (stopping_) return;
  }
}

}  // namespace komputed::server
