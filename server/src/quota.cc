#include "quota.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace komputed::server {
namespace {

uint64_t Quota::*FieldOf(Counted what) {
  switch (what) {
    case Counted::kSessions:
      return &Quota::sessions;
    case Counted::kDeviceMemory:
      return &Quota::device_memory_bytes;
    case Counted::kHostMemory:
      return &Quota::host_memory_bytes;
    case Counted::kSubmissions:
      return &Quota::inflight_submissions;
  }
  return &Quota::sessions;
}

// Whether `wanted` more fits beside `in_use` under `limit` (0: no limit), without overflow.
bool Fits(uint64_t limit, uint64_t in_use, uint64_t wanted) {
  return limit == 0 || (wanted <= limit && in_use <= limit - wanted);
}

absl::string_view NameOf(uint64_t Quota::*field) {
  for (const QuotaField& f : QuotaFields()) {
    if (f.field == field) return f.name;
  }
  return "unknown";
}

}  // namespace

Charge& Charge::operator=(Charge&& other) noexcept {
  if (this != &other) {
    Release();
    account_ = std::move(other.account_);
    what_ = other.what_;
    amount_ = std::exchange(other.amount_, 0);
  }
  return *this;
}

void Charge::Release() {
  if (account_ != nullptr && amount_ > 0) account_->Give(what_, amount_);
  account_.reset();
  amount_ = 0;
}

TenantAccount::TenantAccount(std::string tenant, Quota quota, Metrics* metrics)
    : tenant_(std::move(tenant)), metrics_(metrics), quota_(quota) {}

Quota TenantAccount::quota() const {
  absl::MutexLock lock(&mu_);
  return quota_;
}

void TenantAccount::set_quota(const Quota& quota) {
  absl::MutexLock lock(&mu_);
  quota_ = quota;
}

absl::Status TenantAccount::Refuse(absl::string_view quota, uint64_t limit,
                                   absl::string_view detail) const {
  if (metrics_ != nullptr) metrics_->quota_refusals_total(quota).Increment();
  return absl::ResourceExhaustedError(absl::StrCat("quota ", quota, " of tenant ", tenant_,
                                                   " exceeded: limit ", limit, ", ", detail));
}

absl::StatusOr<Charge> TenantAccount::Take(Counted what, uint64_t amount) {
  if (amount == 0) return Charge();
  const size_t i = static_cast<size_t>(what);
  uint64_t limit = 0;
  uint64_t in_use = 0;
  bool taken = false;
  {
    absl::MutexLock lock(&mu_);
    limit = quota_.*FieldOf(what);
    in_use = used_[i];
    if (Fits(limit, in_use, amount)) {
      in_use = used_[i] += amount;
      taken = true;
    }
  }
  if (!taken) {
    return Refuse(NameOf(FieldOf(what)), limit,
                  absl::StrCat("in use ", in_use, ", this request needs ", amount));
  }
  Publish(what, in_use);
  return Charge(shared_from_this(), what, amount);
}

void TenantAccount::Give(Counted what, uint64_t amount) {
  const size_t i = static_cast<size_t>(what);
  uint64_t now = 0;
  {
    absl::MutexLock lock(&mu_);
    used_[i] = used_[i] >= amount ? used_[i] - amount : 0;
    now = used_[i];
  }
  Publish(what, now);
}

void TenantAccount::CountError(const absl::Status& status) const {
  if (status.ok() || metrics_ == nullptr) return;
  metrics_->tenant_errors_total(tenant_, CodeLabel(static_cast<int>(status.code()))).Increment();
}

uint64_t TenantAccount::used(Counted what) const {
  absl::MutexLock lock(&mu_);
  return used_[static_cast<size_t>(what)];
}

void TenantAccount::Publish(Counted what, uint64_t value) {
  if (metrics_ == nullptr) return;
  const double v = static_cast<double>(value);
  switch (what) {
    case Counted::kSessions:
      metrics_->tenant_sessions_open(tenant_).Set(v);
      break;
    case Counted::kDeviceMemory:
      metrics_->tenant_memory_used_bytes(tenant_, "device").Set(v);
      break;
    case Counted::kHostMemory:
      metrics_->tenant_memory_used_bytes(tenant_, "host").Set(v);
      break;
    case Counted::kSubmissions:
      metrics_->tenant_submissions_in_flight(tenant_).Set(v);
      break;
  }
}

uint64_t TenantAccount::Limit(uint64_t Quota::*field) const {
  absl::MutexLock lock(&mu_);
  return quota_.*field;
}

absl::Status TenantAccount::CheckSize(uint64_t Quota::*field, uint64_t value,
                                      absl::string_view what) const {
  const uint64_t limit = Limit(field);
  if (Fits(limit, 0, value)) return absl::OkStatus();
  return Refuse(NameOf(field), limit, what);
}

absl::Status TenantAccount::CheckCount(uint64_t Quota::*field, uint64_t in_use, uint64_t wanted,
                                       absl::string_view what) const {
  const uint64_t limit = Limit(field);
  if (Fits(limit, in_use, wanted)) return absl::OkStatus();
  return Refuse(NameOf(field), limit,
                absl::StrCat(what, ": in use ", in_use, ", this request needs ", wanted));
}

std::shared_ptr<TenantAccount> TenantLedger::Account(const std::string& tenant,
                                                     const Quota& quota) {
  std::shared_ptr<TenantAccount> account;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<TenantAccount>& slot = accounts_[tenant];
    if (slot == nullptr) slot = std::make_shared<TenantAccount>(tenant, quota, metrics_);
    account = slot;
  }
  account->set_quota(quota);
  return account;
}

}  // namespace komputed::server
