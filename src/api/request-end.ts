// The one way a request's end is written (every surface, foreground and background): the store's
// commitRequestEnd with the completion webhook delivery it implies, then a wake-up for the
// dispatcher. Contract: nothing of the end is visible before the commit, all of it is after, and
// the dispatcher is woken only after the commit (so it never looks before the delivery exists).

import type { RequestEnd, RequestEndCommit, Store } from '../store/store.js';
import type { WebhookDispatcher } from '../webhooks/dispatcher.js';

/** A completion callback the end may owe: `metadata` is the request's (it holds the token). */
export interface CallbackOf {
  orgId: string;
  metadata: unknown;
  /** The object the receiver gets (the terminal Response, the chat.completion...). */
  body: Record<string, unknown> & { id: string };
}

export async function commitRequestEnd(store: Store, webhooks: WebhookDispatcher | undefined, end: RequestEnd,
  callback?: CallbackOf): Promise<RequestEndCommit> {
  const delivery = callback && webhooks?.deliveryFor(callback.orgId, callback.metadata, callback.body);
  if (!delivery && Object.keys(end).length === 0) return { batchResultRecorded: false }; // nothing to write
  const committed = await store.commitRequestEnd(delivery ? { ...end, delivery } : end);
  if (delivery && !committed.backgroundLeaseLost) webhooks?.wake();
  return committed;
}
