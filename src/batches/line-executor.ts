// Runs one batch request line the way its endpoint would run the same body: the same Surface value
// (surfaces/surfaces.ts: pre-schema refusals, schema, adapter, rendered object), its schema compiled
// by the same validator compiler, and the same request lifecycle (serving/lifecycle.ts) up to the
// end, which the chunk writes under its lease. Only the completion window and background come from
// the batch (so flex is allowed).
//
// The outcome is a value: the result line for the output file, one for the error file, or
// `aborted` (cancel, expiry, shutdown), which is not a result: the line is left for a later run
// or simply never counted.

import type { FastifySchema } from 'fastify';
import { newId } from '../surfaces/content.js';
import { renderError } from '../surfaces/errors.js';
import { checkJsonValue } from '../surfaces/json-body.js';
import type { Surface, SurfacePath } from '../surfaces/surface.js';
import { SURFACES, surfaceFor } from '../surfaces/surfaces.js';
import { validatorCompiler } from '../surfaces/validation.js';
import type { CompletionWindow } from '../config/catalog.js';
import { isSluiceError, SluiceError } from '../errors.js';
import type { Caller, GenerationRequest } from '../serving/generation-request.js';
import type { RequestLifecycle } from '../serving/lifecycle.js';
import type { UsageRecord } from '../store/store.js';

export type LineOutcome =
  /** `usage`: the line's ledger row (absent without a ledger), stored with its result row. */
  | { kind: 'ok'; line: string; usage?: UsageRecord }
  /** `internal`: the failure was a bug or an engine fault (a 500), kept for the log. */
  | { kind: 'error'; line: string; internal?: unknown }
  | { kind: 'aborted' };

type Validate = (body: unknown) => { error?: Error };

interface LineContext {
  lifecycle: RequestLifecycle;
  caller: Caller;
  window: CompletionWindow;
  signal: AbortSignal;
  /** The ledger's id of this line (batch id and line number). */
  requestId: string;
}

/** What a batch line refuses that its endpoint accepts. */
const BATCH_REFUSALS: Partial<Record<SurfacePath, (body: Record<string, unknown>) => void>> = {
  '/v1/responses': (body) => {
    if (body['previous_response_id']) {
      throw new SluiceError('invalid_request', 'previous_response_id is not accepted in batch lines: each line is its own conversation', { param: 'previous_response_id' });
    }
  },
};

/** Each surface's body validator, compiled once by the routes' validator compiler. */
const VALIDATORS = new Map<Surface<any, any>, Validate>(Object.values(SURFACES).map((surface) => [surface,
  validatorCompiler({ schema: surface.schema as FastifySchema, httpPart: 'body', method: 'POST', url: surface.path }) as Validate]));

/** The batch decides the window; background lets the flex window through prepare(). */
function inBatch(request: GenerationRequest, window: CompletionWindow): GenerationRequest {
  // The batch's window replaces the line's own (its service_tier or metadata): a window the model
  // does not offer is then the batch's doing, not a field of the line.
  const { completionWindowParam: _lineParam, ...rest } = request;
  return { ...rest, completionWindow: window, background: true };
}

/** Adapts, prepares and runs a validated body as its endpoint would; resolves with the 200 body and its ledger row. */
async function runLine(surface: Surface<any, any>, body: Record<string, unknown>, line: LineContext): Promise<{ body: unknown; usage?: UsageRecord }> {
  const { lifecycle, caller } = line;
  BATCH_REFUSALS[surface.path]?.(body);
  const model = lifecycle.model(body['model'] as string, caller);
  const seal = lifecycle.service.reasoningSeal;
  const { request, n } = surface.adapt(body, caller, model, seal);
  // As its endpoint: more choices than the organization's in-flight limit is a 400 naming n.
  if (n > 1) lifecycle.service.limits.checkChoices(caller, n);
  const prepared = await lifecycle.prepare(inBatch(request, line.window), model);
  const rendering = surface.open(body, prepared, seal);
  // One failure (or the line's abort) stops every choice and fails the line.
  const { object, usage } = await lifecycle.generate({
    prepared, n, mode: 'batch', signal: line.signal, billed: { surface: 'batch', requestId: line.requestId },
  }, (results) => rendering.render(results));
  return { body: object, ...(usage && { usage }) };
}

/** The runner's view of one input line (already parsed by validation, so it is an object). */
export interface BatchLineRequest {
  custom_id: string;
  url: string;
  body: unknown;
}

export interface ExecuteLineOptions extends LineContext {
  /** Text of the JSONL line (validated at upload: a JSON object with custom_id, method, url, body). */
  text: string;
}

const resultLine = (customId: string, response: unknown, error: unknown): string =>
  JSON.stringify({ id: newId('batch_req'), custom_id: customId, response, error });

/** Runs one line. Never throws: every failure is an error line, or `aborted`. */
export async function executeLine(opts: ExecuteLineOptions): Promise<LineOutcome> {
  let customId = '';
  let url = '';
  try {
    const request = JSON.parse(opts.text) as BatchLineRequest;
    customId = String(request.custom_id);
    url = request.url;
    const surface = surfaceFor(request.url);
    // Validation made every line's url the batch's endpoint; this guards a file changed under us.
    if (!surface) throw new Error(`no batch surface for ${request.url}`);
    // The body parser's limits (nesting depth, prototype keys), which a batch line skips: a 400 line.
    checkJsonValue(request.body);
    surface.refuse(request.body);
    const checked = VALIDATORS.get(surface)!(request.body);
    if (checked.error) throw checked.error;
    const { body, usage } = await runLine(surface, request.body as Record<string, unknown>, opts);
    return { kind: 'ok', line: resultLine(customId, { status_code: 200, request_id: newId('req'), body }, null), ...(usage && { usage }) };
  } catch (err) {
    if (opts.signal.aborted || (isSluiceError(err) && (err.code === 'cancelled' || err.code === 'engine_disposed'))) {
      return { kind: 'aborted' };
    }
    const rendered = renderError(err);
    const { code, message } = rendered.body.error;
    // The body the endpoint itself would have answered (on Messages, Anthropic's type for the status).
    const surface = surfaceFor(url);
    const body = surface ? surface.envelope(rendered.statusCode, rendered.body) : rendered.body;
    return {
      kind: 'error',
      line: resultLine(customId,
        { status_code: rendered.statusCode, request_id: newId('req'), body },
        { code: code ?? rendered.body.error.type, message }),
      ...(rendered.internal && { internal: err }),
    };
  }
}
