#include "session_wire.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "komputed/v1/semantics_wire.h"
#include "status.h"

namespace komputed::server::wire {
namespace {

// The longest bound an eval may ask for (keeps the arithmetic in range).
constexpr uint64_t kMaxTimeoutMs = uint64_t{10} * 24 * 3600 * 1000;

std::vector<uint8_t> Bytes(const std::string& data) {
  return std::vector<uint8_t>(data.begin(), data.end());
}

std::vector<uint64_t> Handles(const google::protobuf::RepeatedField<uint64_t>& handles) {
  return {handles.begin(), handles.end()};
}

uint64_t Milliseconds(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(d)));
}

// "create_tensor 7": the command and the handle it acts on.
std::string CommandName(const v1::Command& command) {
  switch (command.command_case()) {
    case v1::Command::kCreateTensor:
      return absl::StrCat("create_tensor ", command.create_tensor().handle());
    case v1::Command::kDestroyTensor:
      return absl::StrCat("destroy_tensor ", command.destroy_tensor().handle());
    case v1::Command::kCreateAlgorithm:
      return absl::StrCat("create_algorithm ", command.create_algorithm().handle());
    case v1::Command::kRebuildAlgorithm:
      return absl::StrCat("rebuild_algorithm ", command.rebuild_algorithm().handle());
    case v1::Command::kSetPushConstants:
      return absl::StrCat("set_push_constants ", command.set_push_constants().handle());
    case v1::Command::kDestroyAlgorithm:
      return absl::StrCat("destroy_algorithm ", command.destroy_algorithm().handle());
    case v1::Command::kCreateSequence:
      return absl::StrCat("create_sequence ", command.create_sequence().handle());
    case v1::Command::kRecord:
      return absl::StrCat("record ", command.record().sequence());
    case v1::Command::kDestroySequence:
      return absl::StrCat("destroy_sequence ", command.destroy_sequence().handle());
    case v1::Command::COMMAND_NOT_SET:
      break;
  }
  return "empty";
}

// A command's own session_id may be empty; when given it must be the eval's session.
absl::Status CheckSession(const std::string& named, absl::string_view session_id) {
  if (!named.empty() && named != session_id) {
    return absl::InvalidArgumentError(absl::StrCat("the command names session ", named,
                                                   ", but the eval runs in session ", session_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionCommand> CommandFromWire(const v1::Command& command,
                                               absl::string_view session_id) {
  switch (command.command_case()) {
    case v1::Command::kCreateTensor: {
      KD_RETURN_IF_ERROR(CheckSession(command.create_tensor().session_id(), session_id));
      KD_ASSIGN_OR_RETURN(TensorRequest tensor, FromWire(command.create_tensor()));
      return SessionCommand(tensor);
    }
    case v1::Command::kDestroyTensor:
      KD_RETURN_IF_ERROR(CheckSession(command.destroy_tensor().session_id(), session_id));
      return SessionCommand(DestroyTensor{command.destroy_tensor().handle()});
    case v1::Command::kCreateAlgorithm:
      KD_RETURN_IF_ERROR(CheckSession(command.create_algorithm().session_id(), session_id));
      return SessionCommand(FromWire(command.create_algorithm()));
    case v1::Command::kRebuildAlgorithm:
      KD_RETURN_IF_ERROR(CheckSession(command.rebuild_algorithm().session_id(), session_id));
      return SessionCommand(RebuildAlgorithm{FromWire(command.rebuild_algorithm())});
    case v1::Command::kSetPushConstants:
      KD_RETURN_IF_ERROR(CheckSession(command.set_push_constants().session_id(), session_id));
      return SessionCommand(FromWire(command.set_push_constants()));
    case v1::Command::kDestroyAlgorithm:
      KD_RETURN_IF_ERROR(CheckSession(command.destroy_algorithm().session_id(), session_id));
      return SessionCommand(DestroyAlgorithm{command.destroy_algorithm().handle()});
    case v1::Command::kCreateSequence:
      KD_RETURN_IF_ERROR(CheckSession(command.create_sequence().session_id(), session_id));
      return SessionCommand(FromWire(command.create_sequence()));
    case v1::Command::kRecord: {
      KD_RETURN_IF_ERROR(CheckSession(command.record().session_id(), session_id));
      KD_ASSIGN_OR_RETURN(RecordRequest record, FromWire(command.record()));
      return SessionCommand(std::move(record));
    }
    case v1::Command::kDestroySequence:
      KD_RETURN_IF_ERROR(CheckSession(command.destroy_sequence().session_id(), session_id));
      return SessionCommand(DestroySequence{command.destroy_sequence().handle()});
    case v1::Command::COMMAND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the command is empty (set one of its fields)");
}

}  // namespace

absl::StatusOr<TensorRequest> FromWire(const v1::CreateTensorRequest& request) {
  const std::string what = absl::StrCat("tensor ", request.handle(), ": ");
  TensorRequest tensor;
  tensor.handle = request.handle();
  absl::StatusOr<core::ElementType> type = v1::wire::FromWire(request.element_type());
  if (!type.ok()) return Annotate(type.status(), what);
  tensor.type = *type;
  absl::StatusOr<core::MemoryType> memory = v1::wire::FromWire(request.memory_type());
  if (!memory.ok()) return Annotate(memory.status(), what);
  tensor.memory = *memory;
  tensor.count = request.count();
  tensor.element_size = request.element_size();
  tensor.data = request.data();
  tensor.shared_memory = request.shared_memory();
  if (request.has_image()) {
    tensor.image = {request.image().width(), request.image().height(), request.image().channels()};
    KD_RETURN_IF_ERROR(
        Annotate(core::CheckImageShape(tensor.type, tensor.memory, tensor.image), what));
    if (tensor.count != 0 && tensor.count != tensor.image.count()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "count ", tensor.count, " is not the image's ", tensor.image.width,
                       "x", tensor.image.height, "x", tensor.image.channels, " = ",
                       tensor.image.count(), " elements (give 0 or that)"));
    }
    tensor.count = tensor.image.count();
  }
  return tensor;
}

AlgorithmRequest FromWire(const v1::CreateAlgorithmRequest& request) {
  AlgorithmRequest algorithm;
  algorithm.handle = request.handle();
  algorithm.tensors = Handles(request.tensors());
  switch (request.shader_case()) {
    case v1::CreateAlgorithmRequest::kSpirv:
      algorithm.shader_kind = AlgorithmRequest::Shader::kSpirv;
      algorithm.shader = request.spirv();
      break;
    case v1::CreateAlgorithmRequest::kGlsl:
      algorithm.shader_kind = AlgorithmRequest::Shader::kGlsl;
      algorithm.shader = request.glsl();
      break;
    case v1::CreateAlgorithmRequest::SHADER_NOT_SET:
      algorithm.shader_kind = AlgorithmRequest::Shader::kNone;
      break;
  }
  algorithm.workgroup = {request.workgroup().x(), request.workgroup().y(), request.workgroup().z()};
  algorithm.spec_constants = Bytes(request.spec_constants());
  // proto3's 0 means "not given": 32-bit constants.
  algorithm.spec_constant_size =
      request.spec_constant_size() == 0 ? 4 : request.spec_constant_size();
  algorithm.push_constants = Bytes(request.push_constants());
  return algorithm;
}

PushConstantsRequest FromWire(const v1::SetPushConstantsRequest& request) {
  return {request.handle(), Bytes(request.push_constants())};
}

SequenceRequest FromWire(const v1::CreateSequenceRequest& request) {
  return {request.handle(), request.queue(), request.total_timestamps()};
}

absl::StatusOr<RecordRequest> FromWire(const v1::RecordRequest& request) {
  RecordRequest record;
  record.sequence = request.sequence();
  record.actions.reserve(request.actions_size());
  for (int i = 0; i < request.actions_size(); ++i) {
    const v1::SequenceAction& action = request.actions(i);
    SequenceAction converted;
    switch (action.action_case()) {
      case v1::SequenceAction::kRecord: {
        absl::StatusOr<HandleOp> op = v1::wire::FromWire(action.record());
        if (!op.ok()) {
          return Annotate(op.status(), absl::StrCat("record into sequence ", request.sequence(),
                                                    ": action ", i, ": "));
        }
        converted.kind = SequenceAction::Kind::kRecord;
        converted.op = *std::move(op);
        break;
      }
      case v1::SequenceAction::kClear:
        converted.kind =
            action.clear() ? SequenceAction::Kind::kClear : SequenceAction::Kind::kNothing;
        break;
      case v1::SequenceAction::kRerecord:
        converted.kind =
            action.rerecord() ? SequenceAction::Kind::kRerecord : SequenceAction::Kind::kNothing;
        break;
      case v1::SequenceAction::ACTION_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrCat("record into sequence ", request.sequence(), ": action ", i,
                         " is empty (set record, clear or rerecord)"));
    }
    record.actions.push_back(std::move(converted));
  }
  return record;
}

OpenRequest FromWire(const v1::OpenSessionRequest& request, std::string peer) {
  OpenRequest open;
  open.device_index = request.device_index();
  open.queue_families.assign(request.queue_families().begin(), request.queue_families().end());
  open.client_name = request.client_name();
  open.peer = std::move(peer);
  return open;
}

EvalPlan FromWire(const v1::EvalRequest& request, absl::string_view session_id) {
  EvalPlan plan;
  plan.commands.reserve(request.commands_size());
  for (const v1::Command& command : request.commands()) {
    plan.commands.push_back({CommandName(command), CommandFromWire(command, session_id)});
  }
  plan.uploads.reserve(request.uploads_size());
  for (const v1::TensorData& upload : request.uploads()) {
    plan.uploads.push_back({upload.handle(), upload.offset(), upload.data()});
  }
  plan.downloads = Handles(request.downloads());
  plan.sequence = request.sequence();
  plan.stage_times = request.stage_times();
  if (request.timeout_ms() > 0) {
    plan.timeout =
        absl::Milliseconds(static_cast<int64_t>(std::min(request.timeout_ms(), kMaxTimeoutMs)));
  }
  return plan;
}

void ToWire(EvalResult result, v1::EvalResponse* response) {
  for (EvalResult::Download& download : result.downloads) {
    v1::TensorData* data = response->add_downloads();
    data->set_handle(download.tensor);
    data->set_offset(0);
    data->set_data(std::move(download.data));
  }
  for (uint64_t t : result.timestamps_ns) response->add_timestamps_ns(t);
  if (result.device_time_ns != 0) response->set_device_time_ns(result.device_time_ns);
  if (result.stages.has_value()) {
    v1::EvalStages* stages = response->mutable_stages();
    stages->set_received_ns(result.stages->received_ns);
    stages->set_started_ns(result.stages->started_ns);
    stages->set_submitting_ns(result.stages->submitting_ns);
    stages->set_submitted_ns(result.stages->submitted_ns);
    stages->set_completed_ns(result.stages->completed_ns);
    stages->set_answered_ns(MonotonicNs());
    stages->set_waited_inline(result.stages->waited_inline);
  }
}

void ToWire(const SessionSummary& summary, v1::SessionInfo* info) {
  info->set_session_id(summary.id);
  info->set_client_name(summary.client_name);
  info->set_peer(summary.peer);
  info->set_device_index(summary.device_index);
  info->set_memory_bytes(summary.memory_bytes);
  info->set_age_ms(Milliseconds(summary.age));
  info->set_idle_ms(Milliseconds(summary.idle));
  info->set_tensors(summary.tensors);
  info->set_algorithms(summary.algorithms);
  info->set_sequences(summary.sequences);
  info->set_tenant(summary.tenant);
}

void ToWire(const PooledDevice& device, v1::DeviceInfo* out) {
  const core::PhysicalDeviceInfo& info = device.info();
  const VkPhysicalDeviceProperties& p = info.properties;
  out->set_index(device.index());
  out->set_name(p.deviceName);
  out->set_vendor_id(p.vendorID);
  out->set_device_id(p.deviceID);
  out->set_device_type(static_cast<uint32_t>(p.deviceType));
  out->set_api_version(p.apiVersion);
  out->set_driver_version(p.driverVersion);
  for (uint32_t f = 0; f < info.queue_families.size(); ++f) {
    const VkQueueFamilyProperties& qf = info.queue_families[f];
    v1::QueueFamily* family = out->add_queue_families();
    family->set_index(f);
    family->set_queue_count(qf.queueCount);
    family->set_compute((qf.queueFlags & VK_QUEUE_COMPUTE_BIT) != 0);
    family->set_transfer((qf.queueFlags & VK_QUEUE_TRANSFER_BIT) != 0);
    family->set_graphics((qf.queueFlags & VK_QUEUE_GRAPHICS_BIT) != 0);
    family->set_timestamp_valid_bits(qf.timestampValidBits);
  }
  out->set_memory_bytes(info.DeviceLocalBytes());
  out->set_memory_in_use_bytes(device.memory_in_use());
  v1::Limits* limits = out->mutable_limits();
  for (int d = 0; d < 3; ++d) {
    limits->add_max_compute_work_group_count(p.limits.maxComputeWorkGroupCount[d]);
    limits->add_max_compute_work_group_size(p.limits.maxComputeWorkGroupSize[d]);
  }
  limits->set_max_compute_work_group_invocations(p.limits.maxComputeWorkGroupInvocations);
  limits->set_max_push_constants_size(p.limits.maxPushConstantsSize);
  limits->set_max_storage_buffer_range(p.limits.maxStorageBufferRange);
  limits->set_max_buffer_size(info.max_buffer_size);
  limits->set_timestamp_period(p.limits.timestampPeriod);
  out->set_properties_raw(reinterpret_cast<const char*>(&p), sizeof(p));
  out->set_sessions(device.sessions());
  out->set_lost(!device.usable());
  out->set_recoveries(device.recoveries());
}

}  // namespace komputed::server::wire
