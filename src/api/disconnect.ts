// Client disconnects as an AbortSignal, so a foreground generation stops when nobody is left to
// read its result (the engine frees the sequence's KV blocks at once).

import type { FastifyReply } from 'fastify';

/**
 * Aborts when the client goes away before the reply was sent. Contract: 'close' after a finished
 * write is the normal end of a response and aborts nothing.
 */
export function disconnectSignal(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  return controller.signal;
}
