// Errors that carry a code through every layer. The API layer maps `code` to its error envelope
// and HTTP status; the CLI prints `message` without a stack trace.
//
// Contract: a SluiceError is an expected failure caused by the caller's input or environment
// (bad request, missing file, unavailable backend). Anything else that is thrown is a bug.

/** Codes raised by the engine facade. Other layers may add their own codes. */
export type SluiceErrorCode =
  | 'model_file_missing'        // a required file in the model directory does not exist
  | 'model_file_invalid'        // a model file exists but cannot be parsed / is inconsistent
  | 'no_chat_template'          // messages were given but the model has no chat template
  | 'chat_template_error'       // the model's chat template failed to render these messages
  | 'invalid_request'           // a request field is out of range or malformed
  | 'context_length_exceeded'   // prompt tokens + max tokens > the model's context length
  | 'request_too_large'         // the request can never fit in the KV cache pool
  | 'backend_unavailable'       // the requested backend (e.g. cuda) is not compiled in / no device
  | 'native_unavailable'        // the native addon is not built or failed to load
  | 'cancelled'                 // the caller aborted the request
  | 'engine_disposed'           // the engine was disposed while the request was pending
  | 'engine_error'              // the native engine failed while running a step
  | 'invalid_argument';         // a CLI flag or option value is malformed

export interface SluiceErrorOptions {
  /** The request field / flag the error is about, when there is one (e.g. 'temperature'). */
  param?: string;
  cause?: unknown;
}

export class SluiceError extends Error {
  readonly code: SluiceErrorCode | (string & {});
  readonly param: string | undefined;

  constructor(code: SluiceErrorCode | (string & {}), message: string, options: SluiceErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'SluiceError';
    this.code = code;
    this.param = options.param;
  }
}

export function isSluiceError(value: unknown): value is SluiceError {
  return value instanceof SluiceError;
}
