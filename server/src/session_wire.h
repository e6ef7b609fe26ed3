#pragma once
// The service edge's conversions: the wire's requests into the session's own terms
// (session_requests.h, eval.h) and its results back into the wire's responses. Operations and
// enums go through the one converter, v1::wire::FromWire (komputed/v1/semantics_wire.h); what is
// left here is the wire's own shape (proto3 defaults, oneofs, a command's session_id).

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "device_pool.h"
#include "eval.h"
#include "komputed/v1/komputed.pb.h"
#include "session_manager.h"
#include "session_requests.h"

namespace komputed::server::wire {

// INVALID_ARGUMENT ("tensor 7: unknown element type 17") for an enum value the daemon lacks.
absl::StatusOr<TensorRequest> FromWire(const v1::CreateTensorRequest& request);
AlgorithmRequest FromWire(const v1::CreateAlgorithmRequest& request);
PushConstantsRequest FromWire(const v1::SetPushConstantsRequest& request);
SequenceRequest FromWire(const v1::CreateSequenceRequest& request);
// INVALID_ARGUMENT for an empty action or operation.
absl::StatusOr<RecordRequest> FromWire(const v1::RecordRequest& request);
OpenRequest FromWire(const v1::OpenSessionRequest& request, std::string peer);
// An eval of the session `session_id`. A command that cannot be read (or that names another
// session) is kept as its error, reported when its turn comes. The plan refers to `request`.
EvalPlan FromWire(const v1::EvalRequest& request, absl::string_view session_id);

void ToWire(EvalResult result, v1::EvalResponse* response);
void ToWire(const SessionSummary& summary, v1::SessionInfo* info);
// What ListDevices and OpenSession report about a device.
void ToWire(const PooledDevice& device, v1::DeviceInfo* info);

}  // namespace komputed::server::wire
