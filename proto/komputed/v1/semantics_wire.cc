#include "komputed/v1/semantics_wire.h"

#include "absl/strings/str_cat.h"

namespace komputed::v1::wire {
namespace {

using core::ElementType;
using core::MemoryType;

// The wire's enums number their values as komputed's own do, so that converting is a cast.
static_assert(ELEMENT_TYPE_BOOL == static_cast<int>(ElementType::kBool));
static_assert(ELEMENT_TYPE_INT32 == static_cast<int>(ElementType::kInt32));
static_assert(ELEMENT_TYPE_UINT32 == static_cast<int>(ElementType::kUInt32));
static_assert(ELEMENT_TYPE_FLOAT32 == static_cast<int>(ElementType::kFloat32));
static_assert(ELEMENT_TYPE_FLOAT64 == static_cast<int>(ElementType::kFloat64));
static_assert(ELEMENT_TYPE_BYTES == static_cast<int>(ElementType::kBytes));
static_assert(ELEMENT_TYPE_INT16 == static_cast<int>(ElementType::kInt16));
static_assert(ELEMENT_TYPE_UINT16 == static_cast<int>(ElementType::kUInt16));
static_assert(ELEMENT_TYPE_INT8 == static_cast<int>(ElementType::kInt8));
static_assert(ELEMENT_TYPE_UINT8 == static_cast<int>(ElementType::kUInt8));
static_assert(ELEMENT_TYPE_FLOAT16 == static_cast<int>(ElementType::kFloat16));
static_assert(ElementType_MAX == static_cast<int>(core::kLastElementType));
static_assert(MEMORY_TYPE_DEVICE == static_cast<int>(MemoryType::kDevice));
static_assert(MEMORY_TYPE_HOST == static_cast<int>(MemoryType::kHost));
static_assert(MEMORY_TYPE_STORAGE == static_cast<int>(MemoryType::kStorage));
static_assert(MEMORY_TYPE_DEVICE_AND_HOST == static_cast<int>(MemoryType::kDeviceAndHost));
static_assert(MemoryType_MAX == static_cast<int>(core::kLastMemoryType));
// One wire field per operation kind.
static_assert(Operation::kSyncDevice == 1 + static_cast<int>(core::OpKind::kSyncDevice));
static_assert(Operation::kSyncLocal == 1 + static_cast<int>(core::OpKind::kSyncLocal));
static_assert(Operation::kCopy == 1 + static_cast<int>(core::OpKind::kCopy));
static_assert(Operation::kDispatch == 1 + static_cast<int>(core::OpKind::kDispatch));
static_assert(Operation::kBarrier == 1 + static_cast<int>(core::OpKind::kBarrier));
static_assert(Operation::kBarrier == 1 + static_cast<int>(core::kLastOpKind));

std::vector<uint64_t> Handles(const google::protobuf::RepeatedField<uint64_t>& handles) {
  return {handles.begin(), handles.end()};
}

}  // namespace

v1::ElementType ToWire(ElementType type) { return static_cast<v1::ElementType>(type); }
v1::MemoryType ToWire(MemoryType type) { return static_cast<v1::MemoryType>(type); }

absl::StatusOr<ElementType> FromWire(v1::ElementType type) {
  if (!ElementType_IsValid(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown element type ", static_cast<int>(type)));
  }
  return static_cast<ElementType>(type);
}

absl::StatusOr<MemoryType> FromWire(v1::MemoryType type) {
  if (!MemoryType_IsValid(type)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown memory type ", static_cast<int>(type)));
  }
  return static_cast<MemoryType>(type);
}

Operation ToWire(const HandleOp& op) {
  Operation wire;
  auto list = [&](TensorList* l) {
    for (uint64_t t : op.tensors) l->add_tensors(t);
  };
  switch (op.kind) {
    case core::OpKind::kSyncDevice:
      list(wire.mutable_sync_device());
      break;
    case core::OpKind::kSyncLocal:
      list(wire.mutable_sync_local());
      break;
    case core::OpKind::kCopy:
      list(wire.mutable_copy());
      break;
    case core::OpKind::kDispatch: {
      Dispatch* d = wire.mutable_dispatch();
      d->set_algorithm(op.algorithm);
      if (op.push_constants.has_value()) {
        d->set_has_push_constants(true);
        d->set_push_constants(op.push_constants->data(), op.push_constants->size());
      }
      break;
    }
    case core::OpKind::kBarrier: {
      Barrier* b = wire.mutable_barrier();
      for (uint64_t t : op.tensors) b->add_tensors(t);
      b->set_src_access(op.barrier.src_access);
      b->set_dst_access(op.barrier.dst_access);
      b->set_src_stage(op.barrier.src_stage);
      b->set_dst_stage(op.barrier.dst_stage);
      b->set_primary(op.barrier.primary);
      break;
    }
  }
  return wire;
}

absl::StatusOr<HandleOp> FromWire(const Operation& operation) {
  HandleOp op;
  switch (operation.op_case()) {
    case Operation::kSyncDevice:
      op.kind = core::OpKind::kSyncDevice;
      op.tensors = Handles(operation.sync_device().tensors());
      return op;
    case Operation::kSyncLocal:
      op.kind = core::OpKind::kSyncLocal;
      op.tensors = Handles(operation.sync_local().tensors());
      return op;
    case Operation::kCopy:
      op.kind = core::OpKind::kCopy;
      op.tensors = Handles(operation.copy().tensors());
      return op;
    case Operation::kDispatch: {
      const Dispatch& d = operation.dispatch();
      op.kind = core::OpKind::kDispatch;
      op.algorithm = d.algorithm();
      if (d.has_push_constants()) {
        op.push_constants.emplace(d.push_constants().begin(), d.push_constants().end());
      }
      return op;
    }
    case Operation::kBarrier: {
      const Barrier& b = operation.barrier();
      op.kind = core::OpKind::kBarrier;
      op.tensors = Handles(b.tensors());
      op.barrier = {b.src_access(), b.dst_access(), b.src_stage(), b.dst_stage(), b.primary()};
      return op;
    }
    case Operation::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the operation is empty (set one of its fields)");
}

}  // namespace komputed::v1::wire
