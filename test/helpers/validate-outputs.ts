// The check every structured-output generation test makes: each completed output parses as JSON
// and validates against its schema with an independent validator (ajv 2020 + ajv-formats).
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

export interface GeneratedOutput { text: string; finishReason: string }

export interface OutputCheck {
  /** One line per output that did not parse or validate (or, with requireStop, did not finish). */
  failures: string[];
  /** Outputs that finished ('stop'), each checked. */
  completed: number;
  /** The parsed value of each output that parsed (undefined where it did not, or was not checked). */
  values: unknown[];
}

/**
 * Checks outputs[i] against schemas[i]. Outputs cut by maxTokens are skipped (reported as length,
 * not checked) unless `requireStop`, where they are failures.
 */
export function checkOutputs(outputs: GeneratedOutput[], schemas: object[], opts: { requireStop?: boolean } = {}): OutputCheck {
  const ajv = new Ajv2020.default({ strict: false, allErrors: true });
  addFormats.default(ajv);
  const failures: string[] = [];
  const values: unknown[] = [];
  let completed = 0;
  outputs.forEach((r, i) => {
    const schema = schemas[i]!;
    if (r.finishReason !== 'stop') {
      if (opts.requireStop) failures.push(`${JSON.stringify(schema)}: finished by ${r.finishReason} after ${r.text.length} characters`);
      return;
    }
    completed++;
    let value: unknown;
    try {
      value = JSON.parse(r.text);
    } catch {
      failures.push(`${JSON.stringify(schema)}: not JSON: ${JSON.stringify(r.text)}`);
      return;
    }
    values[i] = value;
    if (!ajv.validate(schema, value)) failures.push(`${JSON.stringify(schema)}: ${JSON.stringify(r.text)}: ${ajv.errorsText()}`);
  });
  return { failures, completed, values };
}
