#include "sluice/error.h"

namespace sluice {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kModelFileMissing: return "MODEL_FILE_MISSING";
    case ErrorCode::kModelFileInvalid: return "MODEL_FILE_INVALID";
    case ErrorCode::kUnsupportedModel: return "UNSUPPORTED_MODEL";
    case ErrorCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case ErrorCode::kNoKvBlocks: return "NO_KV_BLOCKS";
    case ErrorCode::kSequenceExists: return "SEQ_EXISTS";
    case ErrorCode::kSequenceUnknown: return "SEQ_UNKNOWN";
    case ErrorCode::kBackendUnavailable: return "BACKEND_UNAVAILABLE";
    case ErrorCode::kOutOfMemory: return "OUT_OF_MEMORY";
    case ErrorCode::kDeviceFault: return "DEVICE_FAULT";
    case ErrorCode::kEngineBroken: return "ENGINE_BROKEN";
    case ErrorCode::kInternal: return "INTERNAL";
  }
  return "INTERNAL";
}

}  // namespace sluice
