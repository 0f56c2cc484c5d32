// The package entry: `import { Engine } from 'sluice'`.

export { Engine, defaultKvCacheBytes } from './engine/engine.js';
export type { EngineInfo, EngineLoadOptions } from './engine/engine.js';
export type {
  GenerateChunk, GenerateRequest, GenerateResult, TokenLogprob, TopLogprob, Timings, Usage,
} from './engine/request.js';
export type { ChatMessage, ChatRole, ChatTextPart } from './engine/chat-template.js';
export type { FinishReason } from './engine/stops.js';
export type { BackendName } from './engine/native-types.js';
export { SluiceTokenizer } from './engine/tokenizer.js';
export { SluiceError, isSluiceError } from './errors.js';
export type { SluiceErrorCode } from './errors.js';
export { makeModel } from '../models/make-model.js';
export type { MakeModelOptions } from '../models/make-model.js';
