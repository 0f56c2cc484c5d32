// Request validation from the declared route schemas. Bodies are checked as sent (no type
// coercion, nothing removed, so a stray field in a closed object is an error, not silently
// dropped); query strings and path parameters are coerced from strings as usual. An ajv failure
// becomes one 400 envelope naming the field (`input[0].content[1].type`) and, for enums, the
// allowed values and the value received.

import { Ajv, type ErrorObject } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FastifySchemaCompiler } from 'fastify';
import { ApiError } from './errors.js';
import { measureJson } from '../json-shape.js';

// ajv-formats is CommonJS with a default export.
const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv;

function makeAjv(coerce: boolean): Ajv {
  const ajv = new Ajv({
    coerceTypes: coerce ? 'array' : false,
    useDefaults: true,
    removeAdditional: false,
    allErrors: false,
    verbose: true,
    strict: false,
    // oneOf with `discriminator` picks the branch by its `type` tag, so errors come from the
    // branch the client meant (see discriminatedUnion in schemas/common.ts).
    discriminator: true,
  });
  addFormats(ajv);
  ajv.addKeyword(JSON_LIMITS_KEYWORD);
  return ajv;
}

/** The limits a free-form JSON value (a JSON schema the client sends) is held to: schema keyword `x-json-limits`. */
export interface JsonValueLimits {
  /** Levels of objects and arrays, the value itself being the first. */
  maxDepth: number;
  /** Characters of the value as compact JSON text. */
  maxLength: number;
}

/**
 * `x-json-limits: {maxDepth, maxLength}` bounds a free-form value the schema cannot describe
 * (`Type.Unknown()` inside), so an absurd one is a 400 before any work is done for it.
 */
const JSON_LIMITS_KEYWORD = {
  keyword: 'x-json-limits',
  schemaType: 'object',
  errors: true,
  validate: function checkLimits(limits: JsonValueLimits, data: unknown): boolean {
    const { depth, length } = measureJson(data, limits);
    const self = checkLimits as unknown as { errors: Array<Partial<ErrorObject>> | null };
    const problem = depth > limits.maxDepth ? `must nest at most ${limits.maxDepth} levels of objects and arrays`
      : length > limits.maxLength ? `must be at most ${limits.maxLength} characters as JSON`
        : undefined;
    self.errors = problem === undefined ? null : [{ keyword: 'x-json-limits', message: problem, params: { limits } }];
    return problem === undefined;
  },
} as const;

const bodyAjv = makeAjv(false);
const paramAjv = makeAjv(true);

export const validatorCompiler: FastifySchemaCompiler<unknown> = ({ schema, httpPart }) => {
  const validate = (httpPart === 'body' ? bodyAjv : paramAjv).compile(schema as object);
  return (data: unknown) => {
    if (validate(data)) return { value: data };
    return { error: validationError(validate.errors ?? [], httpPart ?? 'body') };
  };
};

/** `/input/0/content` -> `input[0].content`. */
export function pointerToParam(pointer: string): string {
  let out = '';
  for (const raw of pointer.split('/').slice(1)) {
    const seg = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    out += /^\d+$/.test(seg) ? `[${seg}]` : (out === '' ? seg : `.${seg}`);
  }
  return out;
}

function joinParam(base: string, key: string): string {
  return base === '' ? key : `${base}.${key}`;
}

function show(value: unknown): string {
  const s = JSON.stringify(value);
  if (s === undefined) return String(value);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

/**
 * Picks the most useful of ajv's errors. A union (anyOf / oneOf) reports one error per branch and
 * then a summary; the deepest branch error names the field that is actually wrong, so it wins.
 */
function bestError(errors: ErrorObject[]): ErrorObject | undefined {
  // A union branch whose `type` discriminator did not match says nothing about the branch the
  // client meant: drop all of that branch's errors.
  const wrongBranches = errors
    .filter((e) => (e.keyword === 'const' || e.keyword === 'enum') && e.instancePath.endsWith('/type'))
    // Only a `type` directly under a union branch tells branches apart (not one nested deeper).
    .map((e) => /^(.*\/(?:anyOf|oneOf)\/\d+\/)properties\/type\/(?:const|enum)$/.exec(e.schemaPath)?.[1])
    .filter((p): p is string => p !== undefined);
  const relevant = errors.filter((e) => !wrongBranches.some((p) => e.schemaPath.startsWith(p)));
  let best: ErrorObject | undefined;
  let bestDepth = -1;
  for (const e of relevant.length > 0 ? relevant : errors) {
    if (e.keyword === 'anyOf' || e.keyword === 'oneOf' || e.keyword === 'if') continue;
    const depth = e.instancePath.split('/').length + (e.keyword === 'required' || e.keyword === 'additionalProperties' ? 1 : 0);
    // Prefer a type error of a deeper path; among equal depths keep the first (ajv's order).
    if (depth > bestDepth) { best = e; bestDepth = depth; }
  }
  return best ?? errors[0];
}

export function describeAjvError(e: ErrorObject, part: string): { param: string; message: string } {
  const base = pointerToParam(e.instancePath);
  const where = part === 'body' ? '' : `${part} `;
  // Inside `propertyNames`: the error is about a key of the object at instancePath, not its value.
  if (e.propertyName !== undefined && e.keyword !== 'propertyNames') {
    return { param: base, message: `${where}${base || 'the body'}: the key ${show(e.propertyName)} ${e.message ?? 'is not allowed'}` };
  }
  switch (e.keyword) {
    case 'required': {
      const param = joinParam(base, String((e.params as { missingProperty: string }).missingProperty));
      return { param, message: `${where}${param} is required` };
    }
    case 'additionalProperties': {
      const param = joinParam(base, String((e.params as { additionalProperty: string }).additionalProperty));
      return { param, message: `${where}${param} is not a recognised field here` };
    }
    case 'enum': {
      const allowed = (e.params as { allowedValues: unknown[] }).allowedValues.map((v) => show(v)).join(', ');
      return { param: base, message: `${where}${base || 'value'} must be one of ${allowed} (got ${show(e.data)})` };
    }
    case 'const': {
      return { param: base, message: `${where}${base || 'value'} must be ${show((e.params as { allowedValue: unknown }).allowedValue)} (got ${show(e.data)})` };
    }
    case 'discriminator': {
      const { tag, tagValue } = e.params as { tag: string; tagValue: unknown };
      const branches = ((e.parentSchema as { oneOf?: Array<{ properties?: Record<string, { const?: unknown }> }> })?.oneOf ?? []);
      const allowed = branches.map((b) => show(b.properties?.[tag]?.const)).join(', ');
      const param = joinParam(base, tag);
      return { param, message: `${where}${param} must be one of ${allowed} (got ${show(tagValue)})` };
    }
    case 'type':
      return { param: base, message: `${where}${base || 'the body'} ${e.message ?? 'has the wrong type'} (got ${show(e.data)})` };
    default:
      return { param: base, message: `${where}${base || 'the body'} ${e.message ?? 'is invalid'}${e.data !== undefined && typeof e.data !== 'object' ? ` (got ${show(e.data)})` : ''}` };
  }
}

export function validationError(errors: ErrorObject[], part: string): ApiError {
  const e = bestError(errors);
  if (!e) return new ApiError(400, 'invalid_request_error', `invalid ${part}`, null, 'invalid_request');
  const { param, message } = describeAjvError(e, part);
  return new ApiError(400, 'invalid_request_error', message, param === '' ? null : param, 'invalid_request');
}
