// Every surface by its path: what a batch line's url selects, and what the routes bind.

import { chatSurface } from './chat/surface.js';
import { messagesSurface } from './messages/surface.js';
import { responsesSurface } from './responses/surface.js';
import type { Surface, SurfacePath } from './surface.js';

export const SURFACES: Readonly<Record<SurfacePath, Surface<any, any>>> = {
  '/v1/responses': responsesSurface,
  '/v1/chat/completions': chatSurface,
  '/v1/messages': messagesSurface,
};

export function surfaceFor(path: string): Surface<any, any> | undefined {
  return Object.hasOwn(SURFACES, path) ? SURFACES[path as SurfacePath] : undefined;
}
