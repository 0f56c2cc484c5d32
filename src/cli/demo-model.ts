// The tiny demo model that `sluice generate` uses when no --model is given:
// $SLUICE_HOME/models/tiny (SLUICE_HOME defaults to ~/.cache/sluice), made on first use.

import { existsSync } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { makeModel } from '../../models/make-model.js';
import { modelCacheDir } from '../engine/paths.js';

export const DEMO_PRESET = 'tiny';

export function demoModelDir(): string {
  return join(modelCacheDir(), DEMO_PRESET);
}

/**
 * Returns the demo model directory, making it first if it is missing. A directory is complete
 * when it has config.json (makeModel writes it last); it is built under a temporary name and
 * renamed, so an interrupted run never leaves a half-written model behind.
 */
export async function ensureDemoModel(onProgress: (message: string) => void): Promise<string> {
  const dir = demoModelDir();
  if (existsSync(join(dir, 'config.json'))) return dir;
  onProgress('making the tiny demo model…');
  const tmpDir = `${dir}.tmp-${process.pid}`;
  await rm(tmpDir, { recursive: true, force: true });
  await makeModel({ preset: DEMO_PRESET, out: tmpDir });
  await rm(dir, { recursive: true, force: true });
  await rename(tmpDir, dir);
  onProgress(`made ${dir}`);
  return dir;
}
