#pragma once
// Where a remote session opens when the client's target names several komputed daemons: each
// daemon is asked for its devices (ListDevices, all at once, within a short deadline), and the
// session goes to the device with the most free memory (memory_bytes - memory_in_use_bytes),
// then the fewest sessions, among those that the user's choice allows (KOMPUTED_DEVICE,
// KOMPUTED_SELECT); lost devices and daemons that do not answer are skipped. Shared by the kp
// remote backend and komputectl.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "komputed/v1/komputed.pb.h"
#include "remote/credentials.h"
#include "remote/target.h"

namespace kp::internal::remote {

// One condition of a selector: FIELD=VALUE (equal) or FIELD~VALUE (contains). Fields: `name`
// (the device's name, compared case-insensitively), `node` (the daemon's host: its IP address,
// or the name the target gave) and `address` (the daemon as Endpoint::name writes it,
// HOST:PORT).
struct SelectorTerm {
  enum class Field { kName, kNode, kAddress };
  Field field = Field::kName;
  bool contains = false;  // `~`; else `=`
  std::string value;
  std::string origin;  // where it was written, for messages: "KOMPUTED_SELECT", "KOMPUTED_DEVICE"

  std::string ToString() const;  // "name~H200"
};

// Every term must hold (comma-separated: `name~H200,node=10.0.0.5`).
struct Selector {
  std::vector<SelectorTerm> terms;
};

// Parses a selector; "" is the empty selector. kInvalidArgument naming `origin`, the term and
// what is wrong: a term without `=` or `~`, an unknown field, an empty value.
absl::StatusOr<Selector> ParseSelector(absl::string_view text, absl::string_view origin);

// KOMPUTED_DEVICE: "N" (device N; with several daemons, device N of the chosen one) or
// "HOST:PORT/N" (device N of that daemon, named as Endpoint::name writes it).
struct DeviceChoice {
  std::string daemon;  // empty: any
  uint32_t index = 0;
};
// kInvalidArgument naming `origin` and the text when it is neither form.
absl::StatusOr<DeviceChoice> ParseDeviceChoice(absl::string_view text, absl::string_view origin);

// What one daemon answered.
struct DaemonReport {
  Endpoint endpoint;
  absl::Status status;  // of its ListDevices call
  std::vector<komputed::v1::DeviceInfo> devices;
};

// Asks every daemon for its devices at once; each call ends within `timeout`. Channels are made
// with `credentials` (the certificate checked against Endpoint::tls_name where set). Reports come
// in the order of `endpoints`.
std::vector<DaemonReport> QueryDaemons(const std::vector<Endpoint>& endpoints,
                                       const ClientCredentials& credentials,
                                       absl::Duration timeout);

// A device to open a session on.
struct Placement {
  Endpoint daemon;
  uint32_t device_index = 0;
};

// What a session asks for.
struct PlacementRequest {
  std::string address;                   // the target: one daemon or several
  std::string address_origin;            // its name in messages: "KOMPUTED_ADDRESS"
  std::optional<uint32_t> device_index;  // unset: any (one daemon: its device 0)
  Selector selector;                     // daemon terms from KOMPUTED_DEVICE's HOST:PORT included
  absl::Duration timeout = absl::Seconds(2);  // for the ListDevices calls
};

// The daemons of `request.address` that the selector's `node` and `address` terms allow (none of
// them: kNotFound naming each daemon and the term that it fails).
absl::StatusOr<std::vector<Endpoint>> CandidateDaemons(const PlacementRequest& request,
                                                       const std::vector<Endpoint>& endpoints);

// The best devices among the reports: the most free memory, then the fewest sessions; several
// when they tie on both. Lost devices, devices other than `request.device_index` and those that
// the selector's `name` terms reject are skipped, as are daemons that did not answer. When none
// is left: kUnavailable when a daemon did not answer or a matching device is lost (trying again
// may succeed), else kNotFound; the message names every daemon and why each was passed over.
absl::StatusOr<std::vector<Placement>> BestDevices(const PlacementRequest& request,
                                                   const std::vector<DaemonReport>& reports);

// The whole decision: resolves the target, keeps the candidate daemons, and returns at once
// (no call) when one is left and nothing about its devices needs asking (the device index is
// given, or the target names one daemon, whose device 0 it is, and no `name` term is set);
// otherwise queries them (QueryDaemons) and takes BestDevices, one of a tie at random (so that
// clients starting together on an idle cluster spread out).
absl::StatusOr<Placement> Place(const PlacementRequest& request,
                                const ClientCredentials& credentials);

// $KOMPUTED_PLACEMENT_TIMEOUT_S seconds, default 2: the bound on each daemon's answer.
absl::Duration PlacementTimeout();

}  // namespace kp::internal::remote
