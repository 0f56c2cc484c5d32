// Placeholder: filled in by the files change.

import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';

export async function registerFileRoutes(_app: FastifyInstance, _ctx: ApiContext): Promise<void> {}
