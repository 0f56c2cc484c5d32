// What every bench result records about the machine it ran on.
import os from 'node:os';

export interface MachineInfo {
  cpu: string | undefined;
  cores: number;
  memoryBytes: number;
  platform: string;
  node: string;
}

export function machineInfo(): MachineInfo {
  const cpus = os.cpus();
  return { cpu: cpus[0]?.model, cores: cpus.length, memoryBytes: os.totalmem(), platform: `${os.platform()} ${os.release()}`, node: process.version };
}
