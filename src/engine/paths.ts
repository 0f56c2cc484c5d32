// Where sluice keeps generated models and other cached state: $SLUICE_HOME or ~/.cache/sluice.
import os from 'node:os';
import { join } from 'node:path';

export function sluiceHome(): string {
  return process.env.SLUICE_HOME ?? join(os.homedir(), '.cache', 'sluice');
}

export function modelCacheDir(): string {
  return join(sluiceHome(), 'models');
}
