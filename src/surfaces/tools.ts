// Function tools as the two OpenAI surfaces write them, read into the service's ToolsRequest, and
// the tool-call pieces both surfaces share (call ids, arguments as the template wants them).

import type { ToolChoice, ToolDef, ToolsRequest } from '../serving/generation-request.js';
import { invalidRequest } from './errors.js';
import { newId } from './content.js';

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** OpenAI's call ids: `call_` + random hex. */
export const callId = (): string => newId('call');

function toolDef(fields: Record<string, unknown>, at: string): ToolDef {
  const { name, description, parameters, strict } = fields;
  if (typeof name !== 'string') throw invalidRequest(`${at}.name must be a string`, `${at}.name`);
  if (description != null && typeof description !== 'string') throw invalidRequest(`${at}.description must be a string`, `${at}.description`);
  if (parameters != null && !isObject(parameters)) throw invalidRequest(`${at}.parameters must be a JSON schema object`, `${at}.parameters`);
  if (strict != null && typeof strict !== 'boolean') throw invalidRequest(`${at}.strict must be a boolean`, `${at}.strict`);
  return {
    name,
    ...(typeof description === 'string' && { description }),
    ...(isObject(parameters) && { parameters }),
    ...(strict === true && { strict: true }),
  };
}

function choiceOf(choice: unknown, param: string, named: (c: Record<string, unknown>) => unknown): ToolChoice {
  if (choice == null) return 'auto';
  if (choice === 'none' || choice === 'auto' || choice === 'required') return choice;
  if (isObject(choice) && choice['type'] === 'function') {
    const name = named(choice);
    if (typeof name === 'string') return { name };
  }
  throw invalidRequest(`${param} must be "none", "auto", "required" or a function to call`, param);
}

/** Chat Completions: tools [{type: 'function', function: {name, description, parameters, strict}}]. */
export function chatTools(tools: unknown[] | null | undefined, choice: unknown, parallel: boolean | null | undefined): ToolsRequest | undefined {
  if ((tools == null || tools.length === 0) && (choice == null || choice === 'none' || choice === 'auto')) return undefined;
  const defs = (tools ?? []).map((t, i) => {
    const at = `tools[${i}]`;
    if (!isObject(t) || t['type'] !== 'function' || !isObject(t['function'])) {
      throw invalidRequest(`${at} must be {type: "function", function: {...}}: only function tools are served`, `${at}.type`, 'unsupported_tool');
    }
    return toolDef(t['function'], `${at}.function`);
  });
  return {
    defs, parallel: parallel ?? true, param: 'tools', choiceParam: 'tool_choice',
    choice: choiceOf(choice, 'tool_choice', (c) => (isObject(c['function']) ? c['function']['name'] : undefined)),
  };
}

/** Responses: tools [{type: 'function', name, description, parameters, strict}]. */
export function responsesTools(tools: unknown[] | null | undefined, choice: unknown, parallel: boolean | null | undefined): ToolsRequest | undefined {
  if ((tools == null || tools.length === 0) && (choice == null || choice === 'none' || choice === 'auto')) return undefined;
  const defs = (tools ?? []).map((t, i) => {
    const at = `tools[${i}]`;
    if (!isObject(t) || t['type'] !== 'function') {
      const type = isObject(t) ? JSON.stringify(t['type']) : 'not an object';
      throw invalidRequest(`${at}: only function tools are served (got type ${type})`, `${at}.type`, 'unsupported_tool');
    }
    return toolDef(t, at);
  });
  return {
    defs, parallel: parallel ?? true, param: 'tools', choiceParam: 'tool_choice',
    choice: choiceOf(choice, 'tool_choice', (c) => c['name']),
  };
}

/** A call's arguments as the chat template wants them: an object (from the JSON text clients send). */
export function argumentsObject(args: unknown, param: string): Record<string, unknown> {
  if (isObject(args)) return args;
  if (typeof args === 'string') {
    try {
      const parsed = JSON.parse(args === '' ? '{}' : args) as unknown;
      if (isObject(parsed)) return parsed;
    } catch {
      // reported below
    }
  }
  throw invalidRequest(`${param} must be a JSON object's text`, param);
}
