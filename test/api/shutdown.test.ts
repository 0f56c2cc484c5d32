// Shutdown: a request in flight when close begins completes, and close does not wait for its
// keep-alive connection to time out.
import { describe, expect, it } from 'vitest';
import { startTestServer } from '../helpers/api-server.js';

describe('close', () => {
  it('finishes in-flight requests and closes their keep-alive connections promptly', async () => {
    const server = await startTestServer();
    const inflight = fetch(`${server.baseUrl}/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', input: 'Tell me a long story', max_output_tokens: 300, temperature: 0 }),
    });
    await new Promise((r) => setTimeout(r, 100));
    const started = Date.now();
    await server.close();
    const res = await inflight;
    expect(res.status).toBe(200);
    expect(res.headers.get('connection')).toBe('close');
    expect(((await res.json()) as { object: string }).object).toBe('response');
    // Far below fastify's 72 s keep-alive timeout (not a timing claim about speed: it either waits or not).
    expect(Date.now() - started).toBeLessThan(30_000);
  });
});
