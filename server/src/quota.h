#pragma once
// What each tenant holds, against its quota (tenants.h). A tenant's sessions share one
// TenantAccount; what is counted (sessions, memory, submissions in flight) is taken as a Charge
// before the work starts and given back when the Charge goes: a tensor's memory charge lives with
// the tensor itself, so that it stays taken while a recording or a submission still uses the
// tensor after its handle was destroyed.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "metrics.h"
#include "tenants.h"

namespace komputed::server {

// The quotas that count what a tenant holds at a time (the others bound one request's size).
enum class Counted : uint8_t { kSessions, kDeviceMemory, kHostMemory, kSubmissions };

class TenantAccount;

// An amount taken from a tenant's counted quota; given back on destruction (or Release). Movable.
class Charge {
 public:
  Charge() = default;
  Charge(Charge&& other) noexcept { *this = std::move(other); }
  Charge& operator=(Charge&& other) noexcept;
  ~Charge() { Release(); }
  void Release();
  uint64_t amount() const { return amount_; }

 private:
  friend class TenantAccount;
  Charge(std::shared_ptr<TenantAccount> account, Counted what, uint64_t amount)
      : account_(std::move(account)), what_(what), amount_(amount) {}
  std::shared_ptr<TenantAccount> account_;
  Counted what_ = Counted::kSessions;
  uint64_t amount_ = 0;
};

// One tenant's use and quota. Thread-safe.
class TenantAccount : public std::enable_shared_from_this<TenantAccount> {
 public:
  TenantAccount(std::string tenant, Quota quota, Metrics* metrics);
  TenantAccount(const TenantAccount&) = delete;
  TenantAccount& operator=(const TenantAccount&) = delete;

  const std::string& tenant() const { return tenant_; }
  Quota quota() const;
  // A reload of the tenants file changes it; what is held stays held (a lowered limit only
  // refuses what comes next).
  void set_quota(const Quota& quota);

  // Takes `amount` of a counted quota, or RESOURCE_EXHAUSTED naming the quota, its limit and the
  // current use (counted in komputed_quota_refusals_total). An amount of 0 always succeeds.
  absl::StatusOr<Charge> Take(Counted what, uint64_t amount);
  uint64_t used(Counted what) const;
  // Counts a failed call or evaluation of the tenant (komputed_tenant_errors_total); OK is not
  // counted.
  void CountError(const absl::Status& status) const;

  // RESOURCE_EXHAUSTED when `value` (of one request, e.g. a tensor's bytes) is over the quota
  // `field`; `what` says what the value is ("tensor 3 of 1048576 bytes").
  absl::Status CheckSize(uint64_t Quota::*field, uint64_t value, absl::string_view what) const;
  // RESOURCE_EXHAUSTED when `in_use + wanted` is over the quota `field` (for what the caller
  // counts itself: the objects of a session, the operations of a sequence).
  absl::Status CheckCount(uint64_t Quota::*field, uint64_t in_use, uint64_t wanted,
                          absl::string_view what) const;

 private:
  friend class Charge;
  void Give(Counted what, uint64_t amount);
  void Publish(Counted what, uint64_t value);
  uint64_t Limit(uint64_t Quota::*field) const;  // the quota in force
  absl::Status Refuse(absl::string_view quota, uint64_t limit, absl::string_view detail) const;

  const std::string tenant_;
  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  Quota quota_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, 4> used_ ABSL_GUARDED_BY(mu_){};
};

// The accounts by tenant name, created on first use and kept (so that what a removed tenant still
// holds stays accounted until it is released). Thread-safe.
class TenantLedger {
 public:
  explicit TenantLedger(Metrics* metrics) : metrics_(metrics) {}
  // The tenant's account, with its quota set to `quota`.
  std::shared_ptr<TenantAccount> Account(const std::string& tenant, const Quota& quota);

 private:
  Metrics* const metrics_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<TenantAccount>> accounts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::server
