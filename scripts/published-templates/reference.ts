// A second renderer for the published-template check: Python's Jinja2 set up the way transformers'
// apply_chat_template sets it up (sandboxed, trim_blocks and lstrip_blocks, loop controls, a tojson
// that keeps non-ASCII and takes indent, raise_exception, strftime_now). Same template, same
// variables: a prompt that differs means @huggingface/jinja reads the template differently.

import { spawnSync } from 'node:child_process';

const PYTHON = `
import json, sys
from datetime import datetime
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
request = json.load(sys.stdin)
template = env.from_string(request["template"])
out = []
for context in request["contexts"]:
    try:
        out.append({"text": template.render(**context)})
    except Exception as err:
        out.append({"error": type(err).__name__ + ": " + str(err)})
json.dump(out, sys.stdout)
`;

export type ReferenceRender = { text: string } | { error: string };

/**
 * Renders `source` with each context in Python; `unavailable` (why) when that Python or its jinja2
 * package is not there.
 */
export function renderWithPython(python: string, source: string, contexts: readonly Record<string, unknown>[]):
  { renders: ReferenceRender[] } | { unavailable: string } {
  const run = spawnSync(python, ['-c', PYTHON], {
    input: JSON.stringify({ template: source, contexts }), encoding: 'utf8', maxBuffer: 64 << 20,
  });
  if (run.error !== undefined) return { unavailable: `${python}: ${run.error.message}` };
  if (run.status !== 0) return { unavailable: `${python} failed: ${run.stderr.trim().split('\n').pop() ?? ''}` };
  return { renders: JSON.parse(run.stdout) as ReferenceRender[] };
}
