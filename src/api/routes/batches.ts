// Placeholder: filled in by the batches change.

import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';

export async function registerBatchRoutes(_app: FastifyInstance, _ctx: ApiContext): Promise<void> {}
