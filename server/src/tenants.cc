#include "tenants.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace komputed::server {
namespace {

absl::Status Bad(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tenants file: ", where, ": ", what));
}

absl::StatusOr<uint64_t> Count(const YAML::Node& node, absl::string_view where) {
  if (!node.IsScalar()) return Bad(where, "must be a non-negative integer");
  const std::string& text = node.Scalar();
  uint64_t value = 0;
  if (text.empty() || text.size() > 20 || !absl::c_all_of(text, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(text, &value)) {
    return Bad(where, absl::StrCat("must be a non-negative integer, not \"", text, "\""));
  }
  return value;
}

absl::StatusOr<Quota> ParseQuota(const YAML::Node& node, const Quota& defaults,
                                 absl::string_view tenant) {
  Quota quota = defaults;
  if (!node) return quota;
  const std::string where = absl::StrCat("tenant ", tenant, ": quota");
  if (!node.IsMap()) return Bad(where, "must be a map of quota names to limits");
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const QuotaField* field = nullptr;
    for (const QuotaField& f : QuotaFields()) {
      if (f.name == key) field = &f;
    }
    if (field == nullptr) {
      std::vector<std::string> names;
      for (const QuotaField& f : QuotaFields()) names.emplace_back(f.name);
      return Bad(where, absl::StrCat("unknown quota \"", key,
                                     "\" (known: ", absl::StrJoin(names, ", "), ")"));
    }
    absl::StatusOr<uint64_t> value = Count(entry.second, absl::StrCat(where, ".", key));
    if (!value.ok()) return value.status();
    quota.*(field->field) = *value;
  }
  return quota;
}

absl::StatusOr<std::vector<Tenant>> ParseTenantsNode(const YAML::Node& root,
                                                     const Quota& defaults) {
  if (!root.IsMap() || !root["tenants"]) return Bad("top level", "needs a \"tenants\" list");
  for (const auto& entry : root) {
    if (entry.first.as<std::string>() != "tenants") {
      return Bad("top level",
                 absl::StrCat("unknown field \"", entry.first.as<std::string>(), "\""));
    }
  }
  const YAML::Node list = root["tenants"];
  if (!list.IsSequence()) return Bad("tenants", "must be a list");
  std::vector<Tenant> tenants;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> tokens;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node node = list[i];
    const std::string at = absl::StrCat("tenant #", i + 1);
    if (!node.IsMap()) return Bad(at, "must be a map");
    Tenant t;
    if (!node["name"] || !node["name"].IsScalar() || node["name"].Scalar().empty()) {
      return Bad(at, "needs a name");
    }
    t.name = node["name"].Scalar();
    if (t.name.size() > 63 || !absl::c_all_of(t.name, [](char c) {
          return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
        })) {
      return Bad(at, absl::StrCat("name \"", t.name,
                                  "\" must be 1 to 63 letters, digits, '-', '_' or '.'"));
    }
    const std::string where = absl::StrCat("tenant ", t.name);
    for (const auto& field : node) {
      const std::string key = field.first.as<std::string>();
      if (key != "name" && key != "token_sha256" && key != "certificate_names" && key != "admin" &&
          key != "quota") {
        return Bad(where, absl::StrCat("unknown field \"", key, "\""));
      }
    }
    if (!names.insert(t.name).second) return Bad(where, "is listed twice");
    if (const YAML::Node token = node["token_sha256"]) {
      std::vector<YAML::Node> hashes;
      if (token.IsSequence()) {
        if (token.size() == 0 || token.size() > 8) {
          return Bad(where, "token_sha256 must list 1 to 8 hashes");
        }
        for (const auto& h : token) hashes.push_back(h);
      } else {
        hashes.push_back(token);
      }
      for (const YAML::Node& h : hashes) {
        const std::string hex = absl::AsciiStrToLower(h.IsScalar() ? h.Scalar() : "");
        if (hex.size() != 64 || !absl::c_all_of(hex, absl::ascii_isxdigit)) {
          return Bad(where,
                     "token_sha256 must be 64 hex digits (sha256sum of the token), or a list "
                     "of them");
        }
        if (!tokens.insert(hex).second) {
          return Bad(where, "has a token that is listed already (for it or another tenant)");
        }
        const std::string bytes = absl::HexStringToBytes(hex);
        std::array<uint8_t, 32>& digest = t.token_sha256.emplace_back();
        std::copy(bytes.begin(), bytes.end(), digest.begin());
      }
      t.has_token = true;
    }
    if (const YAML::Node certs = node["certificate_names"]) {
      if (!certs.IsSequence()) return Bad(where, "certificate_names must be a list");
      for (const auto& c : certs) {
        if (!c.IsScalar() || c.Scalar().empty()) {
          return Bad(where, "certificate_names must be non-empty strings");
        }
        t.certificate_names.push_back(c.Scalar());
      }
    }
    if (!t.has_token && t.certificate_names.empty()) {
      // Under mTLS the tenant's own name may be the certificate's CN.
      t.certificate_names.push_back(t.name);
    }
    if (const YAML::Node admin = node["admin"]) {
      if (!admin.IsScalar() || (admin.Scalar() != "true" && admin.Scalar() != "false")) {
        return Bad(where, "admin must be true or false");
      }
      t.admin = admin.Scalar() == "true";
    }
    absl::StatusOr<Quota> quota = ParseQuota(node["quota"], defaults, t.name);
    if (!quota.ok()) return quota.status();
    t.quota = *quota;
    tenants.push_back(std::move(t));
  }
  // A certificate name identifies one tenant only.
  absl::flat_hash_map<std::string, std::string> identities;
  for (const Tenant& t : tenants) identities.emplace(t.name, t.name);
  for (const Tenant& t : tenants) {
    for (const std::string& name : t.certificate_names) {
      auto [it, added] = identities.emplace(name, t.name);
      if (!added && it->second != t.name) {
        return Bad(
            absl::StrCat("tenant ", t.name),
            absl::StrCat("certificate name \"", name, "\" already names tenant ", it->second));
      }
    }
  }
  return tenants;
}

}  // namespace

const std::vector<QuotaField>& QuotaFields() {
  static const auto* fields = new std::vector<QuotaField>{
      {"device_memory_bytes", &Quota::device_memory_bytes},
      {"host_memory_bytes", &Quota::host_memory_bytes},
      {"sessions", &Quota::sessions},
      {"objects_per_session", &Quota::objects_per_session},
      {"inflight_submissions", &Quota::inflight_submissions},
      {"ops_per_sequence", &Quota::ops_per_sequence},
      {"tensor_bytes", &Quota::tensor_bytes},
      {"dispatch_invocations", &Quota::dispatch_invocations},
      {"source_bytes", &Quota::source_bytes},
      {"client_name_bytes", &Quota::client_name_bytes},
      {"kernel_time_ms", &Quota::kernel_time_ms},
  };
  return *fields;
}

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  // Fetched once: EVP_sha256() makes every digest look the algorithm up again in OpenSSL 3's
  // provider store, under its lock, which costs more than hashing a token (this runs on every
  // call that carries one). Kept for the life of the process.
  static EVP_MD* const kSha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  std::array<uint8_t, 32> digest{};
  unsigned int size = 0;
  const EVP_MD* md = kSha256 != nullptr ? kSha256 : EVP_sha256();
  EVP_Digest(data.data(), data.size(), digest.data(), &size, md, nullptr);
  return digest;
}

std::string HexDigest(const std::array<uint8_t, 32>& digest) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

absl::StatusOr<std::vector<Tenant>> ParseTenants(absl::string_view yaml, const Quota& defaults) {
  try {
    return ParseTenantsNode(YAML::Load(std::string(yaml)), defaults);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tenants file: ", e.what()));
  }
}

TenantRegistry::TenantRegistry(std::string path, Quota defaults)
    : path_(std::move(path)), defaults_(defaults), set_(std::make_shared<Set>()) {}

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Create(std::string path,
                                                                       Quota defaults) {
  auto registry = std::unique_ptr<TenantRegistry>(new TenantRegistry(std::move(path), defaults));
  if (absl::Status s = registry->Reload(); !s.ok()) return s;
  return registry;
}

TenantRegistry::FileStamp TenantRegistry::Stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size), static_cast<uint64_t>(st.st_ino)};
}

absl::Status TenantRegistry::Reload() {
  absl::MutexLock reload(&reload_mu_);
  const FileStamp stamp = Stamp(path_);
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    absl::MutexLock lock(&mu_);
    stamp_ = stamp;  // reported once per change, not on every poll
    return absl::NotFoundError(absl::StrCat("tenants file ", path_, " cannot be read"));
  }
  constexpr std::streamsize kMaxBytes = 4 << 20;
  std::string text(static_cast<size_t>(kMaxBytes) + 1, '\0');
  in.read(text.data(), kMaxBytes + 1);
  text.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<std::vector<Tenant>> parsed =
      text.size() > static_cast<size_t>(kMaxBytes)
          ? absl::InvalidArgumentError(
                absl::StrCat("tenants file ", path_, " is larger than 4 MiB"))
          : ParseTenants(text, defaults_);
  absl::MutexLock lock(&mu_);
  stamp_ = stamp;
  if (!parsed.ok()) return parsed.status();
  auto set = std::make_shared<Set>();
  for (Tenant& t : *parsed) {
    auto tenant = std::make_shared<const Tenant>(std::move(t));
    set->tenants.push_back(tenant);
    // Only certificate names: a certificate naming a tenant known by token (an admin, say) does
    // not stand in for its token. (A tenant with neither has its own name among them.)
    for (const std::string& name : tenant->certificate_names) set->by_name.emplace(name, tenant);
  }
  set_ = std::move(set);
  ++generation_;
  return absl::OkStatus();
}

bool TenantRegistry::Poll() {
  {
    absl::MutexLock lock(&mu_);
    if (Stamp(path_) == stamp_) return false;
  }
  absl::Status s = Reload();
  if (s.ok()) {
    spdlog::info("tenants file {} changed: {} tenant(s) now", path_, Names().size());
  } else {
    spdlog::error("tenants file {} changed but was not applied (the tenants in force stay): {}",
                  path_, std::string(s.message()));
  }
  return true;
}

std::shared_ptr<const Tenant> TenantRegistry::ByToken(absl::string_view token) const {
  std::shared_ptr<const Set> set;
  {
    absl::MutexLock lock(&mu_);
    set = set_;
  }
  const std::array<uint8_t, 32> digest = Sha256(token);
  std::shared_ptr<const Tenant> found;
  // Every tenant is compared, in constant time, so that the time taken says nothing of which.
  for (const auto& t : set->tenants) {
    for (const std::array<uint8_t, 32>& hash : t->token_sha256) {
      if (CRYPTO_memcmp(hash.data(), digest.data(), digest.size()) == 0) found = t;
    }
  }
  return found;
}

std::shared_ptr<const Tenant> TenantRegistry::ByName(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = set_->by_name.find(name);
  return it == set_->by_name.end() ? nullptr : it->second;
}

std::vector<std::string> TenantRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& t : set_->tenants) names.push_back(t->name);
  return names;
}

uint64_t TenantRegistry::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace komputed::server
