#!/usr/bin/env node
// The sluice command line: argument handling only; the work lives in the modules it calls.

import './cli/threadpool.js';  // first: before anything uses the thread pool
import { isSluiceError } from './errors.js';
import { ADAPTERS_HELP, runAdapters } from './cli/adapters.js';
import { GENERATE_HELP, runGenerate } from './cli/generate.js';
import { KEYS_HELP, runKeys } from './cli/keys.js';
import { MAKE_MODEL_HELP, runMakeModel } from './cli/make-model.js';
import { MODELS_HELP, runModels } from './cli/models.js';
import { SERVE_HELP, runServe } from './cli/serve.js';
import { USAGE_HELP, runUsage } from './cli/usage.js';
import { cliMessage } from './cli/args.js';
import { sluiceVersion } from './version.js';

const HELP = `usage: sluice <command> [options]

commands:
  serve        run the HTTP API (sluice serve --help)
  models       the models serve would serve, with context length and prices (sluice models --help)
  keys         create, list and revoke API keys (sluice keys --help)
  usage        usage and cost totals from the ledger (sluice usage --help)
  adapters     list, load and unload LoRA adapters on a running server (sluice adapters --help)
  generate     generate text with a model (sluice generate --help)
  make-model   write a demo / benchmark model with random weights (sluice make-model --help)

  sluice --help          this text
  sluice --version       the version
  sluice <command> -h    help for a command
`;

const COMMANDS: Record<string, { run: (args: string[]) => Promise<void>; help: string }> = {
  serve: { run: runServe, help: SERVE_HELP },
  models: { run: runModels, help: MODELS_HELP },
  keys: { run: runKeys, help: KEYS_HELP },
  usage: { run: runUsage, help: USAGE_HELP },
  adapters: { run: runAdapters, help: ADAPTERS_HELP },
  generate: { run: runGenerate, help: GENERATE_HELP },
  'make-model': { run: runMakeModel, help: MAKE_MODEL_HELP },
};

async function main(argv: string[]): Promise<number> {
  const [command, ...args] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    if (command === 'help' && args[0] !== undefined && COMMANDS[args[0]]) process.stdout.write(COMMANDS[args[0]]!.help);
    else process.stdout.write(HELP);
    return command === undefined ? 1 : 0;
  }
  if (command === '--version' || command === '-v' || command === 'version') {
    process.stdout.write(`sluice ${sluiceVersion()}\n`);
    return 0;
  }
  const entry = Object.hasOwn(COMMANDS, command) ? COMMANDS[command] : undefined;
  if (!entry) {
    process.stderr.write(`sluice: unknown command "${command}"\n\n${HELP}`);
    return 1;
  }
  await entry.run(args);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (err: unknown) => {
    // Expected failures (SluiceError) print their message only; anything else is a bug, and
    // SLUICE_DEBUG=1 shows its stack.
    const message = isSluiceError(err) ? cliMessage(err)
      : !process.env['SLUICE_DEBUG'] ? (err as Error)?.message ?? String(err)
        : (err as Error)?.stack ?? String(err);
    process.stderr.write(`sluice: ${message}\n`);
    process.exitCode = 1;
  },
);
