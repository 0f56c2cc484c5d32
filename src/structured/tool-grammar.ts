// The grammar of a tool-calling answer, as an xgrammar structural tag: each offered function is a
// tag whose fixed opening names it and whose content is its parameters' JSON schema, in the
// model's own syntax (text/tool-calls.ts). Which tags and how:
//   - tool_choice required / a named function: only calls (at least one; one when parallel calls
//     are off), then the end of the output;
//   - auto with a strict function: free text, but once the model opens a call it must be valid;
//   - auto with an output JSON schema: either calls or the schema's value.
// Auto with only non-strict functions and no schema needs no grammar (calls are parsed after).

import { SluiceError } from '../errors.js';
import type { ToolCallFormat } from '../text/tool-calls.js';
import { checkResponseSchema } from './schema-check.js';
import type { ResponseFormat } from './structured-outputs.js';

export interface ToolSpec {
  name: string;
  parameters?: unknown;
  strict?: boolean;
}

export type ToolMode = 'auto' | 'required' | { name: string };

export interface ToolGrammarRequest {
  tools: readonly ToolSpec[];
  mode: ToolMode;
  parallel: boolean;
  format: ToolCallFormat;
  /** The request field listing the tools, for errors ('tools'). */
  param: string;
  /** The answer's JSON schema when the request also asked for one (auto only). */
  answer?: { schema: unknown; strict: boolean; param: string };
}

const EMPTY_OBJECT = { type: 'object', properties: {} };

/** The structural-tag response format, or undefined when the answer needs no grammar. */
export function toolGrammar(req: ToolGrammarRequest): ResponseFormat | undefined {
  const { tools, mode } = req;
  const forced = mode !== 'auto';
  if (!forced && req.answer === undefined && !tools.some((t) => t.strict === true)) return undefined;
  const chosen = typeof mode === 'object' ? tools.filter((t) => t.name === mode.name) : tools;
  const tags = chosen.map((tool) => {
    const i = tools.indexOf(tool);
    return tagOf(tool, argumentsSchema(tool, `${req.param}[${i}].parameters`, forced), req.format);
  });
  const calls = {
    type: 'tags_with_separator', tags, separator: req.format === 'hermes' ? '\n' : '; ', at_least_one: true, stop_after_first: !req.parallel,
  };
  let format: object;
  if (forced) format = calls;
  else if (req.answer !== undefined) {
    const { schema } = checkResponseSchema(req.answer.schema, { strict: req.answer.strict, param: req.answer.param });
    format = { type: 'or', elements: [calls, { type: 'json_schema', json_schema: schema }] };
  } else {
    format = { type: 'triggered_tags', triggers: [req.format === 'hermes' ? '<tool_call>' : '{"name": '], tags, stop_after_first: !req.parallel };
  }
  return { type: 'structural_tag', tag: { type: 'structural_tag', format }, param: req.param };
}

/**
 * The schema the arguments are held to. Strict functions, and every function when a call is
 * forced, must have an enforceable schema (else a 400 naming it); a non-strict function in auto
 * mode whose schema cannot be enforced is held to "a JSON object" only.
 */
function argumentsSchema(tool: ToolSpec, param: string, forced: boolean): unknown {
  const parameters = tool.parameters ?? EMPTY_OBJECT;
  try {
    return checkResponseSchema(parameters, { strict: tool.strict === true, param }).schema;
  } catch (err) {
    if (tool.strict === true || forced || !(err instanceof SluiceError)) throw err;
    return { type: 'object' };
  }
}

function tagOf(tool: ToolSpec, schema: unknown, format: ToolCallFormat): object {
  const name = JSON.stringify(tool.name);
  return format === 'hermes'
    ? { type: 'tag', begin: `<tool_call>\n{"name": ${name}, "arguments": `, content: { type: 'json_schema', json_schema: schema }, end: '}\n</tool_call>' }
    : { type: 'tag', begin: `{"name": ${name}, "parameters": `, content: { type: 'json_schema', json_schema: schema }, end: '}' };
}
