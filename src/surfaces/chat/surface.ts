// The Chat Completions surface as a value (surface.ts): POST /v1/chat/completions bodies, in a route
// or a batch line. Chat has no GET: its completion callback carries the object the reply returns,
// and a failed completion's callback the failed object (webhooks/events.ts).

import { failedChatCompletion } from '../../webhooks/events.js';
import type { EndObject } from '../../serving/lifecycle.js';
import { nowSeconds } from '../content.js';
import type { Surface } from '../surface.js';
import { chatCompletion, completionId, refuseUnsupportedChatInput, systemFingerprint, toChatGenerationRequest } from './adapter.js';
import { CreateChatCompletionSchema, type ChatCompletion, type CreateChatCompletionBody } from './schema.js';

export const chatSurface: Surface<CreateChatCompletionBody, ChatCompletion & EndObject> = {
  path: '/v1/chat/completions',
  usage: 'chat.completions',
  schema: CreateChatCompletionSchema,
  refuse: refuseUnsupportedChatInput,
  adapt: (body, caller, model) => toChatGenerationRequest(body, caller, model.supportsChat),
  open(_body, prepared) {
    const id = completionId();
    const created = nowSeconds();
    return {
      id,
      render: (results) => chatCompletion({ id, created, fingerprint: systemFingerprint(prepared.model), prepared, results }) as ChatCompletion & EndObject,
      // A completion whose end could not be stored is a 500 with no callback.
      failed: (err, stage) => stage === 'run'
        ? failedChatCompletion({ id, created, model: prepared.request.model }, err) as (ChatCompletion & EndObject) | undefined
        : undefined,
    };
  },
  envelope: (_status, body) => body,
};
