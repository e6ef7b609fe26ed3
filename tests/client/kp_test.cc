#include "kp_test.h"

namespace kptest {

std::string MemoryName(kp::Tensor::TensorTypes type) {
  switch (type) {
    case kp::Tensor::TensorTypes::eDevice:
      return "eDevice";
    case kp::Tensor::TensorTypes::eHost:
      return "eHost";
    case kp::Tensor::TensorTypes::eStorage:
      return "eStorage";
    case kp::Tensor::TensorTypes::eDeviceAndHost:
      return "eDeviceAndHost";
  }
  return "?";
}

std::string CodeName(kp::ErrorCode code) {
  switch (code) {
    case kp::ErrorCode::kOk:
      return "kOk";
    case kp::ErrorCode::kCancelled:
      return "kCancelled";
    case kp::ErrorCode::kUnknown:
      return "kUnknown";
    case kp::ErrorCode::kInvalidArgument:
      return "kInvalidArgument";
    case kp::ErrorCode::kDeadlineExceeded:
      return "kDeadlineExceeded";
    case kp::ErrorCode::kNotFound:
      return "kNotFound";
    case kp::ErrorCode::kAlreadyExists:
      return "kAlreadyExists";
    case kp::ErrorCode::kPermissionDenied:
      return "kPermissionDenied";
    case kp::ErrorCode::kResourceExhausted:
      return "kResourceExhausted";
    case kp::ErrorCode::kFailedPrecondition:
      return "kFailedPrecondition";
    case kp::ErrorCode::kAborted:
      return "kAborted";
    case kp::ErrorCode::kOutOfRange:
      return "kOutOfRange";
    case kp::ErrorCode::kUnimplemented:
      return "kUnimplemented";
    case kp::ErrorCode::kInternal:
      return "kInternal";
    case kp::ErrorCode::kUnavailable:
      return "kUnavailable";
    case kp::ErrorCode::kDataLoss:
      return "kDataLoss";
    case kp::ErrorCode::kUnauthenticated:
      return "kUnauthenticated";
  }
  return "code " + std::to_string(static_cast<int>(code));
}

void PrintTo(BackendKind kind, std::ostream* os) { *os << Name(kind); }

}  // namespace kptest
