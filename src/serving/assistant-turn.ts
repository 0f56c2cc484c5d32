// What shapes an assistant turn beyond plain text, for every surface: reasoning (a think block
// under a token budget chosen by effort, or gpt-oss's analysis channel at the effort its system
// message names) and tool calls (offered through the chat template, forced or validated by the
// structured-output engine, parsed back out of the text). plan() resolves a request against its
// model before anything runs; split() reads a finished generation.

import { SluiceError } from '../errors.js';
import type { GenerateResult } from '../engine/request.js';
import { promptOpensThinking, type ThinkingTags } from '../structured/thinking.js';
import { toolGrammar } from '../structured/tool-grammar.js';
import type { AssistantPlan, OutputFormat, ReasoningEffort, ToolsRequest } from './generation-request.js';
import type { ServedModel } from './model-registry.js';
import { parseToolCalls, toolCallFormat, type ParsedToolCall, type ToolCallFormat } from '../text/tool-calls.js';
import { isHarmonyTemplate, type HarmonyEffort } from '../text/harmony.js';
import { HARMONY, harmonyReasoningTokens, parseHarmony } from '../text/harmony-parser.js';

/**
 * Reasoning tokens allowed per effort (then the think block is closed and the answer follows).
 * none and minimal turn thinking off. No effort given means the model's catalog
 * default_reasoning_effort, else medium (OpenAI's default).
 */
export const THINKING_BUDGETS = { low: 512, medium: 2048, high: 8192, xhigh: 32768 } as const;
export const DEFAULT_EFFORT: ReasoningEffort = 'medium';

export const TOOL_LIMITS = { maxTools: 128, maxNameLength: 64, maxDescriptionLength: 8192 };
const TOOL_NAME = /^[A-Za-z0-9_-]+$/;

/** Checks a request's tools (names, limits, the named choice) and throws invalid_request naming the field. */
export function checkTools(tools: ToolsRequest): void {
  const { defs, param } = tools;
  if (defs.length > TOOL_LIMITS.maxTools) {
    throw new SluiceError('invalid_request', `${param} holds ${defs.length} tools; at most ${TOOL_LIMITS.maxTools} are accepted`, { param });
  }
  const seen = new Set<string>();
  defs.forEach((d, i) => {
    const at = `${param}[${i}]`;
    if (typeof d.name !== 'string' || d.name.length === 0 || d.name.length > TOOL_LIMITS.maxNameLength || !TOOL_NAME.test(d.name)) {
      throw new SluiceError('invalid_request', `${at}: a function name is 1 to ${TOOL_LIMITS.maxNameLength} of a-z, A-Z, 0-9, _ and -`, { param: `${at}.name` });
    }
    if (seen.has(d.name)) throw new SluiceError('invalid_request', `${at}: the function name '${d.name}' is given twice`, { param: `${at}.name` });
    seen.add(d.name);
    if (d.description !== undefined && d.description.length > TOOL_LIMITS.maxDescriptionLength) {
      throw new SluiceError('invalid_request', `${at}: the description is longer than ${TOOL_LIMITS.maxDescriptionLength} characters`, { param: `${at}.description` });
    }
    if (d.parameters !== undefined && (typeof d.parameters !== 'object' || d.parameters === null || Array.isArray(d.parameters))) {
      throw new SluiceError('invalid_request', `${at}: parameters must be a JSON schema object`, { param: `${at}.parameters` });
    }
  });
  const choice = tools.choice;
  if (typeof choice === 'object' && !seen.has(choice.name)) {
    throw new SluiceError('invalid_request', `${tools.choiceParam} names the function '${choice.name}', which is not among the tools`, { param: tools.choiceParam });
  }
  if (choice === 'required' && defs.length === 0) {
    throw new SluiceError('invalid_request', `${tools.choiceParam} is 'required' but no tools are given`, { param: tools.choiceParam });
  }
}

/** Whether a model's template thinks (Qwen3 style <think> blocks, turned on and off by enable_thinking). */
export function modelThinks(model: ServedModel): ThinkingTags | undefined {
  const template = model.engine.tokenizer.chatTemplate ?? '';
  if (!template.includes('enable_thinking') && !template.includes('<think>')) return undefined;
  return model.engine.thinkingTags();
}

/** The tool-call syntax a model's template teaches; undefined when it renders no tools. */
export function modelToolFormat(model: ServedModel): ToolCallFormat | undefined {
  if (model.entry.supports_tools === false) return undefined;
  return toolCallFormat(model.engine.tokenizer.chatTemplate);
}

/**
 * A request's effort as the levels templates that read reasoning_effort know (gpt-oss): reasoning
 * cannot be turned off there, so none and minimal are its lowest level; xhigh is its highest.
 */
export function templateEffort(effort: ReasoningEffort): HarmonyEffort {
  if (effort === 'none' || effort === 'minimal' || effort === 'low') return 'low';
  return effort === 'medium' ? 'medium' : 'high';
}

export function plan(model: ServedModel, req: { effort?: ReasoningEffort; tools?: ToolsRequest; outputFormat?: OutputFormat; chat: boolean }): AssistantPlan {
  const out: AssistantPlan = { toolNames: [] };
  // Only a chat request reads the template (a raw prompt has none applied).
  const template = req.chat ? model.engine.tokenizer.chatTemplate : undefined;
  const tags = req.chat ? modelThinks(model) : undefined;
  if (tags !== undefined) {
    // The request's effort, else the catalog's default for this model, else OpenAI's (medium).
    const effort = req.effort ?? model.entry.default_reasoning_effort ?? DEFAULT_EFFORT;
    out.tags = tags;
    out.enableThinking = effort !== 'none' && effort !== 'minimal';
    out.thinking = out.enableThinking ? { budget: THINKING_BUDGETS[effort as keyof typeof THINKING_BUDGETS] } : false;
  }
  if (template?.includes('reasoning_effort') === true) {
    // Without one the template's own default applies (gpt-oss: medium).
    const effort = req.effort ?? model.entry.default_reasoning_effort;
    if (effort !== undefined) out.reasoningEffort = templateEffort(effort);
  }
  if (isHarmonyTemplate(template)) out.harmony = { endId: model.engine.tokenizer.tokenId(HARMONY.end) };
  const tools = req.tools;
  if (tools === undefined || tools.choice === 'none') return out;
  checkTools(tools);
  if (tools.defs.length === 0) return out;
  const format = modelToolFormat(model);
  if (format === undefined || !req.chat) {
    throw new SluiceError('tools_unsupported', `the model "${model.id}" cannot call tools (supports_tools is false): send no tools`, { param: tools.param });
  }
  out.toolFormat = format;
  out.toolNames = tools.defs.map((d) => d.name);
  out.tools = tools.defs.map((d) => ({
    type: 'function',
    function: { name: d.name, ...(d.description !== undefined && { description: d.description }), parameters: d.parameters ?? { type: 'object', properties: {} } },
  }));
  const json = req.outputFormat?.type === 'json_schema' ? req.outputFormat : undefined;
  if (format === 'harmony') {
    refuseHarmonyGrammar(model, tools, json);
    return out;
  }
  const grammar = toolGrammar({
    tools: tools.defs, mode: tools.choice, parallel: tools.parallel, format, param: tools.param,
    ...(json !== undefined && { answer: { schema: json.schema ?? {}, strict: json.strict === true, param: json.schemaParam ?? 'response_format' } }),
  });
  if (grammar !== undefined) out.responseFormat = grammar;
  return out;
}

/**
 * Harmony tool calls are plain text to the structured-output engine (its grammars do not write
 * harmony's special tokens yet): what would need a grammar is refused, naming the field.
 */
function refuseHarmonyGrammar(model: ServedModel, tools: ToolsRequest, json: OutputFormat | undefined): void {
  const why = `the model "${model.id}" writes tool calls in the harmony format (gpt-oss), which constrained decoding does not cover yet`;
  if (tools.choice !== 'auto') {
    throw new SluiceError('tools_unsupported', `${why}, so a call cannot be forced: send ${tools.choiceParam} "auto"`, { param: tools.choiceParam });
  }
  const strict = tools.defs.findIndex((d) => d.strict === true);
  if (strict >= 0) {
    throw new SluiceError('tools_unsupported', `${why}, so strict arguments cannot be enforced: send strict false`, { param: `${tools.param}[${strict}].strict` });
  }
  if (json !== undefined) {
    throw new SluiceError('tools_unsupported', `${why}, so tools cannot be offered beside a JSON schema answer: send one or the other`,
      { param: json.schemaParam ?? 'response_format' });
  }
}

export interface AssistantTurn {
  /** The think block's (or analysis messages') text; undefined when the model did not think. */
  reasoning: string | undefined;
  /** Generated tokens spent thinking (tags or message headers included). */
  reasoningTokens: number;
  content: string;
  toolCalls: ParsedToolCall[];
  /** Set when the output ended inside its reasoning (the block or analysis message never closed). */
  reasoningOpen?: true;
}

/** Reads a finished generation: reasoning, answer text, tool calls. */
export function split(plan: AssistantPlan | undefined, promptTokenIds: readonly number[], result: Pick<GenerateResult, 'text' | 'tokenIds'>): AssistantTurn {
  if (plan?.harmony !== undefined) {
    const turn = parseHarmony(result.text, new Set(plan.toolFormat === 'harmony' ? plan.toolNames : []));
    return {
      reasoning: turn.reasoning, reasoningTokens: harmonyReasoningTokens(turn, result.tokenIds, plan.harmony.endId),
      content: turn.content, toolCalls: turn.calls, ...(turn.reasoningOpen && { reasoningOpen: true as const }),
    };
  }
  let reasoning: string | undefined;
  let reasoningTokens = 0;
  let open = false;
  let answer = result.text;
  const tags = plan?.tags;
  if (tags !== undefined && plan?.enableThinking !== false) {
    const opened = promptOpensThinking(promptTokenIds, tags);
    const start = opened ? 0 : startOfBlock(answer, tags.open);
    if (start !== undefined) {
      const close = answer.indexOf(tags.close, start);
      open = close < 0;
      reasoning = (close < 0 ? answer.slice(start) : answer.slice(start, close)).replace(/^\n/, '').replace(/\n$/, '');
      answer = close < 0 ? '' : answer.slice(close + tags.close.length).replace(/^\n+/, '');
      const closeAt = result.tokenIds.indexOf(tags.closeId);
      reasoningTokens = closeAt < 0 ? result.tokenIds.length : closeAt + 1;
    }
  }
  const parsed = plan?.toolFormat === undefined ? { content: answer, calls: [] } : parseToolCalls(answer, plan.toolFormat, new Set(plan.toolNames));
  return { reasoning, reasoningTokens, content: parsed.content, toolCalls: parsed.calls, ...(open && { reasoningOpen: true as const }) };
}

/** Where the reasoning starts when the text opens with the open tag (after whitespace). */
function startOfBlock(text: string, open: string): number | undefined {
  const lead = text.length - text.trimStart().length;
  return text.startsWith(open, lead) ? lead + open.length : undefined;
}
