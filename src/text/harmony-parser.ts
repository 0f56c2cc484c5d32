// Reads gpt-oss output in OpenAI's harmony format into reasoning, answer text and tool calls, as the
// text arrives (push) or whole (parseHarmony). The generation prompt ends in `<|start|>assistant`,
// so the output is a sequence of messages whose first header has no <|start|> and no role:
//   <|channel|>analysis<|message|>{reasoning}<|end|>
//   <|start|>assistant<|channel|>final<|message|>{answer}             (<|return|>: eos, not in the text)
//   <|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json}  (<|call|>)
// The recipient may also stand before the channel (` to=functions.{name}<|channel|>commentary json`),
// as the published template writes calls in the prompt.
//
// Where each message goes: analysis -> reasoning; final, commentary without a recipient (a
// preamble) and unknown channels -> content; a message with a recipient -> a tool call when it
// names functions.{an offered name} and its body is a JSON object, else its raw text (header
// included) stays where its channel would put it, as a hermes block that does not parse stays
// text. Nothing is lost: text outside any well-formed message (no header, a header without
// <|message|> or over MAX_HEADER_CHARS) is content, verbatim; only whitespace between messages and
// a header cut short by the end of the output (structure, no text) are dropped. Messages of one
// kind are joined by '\n'.
// NOTE: the markers reach the text only because the tokenizer keeps them when decoding a harmony
// model's output (tokenizer.ts structuralTokenIds).

export const HARMONY = {
  start: '<|start|>',
  end: '<|end|>',
  message: '<|message|>',
  channel: '<|channel|>',
  constrain: '<|constrain|>',
  return: '<|return|>',
  call: '<|call|>',
} as const;

const MARKERS: readonly string[] = Object.values(HARMONY);
/** Markers that end a message body (<|start|> without <|end|> before it: the next message began). */
const BODY_ENDS: readonly string[] = [HARMONY.end, HARMONY.return, HARMONY.call, HARMONY.start];
/** A header longer than this without <|message|> is not a header (real ones are under 150). */
export const MAX_HEADER_CHARS = 256;
/** How a message may begin; the output's first one has no <|start|> and may name its recipient first. */
const HEADER_STARTS: readonly string[] = [HARMONY.start, HARMONY.channel];
const FIRST_HEADER_STARTS: readonly string[] = [...HEADER_STARTS, 'to='];

export type HarmonyEvent =
  | { type: 'reasoning'; text: string }
  | { type: 'content'; text: string }
  | { type: 'tool_call'; name: string; arguments: string };

/** Where a message went. */
export type HarmonyMessageKind = 'reasoning' | 'content' | 'tool_call';

interface OpenMessage {
  /** 'call': a message with a recipient, read whole and parsed when it ends. */
  kind: 'reasoning' | 'content' | 'call';
  /** Where the raw text of a call that does not parse goes. */
  fallback: 'reasoning' | 'content';
  recipient?: string;
  /** The header as written (with <|start|> and <|message|>), for a call that stays text. */
  raw: string;
  /** A call's body so far. */
  body: string;
}

/** The earliest of `needles` in `text` at or after `from`: [index, needle], or undefined. */
function earliest(text: string, needles: readonly string[], from = 0): [number, string] | undefined {
  let best: [number, string] | undefined;
  for (const needle of needles) {
    const i = text.indexOf(needle, from);
    if (i >= 0 && (best === undefined || i < best[0])) best = [i, needle];
  }
  return best;
}

/** Characters at the end of `text` that may be the start of a marker (held until the next text). */
function markerPrefixLength(text: string): number {
  const lt = text.lastIndexOf('<');
  if (lt < 0) return 0;
  const tail = text.slice(lt);
  return MARKERS.some((m) => m.startsWith(tail) && m !== tail) ? tail.length : 0;
}

/** What a header is made of (a header cut short holding nothing else is dropped). */
const HEADER_WORDS = ['assistant', 'analysis', 'commentary', 'final', 'json', HARMONY.start, HARMONY.channel, HARMONY.constrain];
const HEADER_PIECES = /<\|(start|channel|constrain)\|>|\bto=\S*|\b(assistant|analysis|commentary|final|json)\b/g;

/** Whether a cut header holds only header words, the last perhaps cut too. */
function onlyHeaderWords(text: string): boolean {
  const rest = text.replace(HEADER_PIECES, ' ').trim();
  return rest === '' || (!/\s/.test(rest) && HEADER_WORDS.some((w) => w.startsWith(rest)));
}

const couldStart = (text: string, starts: readonly string[]) => starts.some((s) => text.startsWith(s) || s.startsWith(text));

/** A header's parts (without <|start|> and <|message|>): `assistant to=functions.f<|channel|>commentary json`. */
function readHeader(header: string): { channel?: string; recipient?: string } {
  const channel = /<\|channel\|>\s*([^\s<]+)/.exec(header)?.[1];
  const recipient = /(?:^|\s|\|>)to=([^\s<]+)/.exec(header)?.[1];
  return { ...(channel !== undefined && { channel }), ...(recipient !== undefined && { recipient }) };
}

/** A call's arguments: a JSON object's text (an empty body is no arguments), else undefined. */
function callArguments(body: string): string | undefined {
  const text = body.trim();
  if (text === '') return '{}';
  try {
    const value = JSON.parse(text) as unknown;
    return typeof value === 'object' && value !== null && !Array.isArray(value) ? JSON.stringify(value) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Incremental reader: push() each piece of text as it is generated, end() once. Each returns the
 * events the text completed: reasoning and content as deltas (text that might still turn out to
 * be a marker is held back), a tool call whole when its message ends.
 */
export class HarmonyParser {
  /** Text received and not yet consumed; in the header phase it starts at the header's start. */
  private buffer = '';
  private phase: 'header' | 'body' | 'between' = 'between';
  /** No message has begun yet. */
  private first = true;
  private message: OpenMessage | undefined;
  private events: HarmonyEvent[] = [];
  private readonly emitted = { reasoning: false, content: false };
  private readonly separate = { reasoning: false, content: false };
  private ended = false;

  // Read after end(): what the output held, beyond its events.
  /** Kinds of the messages an <|end|> closed, in order (for counting their tokens). */
  readonly endedKinds: HarmonyMessageKind[] = [];
  /** The kind of the message after the last <|end|>, when there was one. */
  tailKind: HarmonyMessageKind | undefined;
  /** Whether an analysis message began (reasoning is then a string, possibly ''). */
  sawReasoning = false;
  /** Whether the text ended inside an analysis message (cut while reasoning). */
  reasoningOpen = false;

  /** @param offered the function names the request offered (calls to others stay text). */
  constructor(private readonly offered: ReadonlySet<string>) {}

  push(text: string): HarmonyEvent[] {
    if (this.ended) throw new Error('HarmonyParser.push after end()');
    this.buffer += text;
    while (this.step()) { /* each step consumes text or changes phase */ }
    return this.take();
  }

  /** The end of the output: a message still open ends here (its eos token is not in the text). */
  end(): HarmonyEvent[] {
    if (this.ended) return [];
    this.ended = true;
    while (this.step()) { /* consume what is complete */ }
    if (this.phase === 'header') {
      // A header cut short is structure, not text: dropped, unless it holds more than a header's words.
      if (!onlyHeaderWords(this.buffer)) this.emit('content', this.buffer);
    } else if (this.phase === 'body') {
      this.reasoningOpen = this.message!.kind === 'reasoning';
      this.deliver(this.buffer);
      this.tailKind = this.finish();
    }
    this.buffer = '';
    return this.take();
  }

  /** One move of the state machine; false when it needs more text. */
  private step(): boolean {
    if (this.phase === 'between') return this.stepBetween();
    if (this.phase === 'header') return this.stepHeader();
    return this.stepBody();
  }

  /** Before a message: whitespace is dropped, a header begins, or text outside any message is content. */
  private stepBetween(): boolean {
    const rest = this.buffer.trimStart();
    const starts = this.first ? FIRST_HEADER_STARTS : HEADER_STARTS;
    if (starts.some((s) => rest.startsWith(s))) {
      // Whitespace before a recipient is the header's (` to=functions.f`): kept, for a call that stays text.
      if (!rest.startsWith('to=')) this.buffer = rest;
      this.phase = 'header';
      return true;
    }
    if (rest === '' || (!this.ended && couldStart(rest, starts))) {
      if (this.ended) this.buffer = '';
      return false;
    }
    this.open({ kind: 'content', fallback: 'content', raw: '', body: '' });
    return true;
  }

  private stepHeader(): boolean {
    const text = this.buffer;
    const started = text.startsWith(HARMONY.start);
    const from = started ? HARMONY.start.length : 0;
    const found = earliest(text, [HARMONY.message, ...BODY_ENDS], from);
    if (found !== undefined && found[1] === HARMONY.message) {
      const header = text.slice(from, found[0]);
      const raw = text.slice(0, found[0] + HARMONY.message.length);
      this.buffer = text.slice(raw.length);
      const { channel, recipient } = readHeader(header);
      const fallback = channel === 'analysis' ? 'reasoning' : 'content';
      if (recipient !== undefined) {
        this.open({ kind: 'call', fallback, recipient, raw, body: '' });
      } else {
        this.open({ kind: fallback, fallback, raw, body: '' });
        // A header with no channel is not harmony's: it stays text, unless it is a bare role.
        if (channel === undefined && !/^\s*(assistant)?\s*$/.test(header)) this.deliver(raw);
      }
      return true;
    }
    if (found === undefined && text.length <= MAX_HEADER_CHARS) return false;
    // Not a header: its text is content, up to the marker that ended it (read as a body's end).
    this.open({ kind: 'content', fallback: 'content', raw: '', body: '' });
    if (started) {
      this.deliver(HARMONY.start);
      this.buffer = text.slice(HARMONY.start.length);
    }
    return true;
  }

  private stepBody(): boolean {
    const text = this.buffer;
    const found = earliest(text, BODY_ENDS);
    if (found === undefined) {
      const hold = this.ended ? 0 : markerPrefixLength(text);
      this.deliver(text.slice(0, text.length - hold));
      this.buffer = text.slice(text.length - hold);
      return false;
    }
    const [at, marker] = found;
    this.deliver(text.slice(0, at));
    const kind = this.finish();
    if (marker === HARMONY.start) {
      this.buffer = text.slice(at);
      this.phase = 'header';
    } else {
      this.buffer = text.slice(at + marker.length);
      this.phase = 'between';
      if (marker === HARMONY.end) this.endedKinds.push(kind);
    }
    return true;
  }

  private open(message: OpenMessage): void {
    this.message = message;
    this.phase = 'body';
    this.first = false;
    if (message.kind === 'reasoning') this.sawReasoning = true;
    for (const k of ['reasoning', 'content'] as const) this.separate[k] = this.emitted[k];
  }

  /** Body text of the open message: emitted, or kept for a call. */
  private deliver(text: string): void {
    const message = this.message!;
    if (message.kind === 'call') message.body += text;
    else this.emit(message.kind, text);
  }

  /** Closes the open message; a call becomes an event, or its raw text when it is not one. */
  private finish(): HarmonyMessageKind {
    const message = this.message!;
    this.message = undefined;
    if (message.kind !== 'call') return message.kind;
    const name = /^functions\.(.+)$/.exec(message.recipient ?? '')?.[1];
    const args = name !== undefined && this.offered.has(name) ? callArguments(message.body) : undefined;
    if (args !== undefined) {
      this.events.push({ type: 'tool_call', name: name!, arguments: args });
      return 'tool_call';
    }
    this.emit(message.fallback, message.raw + message.body);
    return message.fallback;
  }

  private emit(type: 'reasoning' | 'content', text: string): void {
    if (text === '') return;
    if (type === 'reasoning') this.sawReasoning = true;
    const piece = this.separate[type] ? `\n${text}` : text;
    this.separate[type] = false;
    this.emitted[type] = true;
    const last = this.events[this.events.length - 1];
    if (last !== undefined && last.type === type) last.text += piece;
    else this.events.push({ type, text: piece });
  }

  private take(): HarmonyEvent[] {
    const out = this.events;
    this.events = [];
    return out;
  }
}

export interface HarmonyTurn {
  /** The analysis messages' text; undefined when there was none. */
  reasoning: string | undefined;
  content: string;
  calls: { name: string; arguments: string }[];
  /** The output ended inside an analysis message. */
  reasoningOpen: boolean;
  endedKinds: HarmonyMessageKind[];
  tailKind: HarmonyMessageKind | undefined;
}

/** A whole output, read as the incremental reader reads it in pieces. */
export function parseHarmony(text: string, offered: ReadonlySet<string>): HarmonyTurn {
  const parser = new HarmonyParser(offered);
  const events = [...parser.push(text), ...parser.end()];
  let reasoning = '';
  let content = '';
  const calls: HarmonyTurn['calls'] = [];
  for (const e of events) {
    if (e.type === 'reasoning') reasoning += e.text;
    else if (e.type === 'content') content += e.text;
    else calls.push({ name: e.name, arguments: e.arguments });
  }
  return {
    reasoning: parser.sawReasoning ? reasoning : undefined, content, calls,
    reasoningOpen: parser.reasoningOpen, endedKinds: parser.endedKinds, tailKind: parser.tailKind,
  };
}

/**
 * Generated tokens spent on reasoning: the tokens of the messages that went to reasoning. The
 * output's tokens split at each <|end|> (`endId`) as its text does, so the k-th run of tokens
 * is the k-th message that <|end|> closed, and the run after the last one is the tail message.
 */
export function harmonyReasoningTokens(turn: Pick<HarmonyTurn, 'endedKinds' | 'tailKind'>, tokenIds: readonly number[], endId: number | undefined): number {
  if (endId === undefined) return turn.endedKinds.length === 0 && turn.tailKind === 'reasoning' ? tokenIds.length : 0;
  let count = 0;
  let run = 0;
  let k = 0;
  for (const id of tokenIds) {
    run++;
    if (id !== endId) continue;
    if (turn.endedKinds[k] === 'reasoning') count += run;
    k++;
    run = 0;
  }
  if (run > 0 && (k < turn.endedKinds.length ? turn.endedKinds[k] : turn.tailKind) === 'reasoning') count += run;
  return count;
}
