// The Messages surface as a value (surface.ts): POST /v1/messages bodies, in a route or a batch
// line. A failed message ends with nothing stored (Messages has no completion callback).

import type { EndObject } from '../../serving/lifecycle.js';
import { newId } from '../content.js';
import type { Surface } from '../surface.js';
import { messageObject, refuseUnsupportedMessageInput, toMessagesGenerationRequest } from './adapter.js';
import { toMessagesEnvelope } from './envelope.js';
import { CreateMessageSchema, type CreateMessageBody, type MessageObject } from './schema.js';

export const messagesSurface: Surface<CreateMessageBody, MessageObject & EndObject> = {
  path: '/v1/messages',
  usage: 'messages',
  schema: CreateMessageSchema,
  refuse: refuseUnsupportedMessageInput,
  adapt: (body, caller, model) => ({ request: toMessagesGenerationRequest(body, caller, model.supportsChat), n: 1 }),
  open(_body, prepared) {
    const id = newId('msg');
    return {
      id,
      render: (results) => messageObject(id, prepared, results[0]!) as MessageObject & EndObject,
      failed: () => undefined,
    };
  },
  envelope: toMessagesEnvelope,
};
