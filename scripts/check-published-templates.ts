// Checks the chat templates that real checkpoints publish (Qwen2.5, Qwen3, Llama 3.1-3.3) against
// the serving path, with templates a developer supplies: they are third-party text and are never
// committed here (llama.cpp keeps copies in models/templates/, under the names in
// published-templates/cases.ts). For each template found in --dir, fixed conversations (tools, an
// earlier call and its result, a second user turn, parallel calls, a tool loop; Qwen3 with
// enable_thinking on and off) are rendered through ChatTemplate, as the server renders a
// checkpoint's own template, and checked: the render succeeds, the tools are in the prompt, the
// calls and results show in the template's own forms, the prompt ends with the answer's header;
// the same variables rendered by Python's Jinja2 set up as transformers does give the same bytes;
// model outputs in the family's documented tool-call syntax parse back into the same calls, and
// those calls fed back render. Where we ship a template of the same structure (QWEN3_TEMPLATE),
// its render is compared byte for byte and the differences printed (information, not failure).
//
//   npx tsc -p tsconfig.json && node dist/scripts/check-published-templates.js --dir /tmp/published
//
// Exit 0 when every check passes or there is nothing to check (no --dir, no template in it);
// 1 when a check fails.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { QWEN3_TEMPLATE } from '../models/chat-templates.js';
import { argumentsObject } from '../src/surfaces/tools.js';
import { compileChatTemplate, type ChatMessage, type ChatTemplate, type RenderOptions } from '../src/text/chat-template.js';
import { parseToolCalls, toolCallFormat } from '../src/text/tool-calls.js';
import {
  callForm, CONVERSATIONS, FAMILIES, modelOutputs, TOOL_NAMES, TOOLS, type Conversation, type Family,
} from './published-templates/cases.js';
import { renderWithPython, type ReferenceRender } from './published-templates/reference.js';

const HELP = `usage: node dist/scripts/check-published-templates.js --dir DIR [--python python3] [--show]

  --dir DIR     folder of published templates (${FAMILIES.map((f) => f.file).join(', ')});
                also read from SLUICE_PUBLISHED_TEMPLATES
  --python P    the Python with jinja2 for the reference render (default python3; 'none' skips it)
  --show        print every rendered prompt
`;

const OURS: Record<NonNullable<Family['ours']>, string> = { QWEN3_TEMPLATE };

interface Row {
  template: string;
  check: string;
  result: string;
  ok: boolean;
}

function main(): number {
  const { values } = parseArgs({ options: { dir: { type: 'string' }, python: { type: 'string' }, show: { type: 'boolean' }, help: { type: 'boolean' } } });
  if (values.help) {
    process.stdout.write(HELP);
    return 0;
  }
  const dir = values.dir ?? process.env['SLUICE_PUBLISHED_TEMPLATES'];
  if (dir === undefined || !existsSync(dir)) {
    console.log(`check-published-templates: skipped: ${dir === undefined ? 'no --dir given' : `${dir} does not exist`}`);
    return 0;
  }
  const found = FAMILIES.filter((f) => existsSync(join(dir, f.file)));
  for (const f of FAMILIES) if (!found.includes(f)) console.log(`${f.label}: skipped (${f.file} not in ${dir})`);
  if (found.length === 0) {
    console.log('check-published-templates: skipped: no published template found');
    return 0;
  }
  const rows: Row[] = [];
  const diffs: string[] = [];
  for (const family of found) {
    const source = readFileSync(join(dir, family.file), 'utf8');
    rows.push(...checkFamily(family, source, values.python ?? 'python3', values.show === true, diffs));
  }
  printTable(rows);
  for (const d of diffs) console.log(d);
  const failed = rows.filter((r) => !r.ok).length;
  console.log(failed === 0 ? `\nall ${rows.length} checks passed` : `\n${failed} of ${rows.length} checks failed`);
  return failed === 0 ? 0 : 1;
}

function checkFamily(family: Family, source: string, python: string, show: boolean, diffs: string[]): Row[] {
  const rows: Row[] = [];
  const row = (check: string, problems: string[], okText = 'ok') =>
    rows.push({ template: family.label, check, ok: problems.length === 0, result: problems.length === 0 ? okText : problems.join('; ') });

  const format = toolCallFormat(source);
  const thinks = source.includes('enable_thinking') || source.includes('<think>');
  row('detected: tool syntax, thinking', [
    ...(format === family.format ? [] : [`tool syntax ${format ?? 'none'}, expected ${family.format}`]),
    ...(thinks === family.thinks ? [] : [`thinking ${thinks}, expected ${family.thinks}`]),
  ], `${format}, thinking ${thinks ? 'on/off' : 'no'}`);

  const template = compileChatTemplate(source, family.label);
  const ours = family.ours === undefined ? undefined : compileChatTemplate(OURS[family.ours], family.ours);
  const thinkingModes: Array<boolean | undefined> = family.thinks ? [true, false] : [undefined];
  const renders: Array<{ label: string; conversation: Conversation; options: RenderOptions; thinking: boolean | undefined }> = [];
  for (const conversation of CONVERSATIONS) {
    for (const thinking of thinkingModes) {
      const label = conversation.name + (thinking === undefined ? '' : thinking ? ', thinking' : ', no thinking');
      renders.push({
        label, conversation, thinking,
        options: { bosToken: family.bosToken, eosToken: family.eosToken, ...(conversation.tools && { tools: TOOLS }),
          ...(thinking !== undefined && { enableThinking: thinking }) },
      });
    }
  }

  const contexts = renders.map((r) => template.context(r.conversation.messages, r.options));
  const reference = python === 'none' ? { unavailable: 'skipped (--python none)' } : renderWithPython(python, source, contexts);
  if ('unavailable' in reference) console.log(`${family.label}: no reference render: ${reference.unavailable}`);

  renders.forEach((r, i) => {
    const rendered = tryRender(template, r.conversation.messages, r.options);
    if ('error' in rendered) {
      row(r.label, [`render failed: ${rendered.error}`]);
      return;
    }
    const prompt = rendered.text;
    if (show) console.log(`----- ${family.label} ${r.label}\n${prompt}\n-----`);
    const problems = promptProblems(family, r.conversation, r.thinking, prompt);
    if ('renders' in reference) {
      const ref: ReferenceRender = reference.renders[i]!;
      if ('error' in ref) problems.push(`Python render failed: ${ref.error}`);
      else if (ref.text !== prompt) problems.push(`differs from the Python render: ${firstDifference(prompt, ref.text)}`);
    }
    const split = contexts[i]!.messages.length !== r.conversation.messages.length ? ', calls one per turn' : '';
    row(r.label, problems, 'ok' + ('renders' in reference ? ', = Python' : '') + split);
    if (ours !== undefined) {
      const own = tryRender(ours, r.conversation.messages, r.options);
      const ownText = 'text' in own ? own.text : `(render failed: ${own.error})`;
      const diff = ownText === prompt ? 'identical' : lineDiff(ownText, prompt);
      const same = diffs.findIndex((d) => d.endsWith(`\n${diff}`));
      diffs.push(`\n${family.ours} vs ${family.file}, ${r.label}` +
        (diff === 'identical' ? ': identical' : same >= 0 ? ': the differences above' : ` (- ours, + published):\n${diff}`));
    }
  });

  for (const output of modelOutputs(family.format)) rows.push(parseRow(family, template, output));
  return rows;
}

function tryRender(template: ChatTemplate, messages: ChatMessage[], options: RenderOptions): { text: string } | { error: string } {
  try {
    return { text: template.render(messages, options) };
  } catch (err) {
    return { error: (err as Error).message };
  }
}

/** What the prompt must show for one conversation. */
function promptProblems(family: Family, conversation: Conversation, thinking: boolean | undefined, prompt: string): string[] {
  const problems: string[] = [];
  if (conversation.tools) {
    for (const needle of ['lookup_tide', 'convert_units', 'High and low water for a harbour on a day', 'harbour', 'metres', 'fathoms']) {
      if (!prompt.includes(needle)) problems.push(`tools: '${needle}' missing`);
    }
  }
  let from = 0;
  conversation.calls.forEach((c, k) => {
    const at = prompt.indexOf(callForm(family.format, c), from);
    if (at < 0) {
      problems.push(`call ${c.function.name} not in the form ${JSON.stringify(callForm(family.format, c))}`);
      return;
    }
    const result = conversation.results[k]!;
    const shown = family.format === 'hermes'
      ? [`<tool_response>\n${result}\n</tool_response>`]
      : [`ipython<|end_header_id|>\n\n${result}<|eot_id|>`, `ipython<|end_header_id|>\n\n${JSON.stringify(result)}<|eot_id|>`];
    const resultAt = Math.max(...shown.map((s) => prompt.indexOf(s, at)));
    if (resultAt < 0) problems.push(`result ${k + 1} not after its call`);
    from = at + 1;
  });
  for (const text of conversation.holds) if (!prompt.includes(text)) problems.push(`'${text}' missing`);
  if (family.thinks) {
    const wanted = conversation.reasoningAfterLastQuery;
    if (wanted !== undefined && !prompt.includes(`<think>\n${wanted}\n</think>`)) problems.push('reasoning of the tool loop not shown');
    if (prompt.includes('Old reasoning')) problems.push('reasoning before the last user turn shown');
  }
  const ending = family.generationPrompt + (thinking === false ? '<think>\n\n</think>\n\n' : '');
  if (!prompt.endsWith(ending)) problems.push(`does not end with ${JSON.stringify(ending)}`);
  if (family.bosToken !== '' && !prompt.startsWith(family.bosToken)) problems.push('no bos at the start');
  return problems;
}

/** A model output in the family's syntax: parsed into the same calls, and those calls fed back render. */
function parseRow(family: Family, template: ChatTemplate, output: ReturnType<typeof modelOutputs>[number]): Row {
  const problems: string[] = [];
  const { calls } = parseToolCalls(output.text, family.format, TOOL_NAMES);
  const got = calls.map((c) => ({ name: c.name, arguments: JSON.parse(c.arguments) as unknown }));
  const want = output.calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
  if (JSON.stringify(got) !== JSON.stringify(want)) problems.push(`parsed ${JSON.stringify(got)}`);
  else {
    // As a client sends them back: OpenAI calls with arguments as JSON text, then the results.
    const replayed = calls.map((c, k) => ({ id: `call_r${k}`, type: 'function' as const, function: { name: c.name, arguments: argumentsObject(c.arguments, 'arguments') } }));
    const messages: ChatMessage[] = [
      { role: 'user', content: 'Go.' },
      { role: 'assistant', content: '', tool_calls: replayed },
      ...replayed.map((c): ChatMessage => ({ role: 'tool', content: '{"done": true}', tool_call_id: c.id })),
    ];
    const fed = tryRender(template, messages, { bosToken: family.bosToken, tools: TOOLS });
    if ('error' in fed) problems.push(`fed back: ${fed.error}`);
    else for (const c of output.calls) if (!fed.text.includes(callForm(family.format, c))) problems.push(`fed back: ${c.function.name} not shown`);
  }
  return { template: family.label, check: `parse: ${output.name}`, ok: problems.length === 0, result: problems.length === 0 ? `${calls.length} call(s), fed back ok` : problems.join('; ') };
}

function firstDifference(a: string, b: string): string {
  let i = 0;
  while (i < a.length && a[i] === b[i]) i++;
  return `at ${i}: ours ${JSON.stringify(a.slice(i, i + 40))}, Python ${JSON.stringify(b.slice(i, i + 40))}`;
}

/** A line diff (longest common subsequence; prompts are short). */
function lineDiff(a: string, b: string): string {
  const x = a.split('\n');
  const y = b.split('\n');
  const lcs: number[][] = Array.from({ length: x.length + 1 }, () => new Array<number>(y.length + 1).fill(0));
  for (let i = x.length - 1; i >= 0; i--) {
    for (let j = y.length - 1; j >= 0; j--) lcs[i]![j] = x[i] === y[j] ? lcs[i + 1]![j + 1]! + 1 : Math.max(lcs[i + 1]![j]!, lcs[i]![j + 1]!);
  }
  const lines: string[] = [];
  let i = 0;
  let j = 0;
  while (i < x.length || j < y.length) {
    if (i < x.length && j < y.length && x[i] === y[j]) {
      lines.push(`  ${x[i++]}`);
      j++;
    } else if (j < y.length && (i === x.length || lcs[i]![j + 1]! >= lcs[i + 1]![j]!)) lines.push(`+ ${y[j++]}`);
    else lines.push(`- ${x[i++]}`);
  }
  // Changed lines with one line of context; '...' where unchanged lines are left out.
  const near = (k: number) => [k - 1, k, k + 1].some((n) => lines[n] !== undefined && !lines[n]!.startsWith('  '));
  const out: string[] = [];
  lines.forEach((line, k) => {
    if (near(k)) out.push(line);
    else if (out[out.length - 1] !== '...') out.push('...');
  });
  return out.join('\n');
}

function printTable(rows: Row[]): void {
  const w1 = Math.max('template'.length, ...rows.map((r) => r.template.length));
  const w2 = Math.max('check'.length, ...rows.map((r) => r.check.length));
  console.log(`\n${'template'.padEnd(w1)} | ${'check'.padEnd(w2)} | pass | result`);
  console.log(`${'-'.repeat(w1)}-|-${'-'.repeat(w2)}-|------|-------`);
  for (const r of rows) console.log(`${r.template.padEnd(w1)} | ${r.check.padEnd(w2)} | ${r.ok ? 'yes ' : 'NO  '} | ${r.result}`);
}

process.exitCode = main();
