// The shape of JSON, measured without recursion: how deep a text nests before it is parsed, and
// how deep and large a parsed value is. Pure functions, for the API's body parser and schema
// limits (api/json-body.ts, api/validation.ts) and the batch-file validator (files/batch-file.ts).

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;

/**
 * Whether JSON text nests objects and arrays deeper than `maxDepth`. Stops at the first level past
 * it. Malformed text is not judged (JSON.parse reports it), only counted as it comes.
 */
export function jsonTextDeeperThan(text: string, maxDepth: number): boolean {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      // Jump to the closing quote: the first one not escaped by an odd run of backslashes.
      let end = i;
      for (;;) {
        end = text.indexOf('"', end + 1);
        if (end === -1) return false;
        let backslashes = 0;
        while (text.charCodeAt(end - 1 - backslashes) === BACKSLASH) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = end;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > maxDepth) return true;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
    }
  }
  return false;
}

/**
 * Levels of objects and arrays in a value, and its size as compact JSON text (escapes not counted),
 * each measured only until it passes its limit, so a huge value costs no more than the limit.
 */
export function measureJson(value: unknown, limits: { maxDepth: number; maxLength: number }): { depth: number; length: number } {
  let depth = 0;
  let length = 0;
  const stack: Array<{ value: unknown; depth: number }> = [{ value, depth: 1 }];
  while (stack.length > 0 && depth <= limits.maxDepth && length <= limits.maxLength) {
    const { value: v, depth: d } = stack.pop()!;
    if (typeof v === 'string') length += v.length + 3; // quotes and a separator
    else if (typeof v !== 'object' || v === null) length += String(v).length + 1;
    else {
      depth = Math.max(depth, d);
      length += 2;
      const items = Array.isArray(v) ? v : Object.values(v);
      if (!Array.isArray(v)) for (const key of Object.keys(v)) length += key.length + 3; // "key":
      for (const item of items) stack.push({ value: item, depth: d + 1 });
    }
  }
  return { depth, length };
}
