// JSON request bodies, with the checks JSON.parse lacks:
//
// - Nesting depth. V8 parses any depth, but slowly (a 20 MB body of "[" blocks the event loop for
//   seconds) and what comes out overflows the stack of every recursive consumer downstream
//   (JSON.stringify of a stored response). The text is scanned before parsing (linear, no
//   recursion, strings skipped with indexOf) and refused past MAX_JSON_DEPTH levels.
// - Prototype keys. A key `__proto__`, or `constructor` holding an object with `prototype`, is
//   harmless in the parsed object but becomes prototype pollution as soon as some code merges it
//   (Object.assign, a deep merge). Refused, naming where it was found.
//
// Every refusal is a 400 ApiError in the envelope: invalid_json, json_too_deep, forbidden_json_key.

import { jsonTextDeeperThan } from '../json-shape.js';
import { invalidRequest, type ApiError } from './errors.js';

/** Levels of objects and arrays a request body may nest (`{"a": [1]}` is 2). */
export const MAX_JSON_DEPTH = 64;

const tooDeep = (maxDepth: number, param: string | null) =>
  invalidRequest(`${param ?? 'the request body'} nests objects and arrays deeper than ${maxDepth} levels, the limit`, param, 'json_too_deep');

interface Node {
  value: object;
  depth: number;
  key: string | number | undefined;
  parent: Node | undefined;
}

/** `input[0].content` for the node's path under `base`. */
function paramOf(node: Node | undefined, base: string | null, tail: string[] = []): string {
  const keys: Array<string | number> = [...tail];
  for (let n = node; n?.key !== undefined; n = n.parent) keys.unshift(n.key);
  let out = base ?? '';
  for (const k of keys) out += typeof k === 'number' ? `[${k}]` : (out === '' ? k : `.${k}`);
  return out;
}

/**
 * Checks a parsed JSON value: at most `maxDepth` levels of objects and arrays, no prototype keys.
 * Iterative (the value may come from a source that did not bound its depth). `param` names the
 * value in messages (null: the request body). Throws a 400 ApiError.
 */
export function checkJsonValue(value: unknown, opts: { maxDepth?: number; param?: string | null } = {}): void {
  const maxDepth = opts.maxDepth ?? MAX_JSON_DEPTH;
  const base = opts.param ?? null;
  if (typeof value !== 'object' || value === null) return;
  const stack: Node[] = [{ value, depth: 1, key: undefined, parent: undefined }];
  while (stack.length > 0) {
    const node = stack.pop()!;
    if (node.depth > maxDepth) throw tooDeep(maxDepth, base);
    const push = (key: string | number, child: unknown) => {
      if (typeof child === 'object' && child !== null) stack.push({ value: child, depth: node.depth + 1, key, parent: node });
    };
    if (Array.isArray(node.value)) {
      node.value.forEach((child, i) => push(i, child));
      continue;
    }
    const obj = node.value as Record<string, unknown>;
    if (Object.hasOwn(obj, '__proto__')) throw forbiddenKey('"__proto__"', paramOf(node, base, ['__proto__']));
    const ctor = Object.hasOwn(obj, 'constructor') ? obj['constructor'] : undefined;
    if (typeof ctor === 'object' && ctor !== null && Object.hasOwn(ctor, 'prototype')) {
      throw forbiddenKey('"constructor" holding "prototype"', paramOf(node, base, ['constructor', 'prototype']));
    }
    for (const key of Object.keys(obj)) push(key, obj[key]);
  }
}

function forbiddenKey(what: string, param: string): ApiError {
  return invalidRequest(`the key ${what} is not allowed in a request (found at ${param})`, param, 'forbidden_json_key');
}

/** Parses a JSON request body (see the file comment); throws a 400 ApiError. */
export function parseJsonBody(text: string): unknown {
  if (jsonTextDeeperThan(text, MAX_JSON_DEPTH)) throw tooDeep(MAX_JSON_DEPTH, null);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw invalidRequest(`the request body is not valid JSON: ${(err as Error).message}`, null, 'invalid_json');
  }
  checkJsonValue(value);
  return value;
}

/**
 * fastify content-type parser (parseAs: 'string') for application/json. An empty body
 * (curl -X POST -H 'content-type: application/json' .../cancel) is no body, not malformed JSON;
 * routes that need a body then say so through their schema.
 */
export function jsonBodyParser(_request: unknown, body: string | Buffer, done: (err: Error | null, value?: unknown) => void): void {
  const text = typeof body === 'string' ? body : body.toString('utf8');
  if (text === '') {
    done(null, undefined);
    return;
  }
  let value: unknown;
  try {
    value = parseJsonBody(text);
  } catch (err) {
    done(err as Error, undefined);
    return;
  }
  done(null, value);
}
