// Renders a model's Jinja chat template (tokenizer_config.json chat_template) into the prompt
// text, the way Hugging Face's apply_chat_template(..., add_generation_prompt=True) does.

import { Template } from '@huggingface/jinja';
import { SluiceError } from '../errors.js';
import { harmonyTemplateInput, isHarmonyTemplate } from './harmony.js';

export type ChatRole = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

export interface ChatTextPart {
  type: 'text';
  text: string;
}

/**
 * Where an image sits in a message (vision-language models): the template renders its
 * placeholder; the image itself travels beside the messages (GenerateRequest.images, in order).
 */
export interface ChatImagePart {
  type: 'image';
}

export type ChatContentPart = ChatTextPart | ChatImagePart;

export interface ChatToolCall {
  id: string;
  type: 'function';
  /** Arguments as an object: templates write them with tojson. */
  function: { name: string; arguments: Record<string, unknown> };
}

export interface ChatMessage {
  role: ChatRole;
  /**
   * A string, or a list of parts: text parts are joined with '\n', unless the list holds an image,
   * in which case the template gets the parts as they are (vision templates iterate them).
   */
  content: string | readonly ChatContentPart[];
  /** An assistant turn's tool calls. */
  tool_calls?: ChatToolCall[];
  /** A tool result's call id, and the function's name. */
  tool_call_id?: string;
  name?: string;
  /**
   * An assistant turn's reasoning (templates that render think blocks show it). Templates get it
   * as reasoning_content and as thinking (gpt-oss's name for it).
   */
  reasoning_content?: string;
}

/** A function tool as chat templates take it. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: unknown };
}

export interface RenderOptions {
  bosToken?: string | undefined;
  eosToken?: string | undefined;
  /** End with the header of an assistant turn so the model answers. Default true. */
  addGenerationPrompt?: boolean;
  /** Function tools (OpenAI's Chat Completions shape), for templates that render `tools`. */
  tools?: readonly unknown[];
  /** The template's enable_thinking; undefined leaves it undefined (the template's default). */
  enableThinking?: boolean;
  /** The template's reasoning_effort (gpt-oss: low, medium, high); undefined: the template's default. */
  reasoningEffort?: string;
}

const CHAT_ROLES: ReadonlySet<string> = new Set(['system', 'developer', 'user', 'assistant', 'tool']);

/** The variables a template is rendered with (apply_chat_template's, as transformers passes them). */
export type TemplateContext = Record<string, unknown> & { messages: NormalizedMessage[] };

export type NormalizedMessage = { role: string; content: string | ChatContentPart[]; thinking?: string } & Partial<ChatMessage>;

/** A compiled chat template. Compile once per model; render per request. */
export class ChatTemplate {
  private readonly template: Template;
  /**
   * Whether the template takes one tool call per assistant turn: it refuses several (Llama 3.1-3.3
   * raise "only supports single tool-calls at once") or renders only the first (gpt-oss); probed
   * at the first such turn. Such turns are then rendered one call per turn, each followed by its
   * result, as the model calls tools in sequence.
   */
  private oneCallPerTurn: boolean | undefined;
  /** The template writes harmony (gpt-oss), whose input needs harmonyTemplateInput(). */
  private readonly harmony: boolean;

  /**
   * @param source Jinja source. A template that does not parse throws model_file_invalid
   *   (use compileChatTemplate when the model may have none).
   * @param modelName named in error messages (the model directory).
   */
  constructor(readonly source: string, private readonly modelName = 'the model') {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new SluiceError('model_file_invalid',
        `the chat template of ${modelName} does not parse: ${(err as Error).message}`, { cause: err });
    }
    this.harmony = isHarmonyTemplate(source);
  }

  /**
   * Messages -> prompt text. Roles are checked; 'developer' is rendered as 'system' because
   * open-weight templates know only system/user/assistant (and tool, for tool results). A template's own
   * raise_exception (e.g. "roles must alternate") becomes SluiceError chat_template_error.
   */
  render(messages: readonly ChatMessage[], options: RenderOptions = {}): string {
    const context = this.context(messages, options);
    try {
      return this.template.render(context);
    } catch (err) {
      throw new SluiceError('chat_template_error',
        `the chat template of ${this.modelName} failed on these messages: ${(err as Error).message}`,
        { cause: err, param: 'messages' });
    }
  }

  /** The variables render() gives the template: checked messages (split per call where needed) and options. */
  context(messages: readonly ChatMessage[], options: RenderOptions = {}): TemplateContext {
    let normalized = normalizeMessages(messages);
    if (normalized.some((m) => (m.tool_calls?.length ?? 0) > 1)) {
      this.oneCallPerTurn ??= this.takesOneCallPerTurn();
      if (this.oneCallPerTurn) normalized = splitParallelCalls(normalized);
    }
    let tools = options.tools !== undefined && options.tools.length > 0 ? options.tools : undefined;
    if (this.harmony) {
      // Harmony templates take text only (gpt-oss has no image input).
      const text = normalized.map((m, i) => {
        if (typeof m.content !== 'string') {
          throw new SluiceError('invalid_request', `messages[${i}] holds an image; this model takes text only`, { param: `messages[${i}].content` });
        }
        return m as NormalizedMessage & { content: string };
      });
      ({ messages: normalized, tools } = harmonyTemplateInput(text, tools));
    }
    return {
      messages: normalized,
      add_generation_prompt: options.addGenerationPrompt ?? true,
      bos_token: options.bosToken ?? '',
      eos_token: options.eosToken ?? '',
      ...(tools !== undefined && { tools }),
      ...(options.enableThinking !== undefined && { enable_thinking: options.enableThinking }),
      ...(options.reasoningEffort !== undefined && { reasoning_effort: options.reasoningEffort }),
    };
  }

  /**
   * True when a turn with two calls throws, or renders without the second, while each call alone
   * renders.
   */
  private takesOneCallPerTurn(): boolean {
    // The calls differ in their arguments only: the tools' list names every function anyway.
    const call = (n: string): ChatToolCall => ({ id: n, type: 'function', function: { name: 'probe', arguments: { n } } });
    const tools = [{
      type: 'function', function: { name: 'probe', description: 'probe', parameters: { type: 'object', properties: { n: { type: 'string' } } } },
    }];
    const render = (calls: ChatToolCall[]): string | undefined => {
      const results = calls.map((c) => ({ role: 'tool', content: 'ok', tool_call_id: c.id }));
      try {
        return this.template.render({
          messages: [{ role: 'user', content: 'probe' }, { role: 'assistant', content: '', tool_calls: calls }, ...results],
          tools, add_generation_prompt: true, bos_token: '', eos_token: '',
        });
      } catch {
        return undefined;
      }
    };
    const both = render([call('probe_first'), call('probe_second')]);
    if (both !== undefined && both.includes('probe_second')) return false;
    const alone = render([call('probe_second')]);
    return alone !== undefined && alone.includes('probe_second') && render([call('probe_first')]) !== undefined;
  }
}

/**
 * An assistant turn with several calls -> one turn per call, each followed by its result (the tool
 * message naming its id, else the next one in order); results left over follow the last call.
 * The turn's text and reasoning stay with the first call.
 */
export function splitParallelCalls(messages: readonly NormalizedMessage[]): NormalizedMessage[] {
  const out: NormalizedMessage[] = [];
  for (let i = 0; i < messages.length; i++) {
    const message = messages[i]!;
    const calls = message.tool_calls;
    if (message.role !== 'assistant' || calls === undefined || calls.length < 2) {
      out.push(message);
      continue;
    }
    const results: NormalizedMessage[] = [];
    while (messages[i + 1]?.role === 'tool') results.push(messages[++i]!);
    calls.forEach((call, k) => {
      const { reasoning_content: reasoning, thinking, ...rest } = message;
      out.push({ ...rest, content: k === 0 ? message.content : '', tool_calls: [call],
        ...(k === 0 && reasoning !== undefined && { reasoning_content: reasoning }),
        ...(k === 0 && thinking !== undefined && { thinking }) });
      const byId = results.findIndex((r) => r.tool_call_id === call.id);
      const at = byId >= 0 ? byId : results.findIndex((r) => !calls.some((c) => c.id === r.tool_call_id));
      if (at >= 0) out.push(...results.splice(at, 1));
    });
    out.push(...results);
  }
  return out;
}

/** Compiles `source`, or throws no_chat_template naming the model when there is none. */
export function compileChatTemplate(source: string | undefined, modelName: string): ChatTemplate {
  if (source === undefined || source.trim() === '') {
    throw new SluiceError('no_chat_template',
      `${modelName} has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja): ` +
      'send a plain prompt instead of messages');
  }
  return new ChatTemplate(source, modelName);
}

/** Checks roles and content; flattens text parts to a string. Throws invalid_request. */
export function normalizeMessages(messages: readonly ChatMessage[]): NormalizedMessage[] {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw new SluiceError('invalid_request', 'messages must be a non-empty array', { param: 'messages' });
  }
  return messages.map((message, i) => {
    const param = `messages[${i}]`;
    if (message === null || typeof message !== 'object' || !CHAT_ROLES.has(message.role)) {
      throw new SluiceError('invalid_request',
        `${param}.role must be one of system, developer, user, assistant, tool`, { param: `${param}.role` });
    }
    return {
      role: message.role === 'developer' ? 'system' : message.role,
      content: messageText(message.content, param),
      ...(message.tool_calls !== undefined && message.tool_calls.length > 0 && { tool_calls: message.tool_calls }),
      ...(message.tool_call_id !== undefined && { tool_call_id: message.tool_call_id }),
      ...(message.name !== undefined && { name: message.name }),
      ...(message.reasoning_content !== undefined && { reasoning_content: message.reasoning_content, thinking: message.reasoning_content }),
    };
  });
}

function messageText(content: ChatMessage['content'], param: string): string | ChatContentPart[] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) {
    throw new SluiceError('invalid_request', `${param}.content must be a string or an array of text parts`,
      { param: `${param}.content` });
  }
  const parts = (content as readonly ChatContentPart[]).map((part, j): ChatContentPart => {
    if (part !== null && typeof part === 'object' && part.type === 'image') return { type: 'image' };
    if (part === null || typeof part !== 'object' || part.type !== 'text' || typeof part.text !== 'string') {
      throw new SluiceError('invalid_request',
        `${param}.content[${j}] must be {type: 'text', text: string} or {type: 'image'}`,
        { param: `${param}.content[${j}]` });
    }
    return { type: 'text', text: part.text };
  });
  if (parts.some((part) => part.type === 'image')) return parts;
  return parts.map((part) => (part as ChatTextPart).text).join('\n');
}
