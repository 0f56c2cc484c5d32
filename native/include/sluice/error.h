// Errors that cross the library boundary carry a stable code, which the addon turns into
// a rejected promise with that code and the API layer maps to its error envelope.
#pragma once
#include <stdexcept>
#include <string>

namespace sluice {

enum class ErrorCode {
  kModelFileMissing,      // a file of the model directory does not exist or cannot be opened
  kModelFileInvalid,      // a file exists but is corrupt or inconsistent
  kUnsupportedModel,      // an architecture, dtype or option the engine does not implement
  kInvalidArgument,       // a caller broke a documented precondition
  kNoKvBlocks,            // a step plan needs more KV blocks than are free (nothing was done)
  kSequenceExists,        // add_sequence with an id in use
  kSequenceUnknown,       // a plan names a sequence that was never added or already freed
  kBackendUnavailable,    // e.g. CUDA requested but not compiled in or no device present
  kOutOfMemory,           // an allocation for weights or the KV pool failed
  kDeviceFault,           // the device is in an unrecoverable state (a sticky CUDA error): the engine breaks
  kEngineBroken,          // a call to an engine that a device fault put out of service
  kInternal,              // a bug
};

const char* error_code_name(ErrorCode code);  // "MODEL_FILE_MISSING", ...

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace sluice
