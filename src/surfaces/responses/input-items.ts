// Responses as a conversation: a request's input as OpenAI input items (what
// GET /v1/responses/{id}/input_items lists), and the chain a previous_response_id names, rebuilt
// as input items (each earlier response's input, then its output), oldest first.

import type { Store } from '../../store/store.js';
import { invalidRequest, notFound } from '../errors.js';
import type { CreateResponseBody, InputItem } from './schema.js';
import { newId } from '../content.js';

/** How far back a chain goes, and how many items it may bring. */
export const CHAIN_LIMITS = { maxDepth: 100, maxItems: 10_000 };

type Item = Record<string, unknown>;

/** The request's input as stored items: each with an id; a string input is one user message. */
export function inputItems(body: CreateResponseBody): Item[] {
  if (typeof body.input === 'string') {
    return [{ id: newId('msg'), type: 'message', role: 'user', content: [{ type: 'input_text', text: body.input }] }];
  }
  const list: InputItem[] = Array.isArray(body.input) ? body.input : body.input.messages;
  return list.map((item) => {
    if (item.type !== undefined && item.type !== 'message') return { ...item, id: item.id ?? newId(item.type === 'reasoning' ? 'rs' : 'fc') };
    const m = item as Extract<InputItem, { role: string }>;
    const text = (t: string) => ({ type: m.role === 'assistant' ? 'output_text' : 'input_text', text: t });
    return {
      ...m,
      id: m.id ?? newId('msg'),
      type: 'message',
      content: typeof m.content === 'string' ? [text(m.content)] : m.content,
    };
  });
}

/**
 * The conversation before a request that names `previousId`: every earlier response's input items
 * and output items, oldest first. 404 (param previous_response_id) when the response is not the
 * organization's; 400 when it did not end with output (in progress, failed, cancelled).
 */
export async function chainItems(store: Store, orgId: string, previousId: string): Promise<Item[]> {
  const responses: { input: Item[]; output: Item[] }[] = [];
  const seen = new Set<string>();
  let items = 0;
  for (let id: string | null = previousId; id !== null;) {
    if (seen.has(id) || responses.length >= CHAIN_LIMITS.maxDepth) {
      throw invalidRequest(`previous_response_id: the conversation is longer than ${CHAIN_LIMITS.maxDepth} responses`, 'previous_response_id');
    }
    seen.add(id);
    const stored = await store.getResponse(orgId, id);
    if (stored === undefined) {
      throw notFound(`no response with id "${id}"${id === previousId ? '' : ` (an earlier response of "${previousId}")`}`, 'previous_response_id');
    }
    if (stored.status !== 'completed' && stored.status !== 'incomplete') {
      throw invalidRequest(`previous_response_id: the response "${id}" is ${stored.status}; only a completed or incomplete response can be continued`,
        'previous_response_id');
    }
    const input = (await store.getResponseInput(orgId, id)) ?? [];
    const output = Array.isArray(stored['output']) ? stored['output'] as Item[] : [];
    items += input.length + output.length;
    if (items > CHAIN_LIMITS.maxItems) {
      throw invalidRequest(`previous_response_id: the conversation holds more than ${CHAIN_LIMITS.maxItems} items`, 'previous_response_id');
    }
    responses.push({ input, output });
    const previous = stored['previous_response_id'];
    id = typeof previous === 'string' ? previous : null;
  }
  return responses.reverse().flatMap((r) => [...r.input, ...r.output]);
}
