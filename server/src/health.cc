#include "health.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace komputed::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream. At most one write is in flight; a status that changes meanwhile is sent
// when the write completes (only the latest one). Decisions are taken under mu_ and carried out
// outside it. The reactor deletes itself in OnDone, which gRPC calls only after Finish; a
// reserved write or finish (writing_, finished_) keeps it alive until the caller has made the
// gRPC call.
class HealthService::Watcher final : public StreamReactor<HealthCheckRequest, HealthCheckResponse> {
 public:
  // What to do next: write response_, finish, or nothing.
  struct Step {
    bool write = false;
    bool finish = false;
    grpc::Status status;
  };

  Watcher(WatchOps* stream, HealthService* health, std::string service)
      : StreamReactor(stream), health_(health), service_(std::move(service)) {}

  const std::string& service() const { return service_; }

  // The status to send now (and, with `finish`, to end the stream after it).
  Step Want(ServingStatus status, bool finish) {
    absl::MutexLock lock(&mu_);
    wanted_ = status;
    finish_wanted_ = finish_wanted_ || finish;
    return NextLocked();
  }

  // Makes the gRPC call that a Step decided.
  void Take(const Step& step) {
    if (step.write) {
      StartWrite(&response_);
    } else if (step.finish) {
      Finish(step.status);
    }
  }

  void OnWriteDone(bool ok) override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;  // the stream is broken
      step = NextLocked();
    }
    Take(step);
  }

  void OnCancel() override {
    Step step;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      step = NextLocked();
    }
    Take(step);
  }

  void OnDone() override {
    health_->Remove(this);
    delete this;
  }

 private:
  Step NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (writing_ || finished_) return step;
    if (cancelled_) {
      finished_ = true;
      step.finish = true;
      step.status = grpc::Status(grpc::StatusCode::CANCELLED, "the Watch call was cancelled");
    } else if (!sent_any_ || wanted_ != sent_) {
      writing_ = true;
      sent_any_ = true;
      sent_ = wanted_;
      response_.set_status(wanted_);
      step.write = true;
    } else if (finish_wanted_) {
      finished_ = true;
      step.finish = true;
    }
    return step;
  }

  HealthService* const health_;
  const std::string service_;
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);  // the write in flight
  ServingStatus wanted_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus sent_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(const std::vector<std::string>& services)
    : services_(services.begin(), services.end()) {}

HealthService::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  if (!service.empty() && !services_.contains(service)) return HealthCheckResponse::SERVICE_UNKNOWN;
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServing(bool serving) { Update(serving, /*shut_down=*/false); }

void HealthService::Shutdown() { Update(/*serving=*/false, /*shut_down=*/true); }

bool HealthService::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

void HealthService::Update(bool serving, bool shut_down) {
  std::vector<std::pair<Watcher*, Watcher::Step>> steps;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = shut_down;
    if (serving_ != serving) {
      spdlog::info("health: {}", serving ? "SERVING" : "NOT_SERVING");
    }
    serving_ = serving;
    // A watcher cannot be removed (and deleted) while mu_ is held; one whose step is a write or
    // a finish stays alive until that step is taken.
    for (Watcher* w : watchers_) {
      Watcher::Step step = w->Want(StatusLocked(w->service()), shut_down);
      if (step.write || step.finish) steps.emplace_back(w, step);
    }
  }
  for (auto& [watcher, step] : steps) watcher->Take(step);
}

void HealthService::Remove(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

void HealthService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &HealthService::RequestCheck, &HealthService::ServeCheck);
  queue.AddServerStream(this, &HealthService::RequestWatch, &HealthService::ServeWatch);
}

void HealthService::ServeCheck(grpc::ServerContext*, const HealthCheckRequest* request,
                               HealthCheckResponse* response, Answer answer) {
  ServingStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    answer(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("unknown service \"", request->service(),
                     "\" (known: \"\", the whole server, and the komputed.v1 services)")));
    return;
  }
  response->set_status(status);
  answer(grpc::Status::OK);
}

StreamReactor<HealthCheckRequest, HealthCheckResponse>* HealthService::ServeWatch(
    grpc::ServerContext*, const HealthCheckRequest* request, WatchOps* stream) {
  auto* watcher = new Watcher(stream, this, request->service());
  Watcher::Step step;
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) watchers_.insert(watcher);
    step = watcher->Want(StatusLocked(request->service()), /*finish=*/shut_down_);
  }
  watcher->Take(step);
  return watcher;
}

}  // namespace komputed::server
