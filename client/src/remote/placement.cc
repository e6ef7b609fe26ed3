#include "remote/placement.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "komputed/v1/komputed.grpc.pb.h"

namespace kp::internal::remote {
namespace {

namespace v1 = komputed::v1;
using Field = SelectorTerm::Field;

constexpr char kSelectorForm[] =
    "FIELD=VALUE or FIELD~VALUE, comma-separated, FIELD one of name, node, address";

const char* FieldName(Field field) {
  switch (field) {
    case Field::kName:
      return "name";
    case Field::kNode:
      return "node";
    case Field::kAddress:
      return "address";
  }
  return "?";
}

bool Matches(const SelectorTerm& term, absl::string_view text) {
  if (!term.contains) return absl::EqualsIgnoreCase(text, term.value);
  return absl::StrContains(absl::AsciiStrToLower(text), absl::AsciiStrToLower(term.value));
}

// Whether the daemon's own terms (node, address) allow `daemon`; else the term it fails.
const SelectorTerm* DaemonMismatch(const Selector& selector, const Endpoint& daemon) {
  for (const SelectorTerm& t : selector.terms) {
    if (t.field == Field::kNode && !Matches(t, daemon.host)) return &t;
    if (t.field == Field::kAddress && !Matches(t, daemon.name)) return &t;
  }
  return nullptr;
}

std::string Describe(const SelectorTerm& term) {
  return absl::StrCat(term.ToString(), " (", term.origin, ")");
}

std::string DeviceName(const v1::DeviceInfo& d) {
  return absl::StrCat("device ", d.index(), " (", d.name(), ")");
}

uint64_t FreeBytes(const v1::DeviceInfo& d) {
  return d.memory_bytes() > d.memory_in_use_bytes() ? d.memory_bytes() - d.memory_in_use_bytes()
                                                    : 0;
}

bool Transient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

// What was asked for, for messages: "device 1, name~H200 (KOMPUTED_SELECT)".
std::string Wanted(const PlacementRequest& request) {
  std::vector<std::string> parts;
  if (request.device_index.has_value())
    parts.push_back(absl::StrCat("device ", *request.device_index));
  for (const SelectorTerm& t : request.selector.terms) parts.push_back(Describe(t));
  return parts.empty() ? "a live device" : absl::StrJoin(parts, ", ");
}

std::string TargetName(const PlacementRequest& request) {
  return request.address_origin.empty()
             ? absl::StrCat("'", request.address, "'")
             : absl::StrCat(request.address_origin, "=", request.address);
}

}  // namespace

std::string SelectorTerm::ToString() const {
  return absl::StrCat(FieldName(field), contains ? "~" : "=", value);
}

absl::StatusOr<Selector> ParseSelector(absl::string_view text, absl::string_view origin) {
  Selector selector;
  if (absl::StripAsciiWhitespace(text).empty()) return selector;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view term = absl::StripAsciiWhitespace(raw);
    const size_t op = term.find_first_of("=~");
    if (term.empty() || op == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": '", text, "' has ",
                       term.empty() ? "an empty term" : absl::StrCat("the term '", term, "'"),
                       " without '=' or '~' (", kSelectorForm, "; e.g. name~H200)"));
    }
    SelectorTerm t;
    t.origin = std::string(origin);
    t.contains = term[op] == '~';
    const std::string field = absl::AsciiStrToLower(absl::StripAsciiWhitespace(term.substr(0, op)));
    if (field == "name") {
      t.field = Field::kName;
    } else if (field == "node") {
      t.field = Field::kNode;
    } else if (field == "address") {
      t.field = Field::kAddress;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": '", text, "' selects by '", field,
                                                     "', which is not a field (", kSelectorForm,
                                                     ")"));
    }
    t.value = std::string(absl::StripAsciiWhitespace(term.substr(op + 1)));
    if (t.value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": '", text, "' gives no value for '",
                                                     field, "' (", kSelectorForm, ")"));
    }
    selector.terms.push_back(std::move(t));
  }
  return selector;
}

absl::StatusOr<DeviceChoice> ParseDeviceChoice(absl::string_view text, absl::string_view origin) {
  DeviceChoice choice;
  absl::string_view index = text;
  if (const size_t slash = text.rfind('/'); slash != absl::string_view::npos) {
    choice.daemon = std::string(text.substr(0, slash));
    index = text.substr(slash + 1);
  }
  const bool digits = !index.empty() && std::all_of(index.begin(), index.end(),
                                                    [](char c) { return absl::ascii_isdigit(c); });
  if (!digits || !absl::SimpleAtoi(index, &choice.index) ||
      (text.find('/') != absl::string_view::npos && choice.daemon.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": '", text, "' is not a device index (N) or a daemon's device (HOST:PORT/N)"));
  }
  return choice;
}

std::vector<DaemonReport> QueryDaemons(const std::vector<Endpoint>& endpoints,
                                       const ClientCredentials& credentials,
                                       absl::Duration timeout) {
  struct Call {
    std::unique_ptr<v1::Devices::Stub> stub;
    grpc::ClientContext context;
    v1::ListDevicesResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::ListDevicesResponse>> reader;
    bool done = false;
  };
  const absl::Time deadline = absl::Now() + timeout;
  grpc::CompletionQueue queue;
  std::vector<std::unique_ptr<Call>> calls;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    // A connection of its own, closed with the channel: the session's is made afresh.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto call = std::make_unique<Call>();
    call->stub = v1::Devices::NewStub(
        credentials.CreateChannel(endpoints[i].target, args, endpoints[i].tls_name));
    call->context.set_deadline(absl::ToChronoTime(deadline));
    call->reader = call->stub->AsyncListDevices(&call->context, v1::ListDevicesRequest(), &queue);
    call->reader->Finish(&call->response, &call->status, reinterpret_cast<void*>(i));
    calls.push_back(std::move(call));
  }
  // Every call ends by its deadline; past it (and a margin), the stragglers are cancelled, which
  // ends them at once.
  size_t pending = calls.size();
  bool cancelled = false;
  while (pending > 0) {
    void* tag = nullptr;
    bool ok = false;
    const auto wait_until = absl::ToChronoTime(cancelled ? absl::Now() + absl::Seconds(5)
                                                         : deadline + absl::Seconds(1));
    const grpc::CompletionQueue::NextStatus next = queue.AsyncNext(&tag, &ok, wait_until);
    if (next == grpc::CompletionQueue::GOT_EVENT) {
      calls[reinterpret_cast<size_t>(tag)]->done = true;
      --pending;
    } else if (next == grpc::CompletionQueue::TIMEOUT && !cancelled) {
      for (auto& c : calls) {
        if (!c->done) c->context.TryCancel();
      }
      cancelled = true;
    } else {
      break;
    }
  }
  // The queue is drained before it and the calls go (a cancelled call still completes).
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) calls[reinterpret_cast<size_t>(tag)]->done = true;
  std::vector<DaemonReport> reports;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    DaemonReport r;
    r.endpoint = endpoints[i];
    const Call& c = *calls[i];
    if (!c.status.ok()) {
      r.status = FromGrpcStatusWithHint(c.status, "", &credentials);
    } else {
      r.devices.assign(c.response.devices().begin(), c.response.devices().end());
    }
    reports.push_back(std::move(r));
  }
  return reports;
}

absl::StatusOr<std::vector<Endpoint>> CandidateDaemons(const PlacementRequest& request,
                                                       const std::vector<Endpoint>& endpoints) {
  std::vector<Endpoint> out;
  std::vector<std::string> rejected;
  for (const Endpoint& e : endpoints) {
    if (const SelectorTerm* t = DaemonMismatch(request.selector, e); t != nullptr) {
      rejected.push_back(absl::StrCat(e.name, " is not ", t->ToString()));
    } else {
      out.push_back(e);
    }
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat("no komputed daemon of ", TargetName(request),
                                            " matches ", Wanted(request), ": ",
                                            absl::StrJoin(rejected, "; ")));
  }
  return out;
}

absl::StatusOr<std::vector<Placement>> BestDevices(const PlacementRequest& request,
                                                   const std::vector<DaemonReport>& reports) {
  struct Candidate {
    const DaemonReport* report;
    const v1::DeviceInfo* device;
  };
  std::vector<Candidate> candidates;
  std::vector<std::string> rejected;
  bool transient = false;
  bool all_failed = !reports.empty();
  std::optional<absl::StatusCode> failure_code;
  bool one_failure_code = true;
  for (const DaemonReport& r : reports) {
    if (!r.status.ok()) {
      rejected.push_back(absl::StrCat(r.endpoint.name, ": did not answer (",
                                      absl::StatusCodeToString(r.status.code()), ": ",
                                      r.status.message(), ")"));
      transient = transient || Transient(r.status.code());
      if (failure_code.has_value() && *failure_code != r.status.code()) one_failure_code = false;
      failure_code = r.status.code();
      continue;
    }
    all_failed = false;
    std::vector<std::string> why;
    bool has_index = !request.device_index.has_value();
    for (const v1::DeviceInfo& d : r.devices) {
      if (request.device_index.has_value() && d.index() != *request.device_index) continue;
      has_index = true;
      const SelectorTerm* mismatch = nullptr;
      for (const SelectorTerm& t : request.selector.terms) {
        if (t.field == Field::kName && !Matches(t, d.name())) {
          mismatch = &t;
          break;
        }
      }
      if (mismatch != nullptr) {
        why.push_back(absl::StrCat(DeviceName(d), " is not ", mismatch->ToString()));
      } else if (d.lost()) {
        why.push_back(absl::StrCat(DeviceName(d), " is lost (the daemon is opening it again)"));
        transient = true;
      } else {
        candidates.push_back({&r, &d});
      }
    }
    if (r.devices.empty()) {
      why.push_back("serves no device");
    } else if (!has_index) {
      std::vector<uint32_t> indices;
      for (const v1::DeviceInfo& d : r.devices) indices.push_back(d.index());
      why.push_back(absl::StrCat("has no device ", *request.device_index,
                                 " (its devices: ", absl::StrJoin(indices, ", "), ")"));
    }
    if (!why.empty())
      rejected.push_back(absl::StrCat(r.endpoint.name, ": ", absl::StrJoin(why, ", ")));
  }
  if (candidates.empty()) {
    const std::string details = absl::StrJoin(rejected, "; ");
    if (all_failed) {
      const std::string message =
          absl::StrCat("none of the komputed daemons of ", TargetName(request), " answered within ",
                       absl::FormatDuration(request.timeout), ": ", details);
      return absl::Status(one_failure_code && failure_code.has_value()
                              ? *failure_code
                              : absl::StatusCode::kUnavailable,
                          message);
    }
    const std::string message =
        absl::StrCat("no device of the komputed daemons of ", TargetName(request), " is ",
                     Wanted(request), ": ", details);
    return transient ? absl::UnavailableError(message) : absl::NotFoundError(message);
  }
  const auto better = [](const Candidate& a, const Candidate& b) {
    const uint64_t fa = FreeBytes(*a.device), fb = FreeBytes(*b.device);
    if (fa != fb) return fa > fb;
    return a.device->sessions() < b.device->sessions();
  };
  std::stable_sort(candidates.begin(), candidates.end(), better);
  std::vector<Placement> best;
  for (const Candidate& c : candidates) {
    if (better(candidates.front(), c)) break;
    best.push_back({c.report->endpoint, c.device->index()});
  }
  return best;
}

absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                const ClientCredentials& credentials) {
  absl::StatusOr<std::vector<Endpoint>> endpoints = ResolveTarget(request.address);
  if (!endpoints.ok()) {
    return absl::Status(
        endpoints.status().code(),
        request.address_origin.empty()
            ? endpoints.status().message()
            : absl::StrCat(request.address_origin, ": ", endpoints.status().message()));
  }
  absl::StatusOr<std::vector<Endpoint>> daemons = CandidateDaemons(request, *endpoints);
  if (!daemons.ok()) return daemons.status();
  const bool by_name = std::any_of(request.selector.terms.begin(), request.selector.terms.end(),
                                   [](const SelectorTerm& t) { return t.field == Field::kName; });
  if (daemons->size() == 1 && !by_name &&
      (request.device_index.has_value() || endpoints->size() == 1)) {
    return Placement{daemons->front(), request.device_index.value_or(0)};
  }
  absl::StatusOr<std::vector<Placement>> best =
      BestDevices(request, QueryDaemons(*daemons, credentials, request.timeout));
  if (!best.ok()) return best.status();
  if (best->size() == 1) return best->front();
  thread_local std::mt19937 random{std::random_device{}()};
  return (*best)[std::uniform_int_distribution<size_t>(0, best->size() - 1)(random)];
}

absl::Duration PlacementTimeout() {
  static const absl::Duration timeout = [] {
    const char* value = std::getenv("KOMPUTED_PLACEMENT_TIMEOUT_S");
    const double seconds = value != nullptr ? std::atof(value) : 0;
    return seconds > 0 ? absl::Seconds(seconds) : absl::Seconds(2);
  }();
  return timeout;
}

}  // namespace kp::internal::remote
