// Helpers the surface adapters share: ids, image URL checks, metadata and sampling fields.

import { randomBytes } from 'node:crypto';
import type { TokenLogprob } from '../engine/request.js';
import type { RequestImage } from '../serving/generation-request.js';
import type { ChatContentPart, ChatMessage } from '../text/chat-template.js';
import { invalidRequest } from './errors.js';

/** `resp_` + 32 hex digits, etc. Random, so ids reveal nothing about volume or order. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

export const nowSeconds = (): number => Math.floor(Date.now() / 1000);

// The header only: the payload (up to 20 MiB) is checked off the event loop when the image is loaded
// (vision/image-source.ts), not by a regular expression here.
const DATA_URI = /^data:([a-z0-9.+-]+\/[a-z0-9.+-]+);base64,/i;

/** An image reference must be a public http(s) URL or a base64 data URI; anything else is a 400. */
export function checkImageUrl(url: unknown, param: string): void {
  if (typeof url !== 'string' || url === '') throw invalidRequest(`${param} is required: an http(s) URL or a base64 data URI`, param);
  if (url.startsWith('data:')) {
    if (!DATA_URI.test(url)) throw invalidRequest(`${param} must be a data URI of the form data:<media-type>;base64,<data>`, param);
    return;
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw invalidRequest(`${param} must be an http(s) URL or a base64 data URI`, param);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw invalidRequest(`${param} must be an http(s) URL or a base64 data URI (got a ${parsed.protocol} URL)`, param);
  }
}

/** The metadata key that picks the completion window. */
export function completionWindowOf(metadata: Record<string, string> | null | undefined): string | undefined {
  return metadata?.['completion_window'];
}

/**
 * The completion window of a request that can name it twice: the spec's metadata.completion_window
 * and a surface's service_tier, which the surface has mapped to a window (`tierWindow`; undefined:
 * the tier states no preference). Both given must agree (400 naming service_tier). `param` is the
 * field that chose the window, for the errors prepare() raises about it.
 */
export function requestedWindow(metadata: Record<string, string> | null | undefined, tier: string | null | undefined,
  tierWindow: string | undefined): { window?: string; param?: string } {
  const fromMetadata = completionWindowOf(metadata);
  if (tierWindow === undefined) return fromMetadata === undefined ? {} : { window: fromMetadata };
  if (fromMetadata !== undefined && fromMetadata !== tierWindow) {
    throw invalidRequest(`service_tier "${tier}" runs in the ${tierWindow} completion window, but metadata.completion_window is ` +
      `"${fromMetadata}": send only one of them`, 'service_tier');
  }
  return fromMetadata === undefined ? { window: tierWindow, param: 'service_tier' } : { window: tierWindow };
}

/** One generated token's logprob as OpenAI's APIs render it (Chat Completions' logprobs.content, Responses' output_text.logprobs). */
export interface OpenAiTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[] | null;
  top_logprobs: { token: string; logprob: number; bytes: number[] | null }[];
}

/** OpenAI reports impossible tokens as -9999 rather than -Infinity (which JSON cannot carry). */
const finiteLogprob = (logprob: number): number => (Number.isFinite(logprob) ? logprob : -9999);
const utf8Bytes = (token: string): number[] => [...Buffer.from(token, 'utf8')];

export function openAiLogprobs(logprobs: readonly TokenLogprob[]): OpenAiTokenLogprob[] {
  return logprobs.map((lp) => ({
    token: lp.token,
    logprob: finiteLogprob(lp.logprob),
    bytes: utf8Bytes(lp.token),
    top_logprobs: lp.top.map((t) => ({ token: t.token, logprob: finiteLogprob(t.logprob), bytes: utf8Bytes(t.token) })),
  }));
}

/**
 * Why stream=true is refused, in the same words on every surface (Responses, Chat Completions,
 * Messages, and their batch lines).
 */
export const STREAMING_UNAVAILABLE = 'streaming is not available: every response is one complete JSON object; send stream=false or leave stream out';

/** stream=true (no surface streams): its own clear 400 rather than a schema mismatch. Runs on the raw body. */
export function refuseStreaming(body: unknown): void {
  if ((body as { stream?: unknown } | null)?.stream === true) {
    throw invalidRequest(STREAMING_UNAVAILABLE, 'stream', 'unsupported_parameter');
  }
}

/**
 * Runs on the raw body, before schema validation, so that input kinds the service refuses (audio,
 * files, item references, tool blocks) get a 400 saying why instead of a schema mismatch.
 * `refused` maps a `type` to the reason. Checks each item's content parts, and with
 * `checkItems` the items' own `type` too (Responses input items).
 */
export function refuseListedTypes(items: unknown, base: string, refused: Readonly<Record<string, string>>,
  checkItems = false): void {
  if (!Array.isArray(items)) return;
  const check = (value: unknown, param: string) => {
    const type = (value as { type?: unknown } | null)?.type;
    if (typeof type === 'string' && Object.hasOwn(refused, type)) {
      throw invalidRequest(`${param} is of type ${type}: ${refused[type]}`, `${param}.type`, 'unsupported_input');
    }
  };
  items.forEach((item, i) => {
    if (checkItems) check(item, `${base}[${i}]`);
    const content = (item as { content?: unknown } | null)?.content;
    if (Array.isArray(content)) content.forEach((part, j) => check(part, `${base}[${i}].content[${j}]`));
  });
}

/**
 * One message's parts as a surface reads them: text in order, and images, each recorded in the
 * request's `images` (prompt order) and marked at its place. Without images the content is the
 * texts joined with '\n' (as every surface renders text parts); with images, the parts themselves
 * (vision templates render each image's placeholder where it stands).
 */
export class MessageParts {
  private readonly parts: ChatContentPart[] = [];
  private images = 0;

  constructor(private readonly requestImages: RequestImage[]) {}

  text(text: string): void {
    this.parts.push({ type: 'text', text });
  }

  /** `url`: an http(s) URL or a data URI, checked (checkImageUrl) by the caller. */
  image(url: string, detail: RequestImage['detail'] | undefined, param: string): void {
    this.requestImages.push({ url, detail: detail ?? 'auto', param });
    this.parts.push({ type: 'image' });
    this.images++;
  }

  content(): ChatMessage['content'] {
    return this.images > 0 ? this.parts : this.parts.map((p) => (p as { text: string }).text).join('\n');
  }
}
