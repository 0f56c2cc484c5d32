// Placeholder: filled in by the surface's own change.

import type { FastifyInstance } from 'fastify';
import type { ApiContext } from '../context.js';

export function registerMessageRoutes(_app: FastifyInstance, _ctx: ApiContext): void {}
