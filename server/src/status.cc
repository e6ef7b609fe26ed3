#include "status.h"

#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace komputed::server {

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

spdlog::level::level_enum LogLevelFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return spdlog::level::off;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return spdlog::level::warn;
    case absl::StatusCode::kUnavailable:
      // A refusal while draining is expected (WorkGate::Refusal); a lost device is not.
      return absl::StartsWith(status.message(), "komputed is draining") ? spdlog::level::debug
                                                                        : spdlog::level::warn;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return spdlog::level::err;
    default:
      return spdlog::level::debug;
  }
}

std::string SessionLogName(absl::string_view id) { return std::string(id.substr(0, 8)); }

void LogFailure(absl::string_view method, absl::string_view session_id, absl::string_view peer,
                const absl::Status& status) {
  const spdlog::level::level_enum level = LogLevelFor(status);
  if (level == spdlog::level::off || !spdlog::should_log(level)) return;
  const std::string code = absl::StatusCodeToString(status.code());
  const std::string message(status.message());
  if (!session_id.empty()) {
    spdlog::log(level, "{} failed in session {}: {}: {}", std::string(method),
                SessionLogName(session_id), code, message);
  } else {
    spdlog::log(level, "{} failed ({}): {}: {}", std::string(method),
                peer.empty() ? std::string("no session") : std::string(peer), code, message);
  }
}

}  // namespace komputed::server
