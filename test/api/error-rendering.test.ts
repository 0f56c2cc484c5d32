// renderError's mappings of SluiceError codes that other layers raise (rate limits, a broken
// engine, over-long input): status, envelope type and code, and the Retry-After of a 429.
import { describe, expect, it } from 'vitest';
import { renderError } from '../../src/surfaces/errors.js';
import { SluiceError } from '../../src/errors.js';

function rateLimited(message: string, retryAfterSeconds?: number): SluiceError {
  const err = new SluiceError('rate_limit_exceeded', message);
  if (retryAfterSeconds !== undefined) Object.assign(err, { retryAfterSeconds });
  return err;
}

describe('renderError', () => {
  it('renders rate_limit_exceeded as a 429 rate_limit_error with Retry-After in whole seconds, rounded up', () => {
    const rendered = renderError(rateLimited('too many requests for organization "acme"', 1.2));
    expect(rendered.statusCode).toBe(429);
    expect(rendered.headers).toEqual({ 'retry-after': '2' });
    expect(rendered.body).toEqual({
      error: { message: 'too many requests for organization "acme"', type: 'rate_limit_error', param: null, code: 'rate_limit_exceeded', retry_after: 2 },
    });
    expect(rendered.internal).toBe(false);
  });

  it('renders a 429 without a known wait with no Retry-After', () => {
    const rendered = renderError(rateLimited('slow down'));
    expect(rendered.statusCode).toBe(429);
    expect(rendered.headers).toBeUndefined();
    expect(rendered.body.error).toEqual({ message: 'slow down', type: 'rate_limit_error', param: null, code: 'rate_limit_exceeded' });
  });

  it('renders engine_broken as a 503 server_error that keeps its client-safe message', () => {
    const rendered = renderError(new SluiceError('engine_broken', 'the engine of model "tiny" failed and must be restarted'));
    expect(rendered.statusCode).toBe(503);
    expect(rendered.body.error).toEqual({
      message: 'the engine of model "tiny" failed and must be restarted', type: 'server_error', param: null, code: 'engine_broken',
    });
    expect(rendered.headers).toBeUndefined();
  });

  it('renders input_too_long as a 400 naming its param', () => {
    const rendered = renderError(new SluiceError('input_too_long', 'input is longer than 1000000 characters', { param: 'input' }));
    expect(rendered.statusCode).toBe(400);
    expect(rendered.body.error).toEqual({ message: 'input is longer than 1000000 characters', type: 'invalid_request_error', param: 'input', code: 'input_too_long' });
  });
});
