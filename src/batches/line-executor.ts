// Runs one batch request line the way its endpoint would run the same body: the same pre-schema
// refusals, the same TypeBox schema compiled by the same validator compiler, the same surface
// adapter and GenerationService, and the same response object. Only the completion window and
// background come from the batch (so flex is allowed), and nothing is stored per line.
//
// The outcome is a value: the result line for the output file, one for the error file, or
// `aborted` (cancel, expiry, shutdown), which is not a result: the line is left for a later run
// or simply never counted.

import type { FastifySchema } from 'fastify';
import { chatCompletion, choicesOf, completionId, refuseUnsupportedChatInput, systemFingerprint, toChatGenerationRequest } from '../surfaces/chat/adapter.js';
import { newId, nowSeconds } from '../surfaces/content.js';
import { messageObject, refuseUnsupportedMessageInput, toMessagesGenerationRequest } from '../surfaces/messages/adapter.js';
import { finishedResponse, inProgressResponse, refuseUnsupportedInput, toGenerationRequest } from '../surfaces/responses/adapter.js';
import { renderError } from '../surfaces/errors.js';
import { toMessagesEnvelope } from '../surfaces/messages/envelope.js';
import { checkJsonValue } from '../surfaces/json-body.js';
import { CreateChatCompletionSchema, type CreateChatCompletionBody } from '../surfaces/chat/schema.js';
import { CreateMessageSchema, type CreateMessageBody } from '../surfaces/messages/schema.js';
import { CreateResponseSchema, type CreateResponseBody } from '../surfaces/responses/schema.js';
import { validatorCompiler } from '../surfaces/validation.js';
import type { CompletionWindow } from '../config/catalog.js';
import { isSluiceError, SluiceError } from '../errors.js';
import type { GenerateResult } from '../engine/request.js';
import type { Caller, GenerationRequest, PreparedGeneration } from '../serving/generation-request.js';
import type { GenerationService } from '../serving/generation-service.js';

/** What a line's generation used, for the usage ledger (billing/ledger.ts). */
export interface LineUsage {
  prepared: PreparedGeneration;
  results: GenerateResult[];
}

export type LineOutcome =
  | { kind: 'ok'; line: string; usage: LineUsage }
  /** `internal`: the failure was a bug or an engine fault (a 500), kept for the log. */
  | { kind: 'error'; line: string; internal?: unknown }
  | { kind: 'aborted' };

type Validate = (body: unknown) => { error?: Error };

interface Surface {
  /** The route's preValidation: clear refusals before the schema would report a mismatch. */
  refuse(body: unknown): void;
  validate: Validate;
  /** Adapts, prepares, runs; resolves with the endpoint's 200 body and what it used. */
  run(body: unknown, line: LineContext): Promise<{ body: unknown; usage: LineUsage }>;
}

interface LineContext {
  service: GenerationService;
  caller: Caller;
  window: CompletionWindow;
  signal: AbortSignal;
}

function compileBody(schema: unknown, url: string): Validate {
  return validatorCompiler({ schema: schema as FastifySchema, httpPart: 'body', method: 'POST', url }) as Validate;
}

/** The batch decides the window; background lets the flex window through prepare(). */
function inBatch(request: GenerationRequest, window: CompletionWindow): GenerationRequest {
  // The batch's window replaces the line's own (its service_tier or metadata): a window the model
  // does not offer is then the batch's doing, not a field of the line.
  const { completionWindowParam: _lineParam, ...rest } = request;
  return { ...rest, completionWindow: window, background: true };
}

const SURFACES: Record<string, Surface> = {
  '/v1/responses': {
    refuse: refuseUnsupportedInput,
    validate: compileBody(CreateResponseSchema, '/v1/responses'),
    async run(raw, { service, caller, window, signal }) {
      const body = raw as CreateResponseBody;
      if (body.previous_response_id) {
        throw new SluiceError('invalid_request', 'previous_response_id is not accepted in batch lines: each line is its own conversation', { param: 'previous_response_id' });
      }
      const model = service.registry.resolve(body.model, caller.orgName);
      const prepared = await service.prepare(inBatch(toGenerationRequest(body, caller, model.supportsChat, service.reasoningSeal), window));
      const running = inProgressResponse(newId('resp'), body, prepared);
      // The object says what the line asked for; running in the batch's background is not its doing.
      running['background'] = body.background === true;
      const result = await service.run(prepared, signal, 'batch');
      return { body: finishedResponse(running, result, prepared, service.reasoningSeal), usage: { prepared, results: [result] } };
    },
  },
  '/v1/chat/completions': {
    refuse: refuseUnsupportedChatInput,
    validate: compileBody(CreateChatCompletionSchema, '/v1/chat/completions'),
    async run(raw, { service, caller, window, signal }) {
      const body = raw as CreateChatCompletionBody;
      const model = service.registry.resolve(body.model, caller.orgName);
      const { request, n } = toChatGenerationRequest(body, caller, model.supportsChat);
      // As its endpoint: more choices than the organization's in-flight limit is a 400 naming n.
      service.limits.checkChoices(caller, n);
      const prepared = await service.prepare(inBatch(request, window));
      const created = nowSeconds();
      // One failure (or the line's abort) stops every choice and fails the line.
      const results = await service.runChoices(choicesOf(prepared, n), signal, 'batch');
      const completion = chatCompletion({
        id: completionId(), created, fingerprint: systemFingerprint(service.modelOf(prepared)), prepared, results,
      });
      return { body: completion, usage: { prepared, results } };
    },
  },
  '/v1/messages': {
    refuse: refuseUnsupportedMessageInput,
    validate: compileBody(CreateMessageSchema, '/v1/messages'),
    async run(raw, { service, caller, window, signal }) {
      const body = raw as CreateMessageBody;
      const model = service.registry.resolve(body.model, caller.orgName);
      const prepared = await service.prepare(inBatch(toMessagesGenerationRequest(body, caller, model.supportsChat), window));
      const result = await service.run(prepared, signal, 'batch');
      return { body: messageObject(newId('msg'), prepared, result), usage: { prepared, results: [result] } };
    },
  },
};

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
    const surface = SURFACES[request.url];
    // Validation made every line's url the batch's endpoint; this guards a file changed under us.
    if (!surface) throw new Error(`no batch surface for ${request.url}`);
    // The body parser's limits (nesting depth, prototype keys), which a batch line skips: a 400 line.
    checkJsonValue(request.body);
    surface.refuse(request.body);
    const checked = surface.validate(request.body);
    if (checked.error) throw checked.error;
    const { body, usage } = await surface.run(request.body, opts);
    return { kind: 'ok', line: resultLine(customId, { status_code: 200, request_id: newId('req'), body }, null), usage };
  } catch (err) {
    if (opts.signal.aborted || (isSluiceError(err) && (err.code === 'cancelled' || err.code === 'engine_disposed'))) {
      return { kind: 'aborted' };
    }
    const rendered = renderError(err);
    const { code, message } = rendered.body.error;
    // The body the endpoint itself would have answered: on Messages, Anthropic's type for the status.
    const body = url === '/v1/messages' ? toMessagesEnvelope(rendered.statusCode, rendered.body) : rendered.body;
    return {
      kind: 'error',
      line: resultLine(customId,
        { status_code: rendered.statusCode, request_id: newId('req'), body },
        { code: code ?? rendered.body.error.type, message }),
      ...(rendered.internal && { internal: err }),
    };
  }
}
