// The one internal request every surface (Responses, Chat Completions, Messages, batch lines)
// adapts into. The core below this line never knows which surface a request came from.

import type { ChatMessage, ChatTool } from '../text/chat-template.js';
import type { ToolCallFormat } from '../text/tool-calls.js';
import type { HarmonyEffort } from '../text/harmony.js';
import type { CompletionWindow } from '../config/catalog.js';
import type { ResponseFormat } from '../structured/structured-outputs.js';
import type { ThinkingTags } from '../structured/thinking.js';
import type { ServedModel } from './model-registry.js';
import type { SamplingFields } from '../engine/request.js';
import type { PreparedImage } from '../vision/vision-model.js';

export interface OutputFormat {
  /** json_schema and json_object are enforced by constrained decoding (src/structured). */
  type: 'text' | 'json_schema' | 'json_object';
  /** The request field holding the schema, for errors (text.format.schema, response_format.json_schema.schema). */
  schemaParam?: string;
  name?: string;
  description?: string;
  schema?: Record<string, unknown>;
  strict?: boolean;
}

export type ReasoningEffort = 'none' | 'minimal' | 'low' | 'medium' | 'high' | 'xhigh';

export interface ToolDef {
  name: string;
  description?: string;
  parameters?: Record<string, unknown>;
  strict?: boolean;
}

export type ToolChoice = 'none' | 'auto' | 'required' | { name: string };

export interface ToolsRequest {
  defs: ToolDef[];
  choice: ToolChoice;
  parallel: boolean;
  /** Request fields, for errors ('tools', 'tool_choice'). */
  param: string;
  choiceParam: string;
}

/** An image part of a request. */
export interface RequestImage {
  /** A public http(s) URL or a base64 data URI (surfaces/content.ts checkImageUrl checked its form). */
  url: string;
  detail: 'auto' | 'low' | 'high';
  /** The request field of the part, for errors (e.g. 'input[0].content[1]'). */
  param: string;
}

export interface Caller {
  orgId: string;
  orgName: string;
  keyId: string;
}

export interface GenerationRequest {
  caller: Caller;
  model: string;
  /** Chat messages (rendered with the model's template) or a raw prompt (models without chat). */
  input: { kind: 'messages'; messages: ChatMessage[] } | { kind: 'prompt'; text: string };
  /** The request carried image parts (the first one's field): they are refused unless the model takes images. */
  imageParam?: string;
  /** The images of `input`'s image parts, in prompt order. */
  images?: RequestImage[];
  /** The engine's sampling fields (engine/request.ts), as the surface set them: passed to the engine whole. */
  sampling: SamplingFields;
  maxOutputTokens?: number;
  /** The surface's name for maxOutputTokens, for error messages (max_output_tokens, max_tokens, ...). */
  maxOutputTokensParam: string;
  /** From metadata.completion_window; undefined = the model's default. */
  completionWindow?: string;
  /** The request field that named completionWindow, for errors (default metadata.completion_window; service_tier). */
  completionWindowParam?: string;
  background: boolean;
  outputFormat?: OutputFormat;
  metadata: Record<string, string>;
  promptCacheKey?: string;
  user?: string;
  /** Function tools offered to the model, and how it may use them. */
  tools?: ToolsRequest;
  /**
   * Thinking effort for models that think (undefined: the model's catalog default_reasoning_effort,
   * else medium); ignored by models that do not.
   */
  reasoningEffort?: ReasoningEffort;
}

/**
 * Resolved before the run (assistant-turn.ts plan()): what the template gets, what constrains
 * decoding, how to read the text.
 */
export interface AssistantPlan {
  /** For the chat template. */
  tools?: ChatTool[];
  enableThinking?: boolean;
  /** For templates that read reasoning_effort (gpt-oss's "Reasoning: low|medium|high"). */
  reasoningEffort?: HarmonyEffort;
  /**
   * The output is harmony messages (gpt-oss): split() reads reasoning, text and calls from their
   * channels. endId: <|end|>'s token id (reasoning tokens are counted per message).
   */
  harmony?: { endId: number | undefined };
  /** For the engine: a budget when thinking is on. */
  thinking?: false | { budget: number };
  tags?: ThinkingTags;
  /** Overrides the output format's (tool calls forced or validated). */
  responseFormat?: ResponseFormat;
  toolFormat?: ToolCallFormat;
  toolNames: string[];
}

/** What prepare() resolved: everything run() needs. */
export interface PreparedGeneration {
  request: GenerationRequest;
  /** The model request.model named, resolved once for this caller (prepare). */
  model: ServedModel;
  window: CompletionWindow;
  /** With image placeholders expanded to each image's tokens. */
  promptTokenIds: number[];
  /** The images prepared for the model (vision-model.ts), in prompt order. */
  images?: PreparedImage[];
  maxTokens: number;
  /** Reasoning and tools, resolved against the model (assistant-turn.ts). */
  assistant: AssistantPlan;
}
