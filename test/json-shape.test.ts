// The JSON shape checks without a server: nesting measured on the text (strings and escapes
// skipped), parsed values checked for depth and prototype keys with the field named, and the batch
// file validator's refusal of lines nested past its parse cap.

import { describe, expect, it } from 'vitest';
import { checkJsonValue, parseJsonBody } from '../src/surfaces/json-body.js';
import { BatchFileValidator, MAX_BATCH_LINE_DEPTH } from '../src/files/batch-file.js';
import { jsonTextDeeperThan, measureJson } from '../src/json-shape.js';

describe('jsonTextDeeperThan', () => {
  it('counts objects and arrays, not brackets inside strings', () => {
    expect(jsonTextDeeperThan('{"a": [1, {"b": 2}]}', 3)).toBe(false);
    expect(jsonTextDeeperThan('{"a": [1, {"b": 2}]}', 2)).toBe(true);
    expect(jsonTextDeeperThan(`{"s": "${'[{'.repeat(50)}"}`, 1)).toBe(false);
    // An escaped quote does not end the string; an escaped backslash before a quote does.
    expect(jsonTextDeeperThan('{"s": "a\\"[[[[", "t": 1}', 1)).toBe(false);
    expect(jsonTextDeeperThan('{"s": "a\\\\", "t": [[1]]}', 2)).toBe(true);
    expect(jsonTextDeeperThan('['.repeat(1_000_000), 64)).toBe(true);
  });
});

describe('checkJsonValue and parseJsonBody', () => {
  it('names where a forbidden key is', () => {
    const value = JSON.parse('{"input": [{"x": 1}, {"content": {"__proto__": {"polluted": true}}}]}') as unknown;
    expect(() => checkJsonValue(value)).toThrow(expect.objectContaining({ param: 'input[1].content.__proto__', code: 'forbidden_json_key' }));
    expect(() => checkJsonValue({ constructor: { prototype: {} } }, { param: 'body' }))
      .toThrow(expect.objectContaining({ param: 'body.constructor.prototype' }));
    // A constructor key that is a plain value is allowed (it pollutes nothing).
    expect(() => checkJsonValue({ constructor: 'x', prototype: {} })).not.toThrow();
  });

  it('refuses nesting past the limit', () => {
    expect(() => checkJsonValue({ a: { b: {} } }, { maxDepth: 2 })).toThrow(expect.objectContaining({ code: 'json_too_deep' }));
    expect(() => checkJsonValue({ a: { b: {} } }, { maxDepth: 3 })).not.toThrow();
    expect(() => parseJsonBody(`${'['.repeat(65)}${']'.repeat(65)}`)).toThrow(expect.objectContaining({ code: 'json_too_deep', statusCode: 400 }));
    expect(parseJsonBody(`${'['.repeat(64)}${']'.repeat(64)}`)).toBeInstanceOf(Array);
    expect(() => parseJsonBody('{"a":')).toThrow(expect.objectContaining({ code: 'invalid_json' }));
  });
});

describe('measureJson', () => {
  it('measures depth and compact length, stopping past the limits', () => {
    const value = { a: [1, 'xy'], b: { c: null } };
    const measured = measureJson(value, { maxDepth: 10, maxLength: 1000 });
    expect(measured.depth).toBe(2);
    // About the JSON text's length: a separator per value is counted, so slightly over, never under.
    expect(measured.length).toBeGreaterThanOrEqual(JSON.stringify(value).length);
    expect(measured.length).toBeLessThanOrEqual(JSON.stringify(value).length + 5);
    const huge = { s: 'z'.repeat(1_000_000) };
    expect(measureJson(huge, { maxDepth: 10, maxLength: 100 }).length).toBeGreaterThan(100);
  });
});

describe('batch file lines', () => {
  const line = (body: string) => Buffer.from(`{"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": ${body}}\n`);

  it('refuses a line nested past the parse cap at upload, and leaves shallower ones to the run', () => {
    const shallow = new BatchFileValidator();
    expect(shallow.push(line(`{"x": ${'['.repeat(100)}${']'.repeat(100)}}`))).toBeNull();
    expect(shallow.finish()).toBeNull();
    const deep = new BatchFileValidator();
    const n = MAX_BATCH_LINE_DEPTH;
    expect(deep.push(line(`{"x": ${'['.repeat(n)}${']'.repeat(n)}}`))).toEqual({ line: 1, message: `line 1: nested deeper than ${n} levels` });
  });

  it('refuses the request past maxRequests, naming the limit', () => {
    const validator = new BatchFileValidator({ maxRequests: 2 });
    const text = [1, 2, 3].map((i) => `{"custom_id": "${i}", "method": "POST", "url": "/v1/responses", "body": {}}`).join('\n');
    expect(validator.push(Buffer.from(text))).toBeNull(); // the third line has no "\n" yet
    expect(validator.finish()).toEqual({ line: 3, message: 'line 3: the file has more than 2 requests, the most a batch may have' });
  });
});
