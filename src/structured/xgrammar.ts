// Loads xgrammar's WebAssembly build (@mlc-ai/web-xgrammar). The package ships one UMD bundle
// made for browsers and bundlers; under Node's ESM loader its CommonJS branch never runs, so it
// is evaluated here as CommonJS (exports, module, require, __filename), once per process.

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import vm from 'node:vm';

import type * as XGrammar from '@mlc-ai/web-xgrammar';

export type XGrammarModule = typeof XGrammar;

let loaded: XGrammarModule | undefined;

export function xgrammar(): XGrammarModule {
  if (loaded === undefined) {
    const require = createRequire(import.meta.url);
    const file = require.resolve('@mlc-ai/web-xgrammar');
    const module = { exports: {} as Record<string, unknown> };
    // A CommonJS wrapper, compiled in this context; its one dynamic import('module') resolves
    // through Node's own loader.
    const source = `(function (exports, module, require, __filename, __dirname) {${readFileSync(file, 'utf8')}\n})`;
    const factory = new vm.Script(source, {
      filename: file,
      importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
    }).runInThisContext() as (...args: unknown[]) => void;
    factory(module.exports, module, require, file, dirname(file));
    loaded = module.exports as unknown as XGrammarModule;
  }
  return loaded;
}
